"""The front door: `python launch.py [-m] key=value ...` (Hydra). See README.md.

`main` is an ordinary Hydra task. `@batched(train_batch)` declares that it is `train(cfg)`, so that the rw
launchers train many jobs of one shape at once through its batched twin (the launcher's first line says
`packed: …`). If you make `main` do more, remove the declaration: every job then runs through Hydra's own
`run_job`, one at a time, with your edit (`not packed: …`).
"""
from __future__ import annotations

import sys
from typing import Any

from rw_sweeps.core import signals

signals.early()  # a stop during the imports below is one line too (they take a second or two)

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from rw_sweeps.sweeps.app import batched, run_front_door, train, train_batch  # noqa: E402


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
@batched(train_batch)
def main(cfg: DictConfig) -> Any:
    return train(cfg)


if __name__ == "__main__":
    run_front_door(main, sys.argv[1:], __file__, "conf")
