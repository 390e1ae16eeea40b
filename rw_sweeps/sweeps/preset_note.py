"""`PresetNote`: the Hydra callback an experiment preset declares to say, as its launch starts, what its runs show
against the paper where they do not reproduce it (`conf/experiment/fig6.yaml`, under `hydra.callbacks.preset_note`).

Hydra's public callback API only; no per-job hook, so the packed launcher builds no per-run config for it.
"""
from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rw_sweeps.core.console import shown


class PresetNote(Callback):
    def __init__(self, text: str) -> None:
        self.text = text

    def line(self, config: DictConfig) -> str:
        """The launch's line: `experiment=<preset>: <text>`."""
        return shown(f"experiment={config.get('experiment')}: {self.text}")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        print(self.line(config), flush=True)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        print(self.line(config), flush=True)
