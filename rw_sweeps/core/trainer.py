"""Which training loop trains a run: the one its model option declares (`ModelBase.TRAINER`).

A trainer is a module with `train(cfgs, run_dirs, progress, resumed, live) → [Record]`, `summary(record, wall) →
dict`, `prefetch(cfgs)` (draw the next chunk's data while this one trains), `batch_bytes(cfg)` (one run's
peak memory inside a batch: the packing rule's) and `run_bytes(cfg) → (bytes, key)` (one run's peak memory,
and the key that drives it): `rw_sweeps.core.loop.Trainer`. `rw_sweeps.core.training` trains eq. 2.1 and its
FFN variant with the exact engine; `rw_sweeps.core.gpt.training` trains model=gpt by autograd.
"""
from __future__ import annotations

import importlib
from types import ModuleType


def of(cfg) -> ModuleType:
    """The trainer of a run's model option."""
    return importlib.import_module(type(cfg.model).TRAINER)
