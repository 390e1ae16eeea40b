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
from .load import config_keys, load_history, load_runs, load_snapshots
from .phase import add_success, add_success_step, phase_diagram, phase_table, swept_keys

__all__ = ["load_runs", "load_history", "load_snapshots", "config_keys", "add_success",
           "add_success_step", "phase_table", "phase_diagram", "swept_keys"]
