"""Sweep analysis for rw-sweeps: result folders -> tables, phase diagrams, the paper's figures.

Reads only the files of the results contract (README, "Results"); never imports the training code.

    load.py     sweep/run folders -> one row per run (Parquet-cached); histories, snapshots
    phase.py    success, normalised accuracy, phase-diagram heatmaps with the theory drawn on
    figures.py  Figs. 2, 4-13 of Shi & Cao (2025)
    claims.py   the reading search: each reading scored against the paper's random-init claims
    escape.py   the escape map, with rw_sweeps.core.theory's predicted break step drawn on
    locking.py  the wrong-position locking rate
    report.py   index.html (and optionally a wandb run of job_type "analysis")
    __main__.py python -m analysis SWEEP_DIR... --out OUT_DIR
"""
import importlib

__all__ = ["load_runs", "load_history", "load_snapshots", "config_keys", "add_success",
           "add_success_step", "phase_table", "phase_diagram", "swept_keys"]
_HOME = {"load_runs": "load", "load_history": "load", "load_snapshots": "load", "config_keys": "load",
         "add_success": "phase", "add_success_step": "phase", "phase_table": "phase", "phase_diagram": "phase",
         "swept_keys": "phase"}


def __getattr__(name: str):
    """The package's functions, imported when first asked for: `analysis.callback`, which every launch
    loads as a Hydra callback, does not pay for pandas and matplotlib until a sweep ends."""
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
