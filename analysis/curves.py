"""The learning curves of every swept cell: test accuracy over training, the mean over the cell's runs and
their min–max band, against OPT (dashed) and chance 1/K (dotted). One panel per cell (the swept keys but the
seed), the report's default figure beside the phase diagrams."""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .load import has_key, load_history
from .phase import LABELS, axis_label, axis_values, distinct_runs, pooled_keys, swept_keys

MAX_CELLS = 36      # panels drawn; a larger grid's first cells, and the report says so
PANEL_CHARS = 40    # a panel title's line: its axes (~2.8 of the panel's 3.4 in) at 8 pt, ~0.6 em a character
MAX_RUNS = 64       # runs read per cell (the first, in folder order); a panel with more says "k of n"


def cells(runs: pd.DataFrame) -> tuple[list[str], list[tuple]]:
    """The swept keys (but the seed) and their value combinations as the axes show them (σ of zero init is
    "zero"), in the table's order."""
    keys = [k for k in swept_keys(runs) if k != "seed"]
    if not keys:
        return [], [()]
    shown = pd.DataFrame({k: axis_values(runs, k) for k in keys})
    return keys, list(dict.fromkeys(shown.itertuples(index=False, name=None)))


def curve_figures(runs: pd.DataFrame, notes: list[str], metric: str = "test_acc") -> list[tuple]:
    """(name, caption, draw) for the learning curves, or none when no run has a history of `metric`."""
    runs = distinct_runs(runs)   # a run loaded twice (two copies of a sweep) is one curve of its panel
    done = runs[runs["status"] == "done"] if "status" in runs else runs
    if not len(done):
        return []
    keys, combos = cells(done)
    if len(combos) > MAX_CELLS:
        notes.append(f"learning curves: the first {MAX_CELLS} of {len(combos)} cells drawn")
        combos = combos[:MAX_CELLS]
    sizes = [len(_cell(done, keys, c)) for c in combos]
    on = ", ".join(keys) if keys else "the one setting"
    pooled = pooled_keys(done, keys)
    over = (f"pooling {', '.join(pooled)}" if pooled else "nothing pooled") + (
        f"; at most the first {MAX_RUNS} runs of a cell (in folder order) are read, and a panel with more "
        f"says how many of them" if max(sizes) > MAX_RUNS else "; every run of the cell")
    left = _left_out(runs)
    over = over.replace("every run", "every finished run") + left if left else over
    caption = (f"{metric} over training, one panel per cell of {on} ({over}): the mean over the panel's "
               f"runs (line) and their min–max band, against OPT (dashed) and chance 1/K (dotted)")
    return [(f"curves_{metric}", caption, lambda: draw_curves(done, keys, combos, metric))]


def _left_out(runs: pd.DataFrame) -> str:
    """The caption's clause on the runs that did not finish (diverged, failed, …): they have no curve, and a
    key only they sweep has no panel."""
    if "status" not in runs:
        return ""
    left = runs.loc[runs["status"] != "done", "status"].value_counts()
    if not len(left):
        return ""
    return "; not drawn: " + ", ".join(f"{n} {status} run{'s' * (n != 1)}" for status, n in left.items())


def _cell(runs: pd.DataFrame, keys: list[str], combo: tuple) -> pd.DataFrame:
    """The runs of one cell: those whose values, as the axes show them, are `combo`."""
    mask = pd.Series(True, index=runs.index)
    for k, v in zip(keys, combo):
        mask &= axis_values(runs, k) == v
    return runs[mask.to_numpy()]


def _title(cell: pd.DataFrame, keys: list[str], combo: tuple, mixed: bool) -> str:
    """A panel's values of the swept keys, but those its runs' option lacks (`data.p` of a bayes_net run, no
    value of it); led by the data family where the runs are of several (what tells such a panel apart)."""
    shown = [f"{LABELS.get(k, k)}={axis_label(k, v)}" for k, v in zip(keys, combo)
             if v != "none" or has_key(cell, k).any()]
    if mixed and "data.name" not in keys:
        shown.insert(0, str(cell["data.name"].iloc[0]))
    return ", ".join(shown)


def draw_curves(runs: pd.DataFrame, keys: list[str], combos: list[tuple], metric: str = "test_acc"):
    n = len(combos)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.5 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[n:]:
        ax.axis("off")
    cells = [_cell(runs, keys, combo) for combo in combos]
    mixed = "data.name" in runs and runs["data.name"].nunique() > 1
    # every panel's histories in one read: a stored sweep's body is read once, not once per panel
    read = pd.concat([c.head(MAX_RUNS) for c in cells])
    every = load_history(read)
    by_run = dict(tuple(every.groupby("path", sort=False))) if len(every) else {}
    for ax, combo, cell in zip(axes.flat, combos, cells):
        sub = cell.head(MAX_RUNS)
        parts = [by_run[p] for p in sub["path"] if p in by_run]
        hist = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        title = _title(cell, keys, combo, mixed)
        n = f"{len(sub)} of {len(cell)} runs" if len(sub) < len(cell) else f"{len(sub)} run{'s' * (len(sub) != 1)}"
        # in lines as wide as the panel (3.4 in at 8 pt: ~50 characters), so four swept keys never run into
        # the next panel's title
        ax.set_title(textwrap.fill(f"{title} ({n})" if title else n, width=PANEL_CHARS, break_on_hyphens=False),
                     fontsize=8)
        if len(hist) and metric in hist and hist[metric].notna().any():
            g = hist.groupby("step")[metric]
            mean, lo, hi = g.mean(), g.min(), g.max()
            ax.plot(mean.index, mean, lw=1.4)
            ax.fill_between(mean.index, lo, hi, alpha=0.25)
        else:
            ax.text(0.5, 0.5, f"no {metric} in histories", ha="center", va="center", transform=ax.transAxes)
        opt = pd.to_numeric(sub.get("opt_acc"), errors="coerce").mean() if "opt_acc" in sub else np.nan
        if opt == opt:
            ax.axhline(opt, color="k", ls="--", lw=1)
        K = pd.to_numeric(sub.get("data.K"), errors="coerce").mean() if "data.K" in sub else np.nan
        if K == K and K > 0:
            ax.axhline(1 / K, color="grey", ls=":", lw=1)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel(metric)
    fig.set_layout_engine("constrained")
    return fig
