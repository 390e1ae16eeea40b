"""The front door: `python launch.py [-m] key=value ...` (Hydra). See README.md.

`main` is an ordinary Hydra task. `@batched(train_batch)` lets the rw launchers train many jobs of one
shape at once through its twin; they do so only while `main` is exactly `return train(cfg)`: edit or wrap
it and every job runs through Hydra's own `run_job`, one at a time, with your edit.
"""
from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from rw_sweeps.app import batched, run_front_door, train, train_batch


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
@batched(train_batch)
def main(cfg: DictConfig) -> Any:
    return train(cfg)


if __name__ == "__main__":
    run_front_door(main, sys.argv[1:], __file__, "conf")
