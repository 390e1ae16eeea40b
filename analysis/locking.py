"""Wrong-position locking (beyond the paper): from zero init at §5 a few seeds lock the
attention onto a position other than the parent x_{N−1}.

A run is locked when summary.json's `locked_position` is not null: its final mean attention puts
more than half its mass on one position j ≠ N−1 and less than half on the parent (training.py,
`locked_position`). The locking rate of a cell is the fraction of its finished runs that locked,
drawn for `experiment=locking` over data.n_train × data.N, one panel per model.M.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from .phase import axis_label, phase_diagram

LOCKING = "locking"
AXES = ("data.n_train", "data.N", "model.M")   # x, y, col


def add_locked(runs: pd.DataFrame) -> pd.DataFrame:
    """`locked`: 1.0 if the run locked onto a wrong position, 0.0 if not, NaN if it did not
    finish (a diverged or failed run has no final attention)."""
    out = runs.copy()
    pos = out["locked_position"] if "locked_position" in out else pd.Series(np.nan, out.index)
    out["locked"] = np.where(out["status"] == "done", pos.notna().astype(float), np.nan)
    return out


def locking_figures(runs: pd.DataFrame, notes: list[str]):
    """Yield (name, caption, draw) for the locking diagram of the locking runs in `runs`."""
    runs = runs[runs["experiment"] == LOCKING] if "experiment" in runs.columns else runs.iloc[:0]
    if not len(runs):
        return
    if "locked_position" not in runs.columns:
        notes.append("locking: these runs predate summary.json's locked_position; no locking "
                     "diagram (rerun them)")
        return
    runs = add_locked(runs)
    axes = [k for k in AXES if k in runs.columns and runs[k].nunique() > 1]
    x, y, col = (axes + [None] * 3)[:3]
    x = x or "data.n_train"
    by = runs.groupby("data.n_train")["locked"].agg(["mean", "count"])
    pooled = ", ".join(f"{axis_label('data.n_train', n)}: {r['mean']:.3f} ({r['count']:.0f} runs)"
                       for n, r in by.iterrows())
    positions = runs["locked_position"].dropna().astype(int).value_counts().head(5)
    where = ", ".join(f"x_{j} ({c})" for j, c in positions.items()) or "none"
    yield ("locking_rate", "Wrong-position locking from zero init: the fraction of seeds whose "
           "final mean attention holds > 0.5 on a position other than the parent x_{N−1} "
           f"(summary.json locked_position), over {' × '.join(k for k in (x, y) if k)}"
           f"{f', by {col}' if col else ''}. Pooled by n_train: {pooled}. Most locked-on "
           f"positions (runs): {where}.",
           partial(_diagram, runs, x, y, col))


def _diagram(runs, x, y, col):
    fig = phase_diagram(runs, x, y, "locked", col=col)
    return fig
