"""`WandbAnalysis`: the Hydra callback that logs a finished sweep's analysis run (`analysis.wandb_run`).

`conf/config.yaml` ships it under `hydra.callbacks.wandb_analysis`; `wandb.analysis=false` (or
`wandb.mode=disabled`) turns it off for one launch, `~hydra.callbacks.wandb_analysis` removes it. It uses
only Hydra's public callback API: `on_multirun_start` warms its imports on a thread while the jobs train,
`on_multirun_end` reads the run folders and logs the run, with one line when it starts (and how to skip it)
and one with what it cost. It defines no per-job hook, so the packed launcher builds no per-run DictConfig
for it. A detached or dry-run sweep has nothing to analyse yet.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rw_sweeps.core.config import wandb_group
from rw_sweeps.core.console import shown

from . import wandb_run


class WandbAnalysis(Callback):
    def __init__(self) -> None:
        self._warming: threading.Thread | None = None

    def __getstate__(self) -> dict:
        """Hydra's context travels to submitit and SLURM jobs pickled, callbacks and all: not the warm-up thread."""
        return {k: v for k, v in self.__dict__.items() if k != "_warming"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._warming = None

    @staticmethod
    def _settings(config: DictConfig) -> dict | None:
        """The sweep's wandb settings when it has an analysis run to log, else None."""
        launcher = config.hydra.get("launcher") or {}
        if launcher.get("detach", False) or launcher.get("dry_run", False):
            return None
        w = OmegaConf.to_container(config.wandb, resolve=True) if "wandb" in config else None
        if not isinstance(w, dict) or w.get("mode", "offline") == "disabled" or not w.get("analysis", True):
            return None
        w["group"] = w.get("group") or wandb_group(str(config.hydra.sweep.dir))
        return w

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self._settings(config) is not None:
            self._warming = threading.Thread(target=wandb_run.warm, name="rw-analysis-warm", daemon=True)
            self._warming.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        w = self._settings(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if w is None or not sweep_dir.is_dir():
            return
        if self._warming is not None:
            self._warming.join()
        print(f"wandb analysis run: the runs table and phase diagram of {shown(sweep_dir)} "
              f"(wandb.analysis=false skips it)", flush=True)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            runs, figures = wandb_run.log_analysis(sweep_dir, w)
        except Exception as exc:  # noqa: BLE001 - the run folders are the source of truth
            print(f"warning: wandb analysis run not logged: {type(exc).__name__}: {shown(exc)}", file=sys.stderr)
            return
        print(f"wandb analysis run: {runs} run{'s' * (runs != 1)}, {figures} figure{'s' * (figures != 1)} "
              f"in {time.perf_counter() - wall:.1f} s ({time.process_time() - cpu:.1f} CPU s), "
              f"{shown(sweep_dir / 'wandb_analysis')}", flush=True)
