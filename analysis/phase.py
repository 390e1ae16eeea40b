"""Phase diagrams: where training succeeds, over any two swept keys, faceted by two more.

Success: status "done" and test accuracy within `tol` of OPT = max(p, 1-p), paper §5.
It is `acc >= OPT - tol`, not |acc - OPT| <= tol: a finite test set can score above OPT.
The theory drawn on the diagrams: OPT along the p axis, and an outline on the cells where
Theorem 4.1 predicts failure (zero init, p in {0, 1}, N = rK + 1: accuracy 1/K).
"""
from __future__ import annotations

import difflib
import itertools
import math
import numbers
import textwrap
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm, Normalize
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import ScaledTranslation

from rw_sweeps.core import contract, readers, results
from rw_sweeps.core.metrics import SUCCESS_TOL

from .heatmap import heatmap
from .load import config_keys, has_key, stored_rows

TOL = SUCCESS_TOL  # the one success rule's tolerance (rw_sweeps.core.metrics)
ZERO = "zero"                           # the zero-init column beside the σ axis
LOG_KEYS = {"init.sigma", "optim.lr"}   # swept geometrically: labelled in powers of ten
UNIT_METRICS = {"success", "acc_norm", "test_acc", "parent_attention", "v_pi_cosine", "locked"}
STEP_METRICS = {"symmetry_break_step", "success_step"}
LOWER_IS_BETTER = {"locked"}            # red where high
# the axes a reader expects first; other swept keys follow by name
PREFERRED = ["data.p", "data.q", "data.stay", "data.graph", "data.order", "init.sigma", "optim.lr", "data.name",
             "data.K", "data.N", "model.M",
             "init", "model.name", "optim.eps", "optim.steps", "data.n_train"]
LABELS = {"data.p": "p", "data.q": "q", "data.stay": "stay", "init.sigma": "σ", "optim.lr": "lr (η)", "optim.eps": "ε",
          "data.K": "K", "data.N": "N", "model.M": "M", "data.n_train": "n_train"}


def tol_problem(tol) -> str | None:
    """What is wrong with a success tolerance, or None: the one rule for `add_success`'s `tol` and the CLI's
    `--tol`. Accuracies are in [0, 1]: at tol >= 1 every run, at chance or not, succeeds."""
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0 <= tol < 1:
        return "must be in [0, 1) (success is test_acc >= OPT - tol; e.g. 0.02)"
    return None


def chance(df: pd.DataFrame) -> pd.Series:
    """Chance accuracy 1/K of each run (the dotted line the figures draw); NaN where K is unknown."""
    return 1 / pd.to_numeric(_col(df, "data.K", "K"), errors="coerce").astype(float)


def success_undefined(df: pd.DataFrame, tol: float = TOL) -> pd.Series:
    """The runs whose success cannot be told from chance: OPT − 1/K ≤ tol, so a run at chance 1/K is already
    within tol of OPT (the complete graph K₁₆: OPT 1/15, 1/K 1/16). Their `success` is <NA>, not True."""
    opt = pd.to_numeric(_col(df, "opt_acc", "opt_acc"), errors="coerce").astype(float)
    return pd.Series(((opt - chance(df)) <= tol).to_numpy(dtype=bool), index=df.index)


def add_success(df: pd.DataFrame, tol: float = TOL) -> pd.DataFrame:
    """Add `success` (nullable boolean: <NA> where OPT − 1/K ≤ tol, `success_undefined`) and `acc_norm` =
    (acc − 1/K)/(OPT − 1/K): 0 = chance, 1 = OPT."""
    problem = tol_problem(tol)
    if problem:
        raise ValueError(f"add_success: tol={tol!r}: {problem}")
    _need_columns(df, {"table column": c for c in ("status", "test_acc", "opt_acc")}, "add_success")
    out = df.copy()
    acc = pd.to_numeric(out["test_acc"], errors="coerce").astype(float)
    opt = pd.to_numeric(out["opt_acc"], errors="coerce").astype(float)
    won = pd.Series(((out["status"] == "done") & (acc >= opt - tol)).to_numpy(dtype=bool), index=out.index)
    out["success"] = won.astype("boolean").mask(success_undefined(out, tol))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["acc_norm"] = ((acc - chance(out)) / (opt - chance(out))).replace([np.inf, -np.inf], np.nan)
    out.attrs["success_tol"] = tol   # the rule a later `add_success_step` or diagram states
    return out


def add_success_step(df: pd.DataFrame, tol: float = TOL) -> pd.DataFrame:
    """Add `success_step`: the first evaluated step (history.jsonl) with test_acc ≥ OPT − tol,
    NaN for runs that never got there, did not finish, or whose success is undefined (`success_undefined`)."""
    problem = tol_problem(tol)
    if problem:
        raise ValueError(f"add_success_step: tol={tol!r}: {problem}")
    out = df.copy()
    ok = ((out["status"] == "done").to_numpy(dtype=bool) & out["opt_acc"].notna().to_numpy(dtype=bool)
          & ~success_undefined(out, tol).to_numpy())
    threshold = out["opt_acc"] - tol
    # a stored run's history is in its shard's body: read body by body (each once), never all held at once
    stored = {path: _first_step_in(hist, at) for (path, (hist, _)), at in _stored_histories(out[ok], threshold[ok])}
    steps = []
    for path, at, good in zip(out["path"], threshold, ok):
        if not good:
            steps.append(np.nan)
        elif path in stored:
            steps.append(stored[path])
        else:
            steps.append(_first_step_at(Path(path) / "history.jsonl", at))
    out["success_step"] = steps
    out.attrs["success_tol"] = tol
    return out


def undefined_note(df: pd.DataFrame) -> str:
    """One line on the runs whose success is undefined (`success` <NA>), for a report; "" where none is."""
    if "success" not in df.columns or not df["success"].isna().any():
        return ""
    n = int(df["success"].isna().sum())
    return (f"{n} run(s) where OPT is within tol {df.attrs.get('success_tol', TOL):g} of chance 1/K: success "
            "undefined (a run at chance would count), not drawn on the success and success-step diagrams")


def _stored_histories(runs: pd.DataFrame, threshold: pd.Series):
    """((path, rows), threshold) of each run of `runs` that a sweep's store holds (`load.stored_rows`)."""
    at = dict(zip(runs["path"], threshold))
    located = {"sweep", "run"} <= set(runs.columns)
    where = zip(runs["sweep"], runs["run"]) if located else [None] * len(runs)
    for path, rows in stored_rows(zip(runs["path"], where)):
        yield (path, rows), at[path]


def theory_fails(df: pd.DataFrame) -> pd.Series:
    """Theorem 4.1: zero init on a deterministic walk (p in {0,1}) with N = rK + 1 stays at the
    symmetric point, accuracy 1/K, for any loss, lr and number of steps. Generalised: zero
    init on a training set whose token histogram is the same for every sequence, the summary's `trap`
    flag; runs without one (folders from before the flag) fall back to the circle's formula."""
    p = pd.to_numeric(_col(df, "data.p", "p"), errors="coerce")
    K = pd.to_numeric(_col(df, "data.K", "K"), errors="coerce")
    N = pd.to_numeric(_col(df, "data.N", "N"), errors="coerce")
    walk = _col(df, "data.name", "data").fillna("random_walk") == "random_walk"
    formula = walk & p.isin([0.0, 1.0]) & ((N - 1) % K == 0)
    flag = _col(df, "trap", "trap")
    trap = flag.where(flag.notna(), formula).astype(bool)
    return zero_init(df) & trap


def zero_init(df: pd.DataFrame) -> pd.Series:
    """The runs that start at V = W = 0: init=zero, and the σ = 0 point of a Gaussian σ axis."""
    sigma = pd.to_numeric(_col(df, "init.sigma", "sigma"), errors="coerce")
    return (_col(df, "init", "init") == "zero") | (sigma == 0)


def swept_keys(df: pd.DataFrame, sigma_axis: bool = True) -> list[str]:
    """Config keys that vary between runs, most telling first, seed excluded (it is what the
    diagrams average over). A key varies only among the runs whose option has it: `optim.beta1` of
    `optim=gd,adam` is adam's one value, not a second axis beside the optimiser. A key fixed by the ones
    before it (`model.normalize` riding on `init`, `init` on the σ axis's zero column) adds no axis and is
    dropped. `sigma_axis`: zero init is the σ axis's zero point (the diagrams' view); False: σ is only the
    key of the inits that have it, so `init=zero,gaussian` sweeps the init (the config table's view)."""
    def own(k):
        rows = has_key(df, k)
        return rows | zero_init(df) if k == "init.sigma" and sigma_axis else rows

    varying = [k for k in config_keys(df) if k != "seed" and not k.startswith("wandb.")
               and axis_values(df, k)[own(k)].nunique(dropna=False) > 1]  # per row: the column, not df, masked
    varying.sort(key=lambda k: (PREFERRED.index(k) if k in PREFERRED else len(PREFERRED), k))
    values = {k: axis_values(df, k) for k in varying}
    chosen = []
    for k in varying:
        if not chosen or values[k].groupby([values[c] for c in chosen], sort=False).nunique().max() > 1:
            chosen.append(k)
    return chosen


def phase_table(df: pd.DataFrame, x: str, y: str | None = None, metric: str = "success",
                row: str | None = None, col: str | None = None, agg: str = "mean",
                theory: str | None = None) -> pd.DataFrame:
    """One line per cell: the facet/axis values, `value` (the `agg`, mean or median, of `metric`
    over the cell's runs that have one: for `success` the mean is the success rate over seeds),
    `n` runs, `n_valid` runs with a value, and `theory_fail` (every run in the cell is a Thm 4.1
    failure). With `theory` (a per-run column predicting `metric`: inf = predicted never, NaN = no
    prediction): `theory` its median over the runs predicted to get there, `n_theory` how many
    were, `n_predicted` how many runs have a prediction at all."""
    keys = [k for k in (row, col, y, x) if k]
    if len(set(keys)) < len(keys):
        raise ValueError(f"x, y, row and col must be different keys, got {keys}")
    if agg not in ("mean", "median"):
        raise ValueError(f"agg must be mean or median, got {agg!r}")
    if not len(df):
        raise ValueError("phase_diagram: the table has no runs (load_runs found none: see its "
                         "attrs['skipped'])")
    if metric in SUCCESS_METRICS and "success" not in df.columns:
        # `load_runs`'s table as it comes: the success rule at the tolerance of `add_success_step`, or the default
        df = add_success(df, df.attrs.get("success_tol", TOL))
    _need_columns(df, {**{a: k for a, k in zip(("row", "col", "y", "x"), (row, col, y, x)) if k},
                       "metric": metric, **({"theory": theory} if theory else {})}, "phase_diagram")
    g = pd.DataFrame({k: axis_values(df, k) for k in dict.fromkeys(keys)})
    g["_v"] = pd.to_numeric(df[metric], errors="coerce").astype(float)
    g["_fail"] = theory_fails(df).to_numpy()
    g["_undef"] = (df["success"].isna() if metric in SUCCESS_METRICS else pd.Series(False, index=df.index)).to_numpy()
    extra = {}
    if theory:
        t = pd.to_numeric(df[theory], errors="coerce").astype(float)
        g["_t"] = t.where(np.isfinite(t))
        g["_p"] = t
        extra = {"theory": ("_t", "median"), "n_theory": ("_t", "count"),
                 "n_predicted": ("_p", "count")}
    out = g.groupby(keys, dropna=False, sort=False).agg(
        value=("_v", agg), n=("_v", "size"), n_valid=("_v", "count"),
        theory_fail=("_fail", "all"), n_undefined=("_undef", "sum"), **extra).reset_index()
    return out


# the metrics the success rule defines: undefined (not drawn) where OPT is within tol of chance
SUCCESS_METRICS = ("success", "success_step")
# a column the analysis adds, and the call that adds it
ADDED_BY = {"success": "add_success", "acc_norm": "add_success", "success_step": "add_success_step"}


def _need_columns(df: pd.DataFrame, asked: dict, caller: str) -> None:
    """One line for an argument naming a column `df` lacks: the argument, the name, close names, and the call
    that adds a derived column (`success_step`: add_success_step)."""
    for arg, key in asked.items():
        if key in df.columns:
            continue
        if key in ADDED_BY:
            raise ValueError(f"{caller}: {arg} {key!r}: not in the table; call {ADDED_BY[key]}(runs) first")
        names = [str(c) for c in df.columns]
        close = [c for c in names if c.rsplit(".", 1)[-1] == key] or difflib.get_close_matches(str(key), names, 3, 0.6)
        swept = ", ".join(swept_keys(df)) if config_keys(df) else ""
        if arg == "metric":   # as the CLI's --metric says it
            close = close or ["success", "acc_norm", "test_acc", "test_kl", "parent_attention"]
        raise ValueError(f"{caller}: {arg} {key!r}: no such column"
                         + (f" (did you mean {' or '.join(close)}?)" if close and arg != "metric"
                            else f" (try {', '.join(close)})" if close else "")
                         + (f"; swept keys: {swept}" if swept else "; columns: " + ", ".join(names[:20])))


def phase_diagram(df: pd.DataFrame, x: str, y: str | None = None, metric: str = "success",
                  row: str | None = None, col: str | None = None, title: str | None = None,
                  agg: str = "mean", theory: str | None = None, ax=None):
    """Heatmaps (seaborn's, `analysis.heatmap`) of `metric` over (x, y), one panel per (row, col) value, or into `ax` (one
    panel: no row or col). `agg`: how a cell's runs are summed up (mean or median). `theory`: a
    per-run column predicting `metric`, printed beside the measured value in every cell ("measured /
    predicted"; cells no run of which is predicted to get there are outlined). Step metrics are coloured
    on a log scale when they span decades. The title counts the distinct runs per cell (a run loaded twice
    counts once) and names the swept keys the cells pool over.

    Returns the figure, or with `ax=` the Axes it drew into (as seaborn's axes-level functions do, so a
    notebook cell ending with the call shows the figure once); its table (`phase_table`, one line per cell)
    is `.phase_table` of either, and of the figure. `success` and `acc_norm` are added (`add_success`, the
    default tolerance) where `df` lacks them."""
    into = ax   # the caller's axes: the diagram, its colour bar and its legend stay inside its slot
    if into is not None and (row or col):
        raise ValueError("ax= draws one panel: leave row and col out (or pass no ax)")
    df = distinct_runs(df)
    table = phase_table(df, x, y, metric, row, col, agg, theory)
    # OPT = max(p, 1 − p) is the circle's; other families (binary chain, lazy walk, …) have their own
    circle = bool((_col(df, "data.name", "data").fillna("random_walk") == "random_walk").all())
    xs = _order(table[x])
    ys = _order(table[y])[::-1] if y else [None]   # larger values on top, zero init at the bottom
    rows = _order(table[row]) if row else [None]
    cols = _order(table[col]) if col else [None]
    unit = metric in UNIT_METRICS
    vmin, vmax = (0.0, 1.0) if unit else (table["value"].min(), table["value"].max())
    if not np.isfinite([vmin, vmax]).all() or vmin == vmax:
        vmin, vmax = (vmin - 1, vmax + 1) if np.isfinite(vmin) else (0.0, 1.0)
    cmap = ("RdYlGn_r" if metric in LOWER_IS_BETTER else "RdYlGn") if unit else "viridis"
    norm = Normalize(vmin, vmax)
    if metric in STEP_METRICS and np.isfinite(vmax):
        # a step means something against the run's horizon: the scale runs from step 0 to the last step
        # trained, so cells that all broke at step ~10 of 50 read as early, not as the scale's two ends
        horizon = pd.to_numeric(_col(df, "optim.steps", "steps"), errors="coerce").max()
        top = max(vmax, horizon) if horizon == horizon else vmax
        norm = (LogNorm(1, max(top, 10), clip=True) if vmax >= 20 * max(vmin, 1)   # steps 1…1000: decades apart
                else Normalize(0, max(top, 1)))
    cell_w, cell_h = max(0.75, 0.22 * max(len(axis_label(x, v)) for v in xs)), 0.55
    if into is not None:
        fig, axes = into.figure, np.array([[into]])
    else:
        fig, axes = plt.subplots(
            len(rows), len(cols), squeeze=False,
            figsize=(len(cols) * (cell_w * len(xs) + 1.8) + 1.5, len(rows) * (cell_h * len(ys) + 1.9)))
    y_names = [axis_label(y, v) for v in ys] if y else [_only_row_label(df)]
    for (i, rv), (j, cv) in itertools.product(enumerate(rows), enumerate(cols)):
        sub = table
        if row:
            sub = sub[_match(sub[row], rv)]
        if col:
            sub = sub[_match(sub[col], cv)]
        ax = axes[i, j]
        facet = ", ".join(f"{LABELS.get(k, k)} = {axis_label(k, v)}"
                          for k, v in ((row, rv), (col, cv)) if k)
        if not len(sub):   # a facet no run reached (sweeps of other shapes loaded together): said, not drawn
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{facet}:\nno runs", ha="center", va="center", fontsize=9, color="0.4",
                    transform=ax.transAxes)
            continue
        _facet(ax, sub, x, y, xs, ys, y_names, metric, cmap, norm, theory)
        ax.set_title(facet, fontsize=10)
    if into is None:
        fig.set_layout_engine("constrained")
    # with ax=, the colour bar's own axes are carved out of the caller's (it shrinks to make room), never
    # laid over a neighbour
    slot = into.get_position() if into is not None else None
    bar = fig.colorbar(plt.cm.ScalarMappable(norm, cmap), ax=into if into is not None else axes,
                       label=metric + (", log scale" if isinstance(norm, LogNorm) else "")
                       + (f" (of {norm.vmax:g} steps)" if metric in STEP_METRICS and not isinstance(norm, LogNorm)
                          else ""),
                       shrink=0.9, aspect=30, **({"fraction": 0.08, "pad": 0.03} if into is not None else {}))
    if circle and x in ("data.p", "p") and all(isinstance(v, (int, float)) for v in xs):
        # after the colour bar took its room: a twin made before keeps the old slot
        for panel in (a for a in axes.flat if a.axison):
            _opt_axis(panel, xs)
    if into is not None and fig.get_layout_engine() is None:
        _keep_in_slot(into, bar.ax, slot)
    n = table["n"]
    per_cell = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    label = _metric_label(metric, agg) + ("; cell: measured / predicted" if theory else "")
    shown = [k for k in (x, y, row, col) if k]
    pooled = pooled_keys(df, shown)
    over = f", pooled over {', '.join(pooled)}" if pooled else ""
    riding = riding_keys(df, shown)
    over += f"; the cells also differ in {', '.join(riding)} (they change with the axes)" if riding else ""
    over += _undefined_clause(table, df.attrs.get("success_tol", TOL))
    # broken into lines as wide as the axes (the figure), so a long title (many pooled keys) is never cut
    # off; matplotlib's own wrap= is laid out against the figure at draw time, and an inline (tight) figure
    # keeps the height of the unwrapped line: blank above the panel
    size = 11 if into is None else 9
    width = (into.get_position().width if into is not None else 1.0) * fig.get_figwidth()
    (into.set_title if into is not None else fig.suptitle)(
        _wrapped(title or f"{label} ({per_cell} run{'' if per_cell == '1' else 's'} per cell{over})", width, size),
        fontsize=size)
    handles = []
    if table["theory_fail"].any():
        handles.append(Patch(fill=False, edgecolor="black", ls="--", lw=2,
                             label="trap (Thm 4.1): zero init on a constant token histogram fails"))
    if theory and _never(table).any():
        handles.append(Patch(fill=False, edgecolor=THEORY_NEVER, ls=":", lw=2,
                             label="theory: no run of the cell predicted to get there"))
    if handles and into is None:   # below the panels, in the margin the layout keeps for it
        fig.legend(handles=handles, loc="outside lower left", fontsize=8, frameon=False)
    elif handles:                  # below the caller's axes' x label, in its own slot
        into.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, 0),
                    bbox_transform=_below_xlabel(into), borderaxespad=0)
    fig.phase_table = table
    if into is not None:
        into.phase_table = table
        return into
    return fig


def _wrapped(text: str, inches: float, fontsize: float) -> str:
    """`text` in lines that fit `inches` at `fontsize` (a character of DejaVu Sans: ~0.6 em on average)."""
    return textwrap.fill(text, width=max(int(inches * 72 / (0.6 * fontsize)), 20), break_on_hyphens=False)


def _keep_in_slot(ax, bar_ax, slot) -> None:
    """In a figure without a layout engine, narrow `ax`'s column of the grid the colour bar was carved from
    until the bar's tick labels and label end where `ax`'s slot did: a neighbour panel to the right is never
    drawn over. They stay in their grid slots and in layout, so a later `fig.tight_layout()` places them, and
    makes room for the bar, as it does any subplot; the caller's other axes are not touched."""
    fig, grid = ax.figure, bar_ax.get_subplotspec().get_gridspec()
    for _ in range(8):   # the columns' gap scales with their mean width: a few passes settle it
        over = bar_ax.get_tightbbox().x1 / fig.bbox.width - slot.x1
        if over <= 0:
            return
        main, bar = grid.get_width_ratios()
        width = ax.get_position().width
        grid.set_width_ratios([max(main * (width - 1.5 * over) / width, 0.05 * main), bar])  # 1.5: past the gap's shrink
        for a in fig.axes:   # the diagram's axes (heatmap, OPT twin, colour bar) placed from their slots again
            spec = a.get_subplotspec()
            if spec is not None and spec.get_gridspec() is grid:
                a.set_position(spec.get_position(fig))
                a.set_in_layout(True)   # set_position took it out of layout: a later tight_layout places it


def _below_xlabel(ax):
    """A transform whose (0, 0) is the lower left of `ax` moved down past its x tick labels and x label as
    drawn: an offset in inches, so it holds wherever a layout engine later moves the axes."""
    box, axis = ax.get_window_extent(), ax.xaxis.get_tightbbox()
    drop = max(box.y0 - axis.y0, 0) if axis is not None else 0
    return ax.transAxes + ScaledTranslation(0, -(drop + 4) / ax.figure.dpi, ax.figure.dpi_scale_trans)


# What a run is, for counting: its config but what the core says is no result (where it was logged, how often
# it was saved, what its task returns), and the preset that named it
_NOT_RESULTS = (*results.NOT_RESULTS, "experiment")


def distinct_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The runs table with each run once: rows whose configs are equal (but for where they were logged and
    saved) are one run trained twice (two sweeps loaded together); the first is kept."""
    keys = [k for k in config_keys(df) if not k.startswith(_NOT_RESULTS)]
    if not keys or not len(df):
        return df
    # each value by its code in its column (a missing one is -1): a million runs compared as integers
    ident = pd.DataFrame({k: pd.factorize(df[k])[0] for k in keys}, index=df.index)
    return df[~ident.duplicated().to_numpy()]


def pooled_keys(df: pd.DataFrame, axes: list[str]) -> list[str]:
    """The swept keys a diagram on `axes` averages over within a cell: the seed, and any other that takes
    more than one value in some cell (not one that follows the axes, as σ follows `init`)."""
    cell = [axis_values(df, k) for k in axes if k in df.columns]
    out = [k for k in swept_keys(df) if k not in axes
           and (not cell or axis_values(df, k).groupby(cell, sort=False).nunique().max() > 1)]
    if "seed" in df.columns and df["seed"].nunique() > 1:
        out.append("seed")
    return out


def riding_keys(df: pd.DataFrame, axes: list[str]) -> list[str]:
    """The config keys that differ between a diagram's runs, not pooled within a cell and not an axis: they change
    with the axes (fig4's zero-init row trains at lr 1 for 50 steps, fig6's σ row at lr 0.01 for 1000), so a
    difference between cells may be theirs, not the axis's. What only names the run (its preset, where it was
    logged) is left out, and so is the init beside a σ axis (its zero column) and σ beside an init axis."""
    skip = {*axes, *pooled_keys(df, axes), "seed"}
    if "init.sigma" in axes:
        skip.add("init")
    if "init" in axes:
        skip.add("init.sigma")
    return [k for k in config_keys(df) if k not in skip and not k.startswith(_NOT_RESULTS)
            and axis_values(df, k)[has_key(df, k)].nunique(dropna=False) > 1]


def _undefined_clause(table: pd.DataFrame, tol: float) -> str:
    """The title's clause on the cells with runs whose success is undefined (OPT within tol of chance)."""
    cells = table[table["n_undefined"] > 0]
    if not len(cells):
        return ""
    n = len(cells)
    return (f"; {n} cell{'s' * (n != 1)} where OPT is within tol {tol:g} of chance 1/K "
            f"({int(cells['n_undefined'].sum())} runs): success undefined, not drawn")


THEORY_NEVER = "tab:blue"


def _never(cells):
    """Cells (a table or one cell) whose runs have predictions, none of them reaching the metric."""
    return (cells["n_theory"] == 0) & (cells["n_predicted"] > 0)


def _facet(ax, sub, x, y, xs, ys, y_names, metric, cmap, norm, theory=None):
    """One heatmap panel: cells in (ys × xs) order, values printed, theory drawn on."""
    grid = {(_key(yv), _key(xv)): r for yv, xv, r in zip(
        sub[y] if y else [None] * len(sub), sub[x], sub.to_dict("records"))}
    cells = [[grid.get((_key(yv), _key(xv))) for xv in xs] for yv in ys]
    values = np.array([[c["value"] if c else np.nan for c in line] for line in cells])
    texts = [[_annot(c, metric, theory) for c in line] for line in cells]
    with warnings.catch_warnings():       # a panel with no value at all (every cell "never")
        warnings.simplefilter("ignore", RuntimeWarning)
        heatmap(ax, values, index=y_names, columns=[axis_label(x, v) for v in xs], norm=norm, cmap=cmap,
                cbar=False, linewidths=0.5, linecolor="white", annot=np.array(texts), fmt="",
                annot_kws={"fontsize": 7 if theory else 8})
    for (yi, xi), c in np.ndenumerate(np.array(cells, dtype=object)):
        if c and c["n_valid"] == 0:       # runs, but no value (e.g. never broke): grey, say so
            ax.add_patch(Rectangle((xi, yi), 1, 1, color="0.88"))
            ax.text(xi + 0.5, yi + 0.5, texts[yi][xi], ha="center", va="center", fontsize=8,
                    color="0.3")
        if c and c["theory_fail"]:        # Thm 4.1 says these cells fail
            ax.add_patch(Rectangle((xi + 0.04, yi + 0.04), 0.92, 0.92, fill=False,
                                   edgecolor="black", lw=2, ls="--"))
        if c and theory and _never(c):   # the prediction: never (within the horizon)
            ax.add_patch(Rectangle((xi + 0.1, yi + 0.1), 0.8, 0.8, fill=False,
                                   edgecolor=THEORY_NEVER, lw=2, ls=":"))
    if ZERO in xs and len(xs) > 1:        # zero init stands apart from the log σ axis
        ax.axvline(1, color="black", lw=3)
    if ZERO in ys and len(ys) > 1:
        ax.axhline(len(ys) - 1, color="black", lw=3)
    ax.set_xlabel(_axis_label(x))
    ax.set_ylabel(_axis_label(y) if y else "")
    ax.tick_params(axis="y", rotation=0)
    if {x, y} == {"data.p", "data.q"}:
        _p_plus_q_line(ax, x, xs, ys)


def _p_plus_q_line(ax, x, xs, ys):
    """Makkuva et al.'s boundary p + q = 1 over a p × q heatmap (cell centres at index + 0.5; ys run
    from the top row down), drawn where both axes are numeric."""
    if not all(isinstance(v, (int, float)) for v in (*xs, *ys)) or len(xs) < 2 or len(ys) < 2:
        return
    xv, yv = np.array(xs, float), np.array(ys, float)
    order = np.argsort(yv)
    t = np.linspace(max(xv.min(), 1 - yv.max()), min(xv.max(), 1 - yv.min()), 50)
    if len(t) < 2 or t[0] >= t[-1]:
        return
    px = np.interp(t, xv, np.arange(len(xv))) + 0.5
    py = np.interp(1 - t, yv[order], np.arange(len(yv))[order]) + 0.5
    if x != "data.p":   # the x axis is q: swap which value each axis reads
        px, py = np.interp(1 - t, xv, np.arange(len(xv))) + 0.5, np.interp(t, yv[order], np.arange(len(yv))[order]) + 0.5
    ax.plot(px, py, color="black", lw=1.5, ls="-.", label="p + q = 1")


# ---------------------------------------------------------------------------------------------
# helpers

def axis_values(df: pd.DataFrame, key: str) -> pd.Series:
    """The value a run shows on an axis, a panel or a table: σ of a zero-init run (init=zero, or σ = 0) is
    ZERO, everywhere σ is shown; a missing value is its own category."""
    if key == "init.sigma":
        return df[key].astype(object).where(~zero_init(df), ZERO).where(df[key].notna() | zero_init(df), "none")
    return df[key].astype(object).where(df[key].notna(), "none")


def _only_row_label(df) -> str:
    """The one row of a diagram without a y axis: name the init all its runs share."""
    inits = df["init"].dropna().unique() if "init" in df.columns else []
    return f"{inits[0]} init" if len(inits) == 1 else "all runs"


def _col(df, name, fallback):
    if name in df.columns:
        return df[name]
    if fallback in df.columns:
        return df[fallback]
    return pd.Series(np.nan, index=df.index)


def _order(values) -> list:
    """Zero init first, then numbers ascending, then text."""
    def key(v):
        if isinstance(v, str):
            return (0, 0.0, "") if v == ZERO else (2, 0.0, v)
        return (1, float(v), "")
    return sorted({_key(v) for v in values}, key=key)


def _key(v):
    """numpy scalars -> Python, so that 0.5 and np.float64(0.5) meet in one cell."""
    return v.item() if isinstance(v, np.generic) else v


def _match(s: pd.Series, v) -> pd.Series:
    return s.map(_key) == v


def axis_label(key, v) -> str:
    """A value of a swept key as an axis or legend shows it: 1e-3 for a log key, 0.5 otherwise, blank for null."""
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if key == "init.sigma" and v == 0:   # the σ axis's 0 is zero init: one label for it
        return ZERO
    if key in LOG_KEYS and v > 0:
        mant, exp = f"{v:.1e}".split("e")
        return f"1e{int(exp)}" if mant == "1.0" else f"{float(mant):g}e{int(exp)}"
    return f"{v:g}"


def _annot(cell, metric, theory=None) -> str:
    if cell is None:
        return ""
    step = metric in STEP_METRICS
    if cell["n_valid"] == 0:
        text = "undefined" if cell["n_undefined"] == cell["n"] else "never" if step else "–"
    else:
        v = cell["value"]
        text = f"{v:.0f}" if step else f"{v:.2f}" if abs(v) < 100 else f"{v:.3g}"
    if theory and cell["n_predicted"]:
        text += " / " + (f"{cell['theory']:.0f}" if cell["n_theory"] else "never")
    if step and 0 < cell["n_valid"] < cell["n"]:
        text += f"\n{cell['n_valid']}/{cell['n']}"   # how many seeds got there at all
    return text


def _axis_label(key):
    if key is None:
        return ""
    label = f"{LABELS[key]}  ({key})" if key in LABELS else key
    return label + ", log scale" if key in LOG_KEYS else label


def _metric_label(metric, agg="mean"):
    return {"success": "success rate over seeds",
            "locked": "locking rate over seeds",
            "acc_norm": "normalised accuracy (acc − 1/K)/(OPT − 1/K)",
            "symmetry_break_step": f"symmetry-break step ({agg} over runs that broke; k/n: "
                                   "how many did)",
            "success_step": f"first step at success ({agg} over runs that got there; k/n: "
                            "how many did)",
            }.get(metric, f"{agg} {metric}")


def _opt_axis(ax, ps):
    """OPT = max(p, 1 − p) along the top of a p axis: the accuracy theory says is reachable."""
    top = ax.twiny()
    top.set_xlim(ax.get_xlim())
    top.set_xticks(np.arange(len(ps)) + 0.5)
    top.set_xticklabels([f"{max(p, 1 - p):.2g}" for p in ps], fontsize=7)
    top.set_xlabel("OPT = max(p, 1−p)", fontsize=7, labelpad=2)
    top.tick_params(length=2, pad=1)


def _first_step_at(history: Path, threshold: float) -> float:
    try:   # stop at the first hit: most runs succeed early
        return _first_step_in(contract.rows(history.parent, history.name), threshold)
    except (FileNotFoundError, readers.Broken):
        return math.nan


def _first_step_in(rows, threshold: float) -> float:
    """The step of the first history row with test_acc >= threshold; NaN if none."""
    for r in rows:
        acc = r.get("test_acc")
        if type(acc) in (int, float) and acc >= threshold:
            return float(r["step"])
    return math.nan