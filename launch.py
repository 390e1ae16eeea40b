"""The front door: `python launch.py [-m] key=value ...` (Hydra). See README.md."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rw_sweeps import config, run, sweep

CONF = Path(__file__).resolve().parent / "conf"


def sweep_group(hc) -> str:
    """wandb group = the sweep (or single run) folder, as the last two parts of its path."""
    root = hc.sweep.dir if hc.mode.name == "MULTIRUN" else hc.run.dir
    return "/".join(Path(str(root)).parts[-2:])


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    rc = config.from_dict(OmegaConf.to_container(cfg, resolve=True))
    if rc.wandb.group is None:
        rc.wandb.group = sweep_group(hc)
    summary = run.execute([rc], [Path(hc.runtime.output_dir)])[0]
    print(run.one_line(summary), flush=True)
    if hc.mode.name == "RUN" and summary["status"] == "failed":
        sys.exit(1)  # the line above said why; SystemExit skips Hydra's traceback printing
    return summary


if __name__ == "__main__":
    try:
        sweep.preflight(CONF, sys.argv[1:])
    except Exception as exc:  # noqa: BLE001 - one line, no traceback, before anything is written
        msg = str(exc).strip().splitlines()
        print(f"error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr)
        sys.exit(2)
    main()
