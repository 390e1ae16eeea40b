"""Phase diagrams of adaptive sweeps (`hydra/sweeper=adaptive`): runs at scattered points, not on a grid.

A sweep's `adaptive.json` (sealed by the sweeper with the user's key; a record that is not is ignored and the
sweep drawn as a grid) names its axes (key, bounds, log or not), the metric its learner learned, the level
whose set is the boundary and the success tolerance; the values are read from the run folders (the runs
table), each point's the mean over its seeds; every combination of the other crossed keys is a panel with
points of its own (its own learner's).

Two axes: the metric interpolated linearly on the learner's own triangulation (python-adaptive's Learner2D,
told the points; its Delaunay triangulation in the unit square it scales the axes to), the sampled points
shown, the level set drawn as the boundary; one panel per value of each crossed key other than the seed.
With the Gaussian init on a σ axis the escape theory is drawn too: the set where the symmetry break that
`rw_sweeps.core.theory` predicts comes at the run's last step (dashed). One axis: the metric against the
axis, the points, the level and where it is crossed. More axes: the first two, the points coloured by value.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt   # no backend chosen here: a notebook keeps its own (the CLI chooses Agg)
import numpy as np
import pandas as pd
from matplotlib.tri import Triangulation

from rw_sweeps.core import layout, readers, seal    # noqa: E402
from rw_sweeps.core.metrics import OBJECTIVES, SUCCESS, metric_value   # noqa: E402
from rw_sweeps.core.readers import Broken, MiB   # noqa: E402

from .phase import LABELS                  # noqa: E402

RECORD = "adaptive.json"
RECORD_CAP = 64 * MiB


def read_record(sweep) -> dict | None:
    """A sweep's adaptive.json, checked (axes with finite bounds lo < hi, > 0 on a log axis; a metric the
    sweeper learns; a finite level and tol; sealed by this user's sweeper; every run it names a folder inside the
    sweep), or None if it has none. Broken if it is malformed, unsealed or names a run outside the sweep: the
    sweep is then drawn as a grid, with the reason as a note."""
    path = Path(sweep) / RECORD
    try:
        rec = readers.read_json(path, RECORD_CAP, RECORD)
    except FileNotFoundError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("axes"), list) or not rec["axes"]:
        raise Broken(path, f"{RECORD} has no list of axes")
    for a in rec["axes"]:
        ok = (isinstance(a, dict) and isinstance(a.get("key"), str) and type(a.get("log")) is bool
              and all(type(a.get(k)) in (int, float) for k in ("lo", "hi")) and a["lo"] < a["hi"]
              and (a["lo"] > 0 or not a["log"]))
        if not ok:
            raise Broken(path, f"{RECORD}: an axis is not {{key, lo < hi, log}}: {str(a)[:80]}")
    if rec.get("metric") != SUCCESS and rec.get("metric") not in OBJECTIVES:
        raise Broken(path, f"{RECORD}: metric={str(rec.get('metric'))[:40]!r} is not one the sweeper learns")
    for k in ("level", "tol"):
        if type(rec.get(k)) not in (int, float):
            raise Broken(path, f"{RECORD}: {k} is not a number")
    crossed = rec.get("crossed", [])
    if not (isinstance(crossed, list) and all(isinstance(c, str) for c in crossed)):
        raise Broken(path, f"{RECORD}: crossed is not a list of keys")
    pts = rec.get("points", [])
    if not (isinstance(pts, list) and all(isinstance(p, dict) for p in pts)):
        raise Broken(path, f"{RECORD}: points is not a list of objects")
    if not seal.record_sealed(RECORD, rec):  # a stranger's record replaced a grid's phase diagrams
        raise Broken(path, f"{RECORD} is not sealed by you (planted, edited, another user's, or of a version "
                     "before seals: the sweep's command run again, which trains nothing, seals it): ignored")
    outside = next((r for p in pts for r in _names(p.get("runs")) if not _inside(Path(sweep), r)), None)
    if outside is not None:  # sealed, yet naming a run that is not the sweep's: not trusted
        raise Broken(path, f"{RECORD} names the run {str(outside)[:80]!r}, which is not a folder inside the sweep")
    return rec


def names_any(runs: pd.DataFrame, rec: dict) -> bool:
    """Does the record name any of `runs` (one sweep's loaded runs) at its point (what `points` draws)? One sealed
    by this user's sweeper in another sweep and copied here names none of this sweep's: not this sweep's."""
    try:
        return not points(runs, rec, []).empty
    except KeyError:  # an axis the runs have no column of: not these runs' record either
        return False


def _names(runs) -> list:
    return runs if isinstance(runs, list) else []


def _inside(sweep: Path, name) -> bool:
    """Is `name` a run folder inside the sweep (`rw_sweeps.core.layout`): a relative path without `..`, with no
    link on it (which would lead out of it) and nothing but a folder there, if anything is?"""
    return layout.valid_name(name) and layout.problem(sweep, name) is None


def run_values(runs: pd.DataFrame, metric: str, tol: float) -> pd.Series:
    """Each run's value of the metric, by the sweeper's own rule (`rw_sweeps.core.metrics.metric_value`)."""
    cols = [c for c in ("status", "test_acc", "opt_acc", "steps", metric) if c in runs.columns]
    out = []
    for row in runs[cols].itertuples(index=False):
        s = {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else
                 (v.item() if hasattr(v, "item") else v)) for k, v in zip(cols, row)}
        out.append(metric_value(s, metric, tol))
    return pd.Series([np.nan if v is None else v for v in out], index=runs.index, dtype=float)


def _coord(values, axis: dict) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return np.log10(v) if axis["log"] else v


def points(runs: pd.DataFrame, rec: dict, facet: list[str]) -> pd.DataFrame:
    """One row per (facet values, point): its axis values, the metric's mean over its runs and the run count."""
    keys = [a["key"] for a in rec["axes"]]
    missing = [k for k in keys if k not in runs.columns]
    if missing:
        raise KeyError(f"the runs have no column {missing[0]}")
    asked = {tuple(float(x) for x in p["at"]) for p in rec.get("points") or [] if isinstance(p, dict)
             and isinstance(p.get("at"), list) and len(p["at"]) == len(keys)
             and all(type(x) in (int, float) for x in p["at"])}
    if asked:  # the points the sweep asked for (a relaunch with other bounds leaves runs of other points)
        at = zip(*(pd.to_numeric(runs[k], errors="coerce").astype(float) for k in keys))
        runs = runs[[tuple(t) in asked for t in at]]
    named = [p.get("runs") for p in rec.get("points") or [] if isinstance(p, dict)]
    if named and "run" in runs.columns and all(isinstance(n, list) and all(isinstance(r, str) for r in n)
                                               for n in named):
        # the runs the sweep learned from (a relaunch with another fixed key leaves runs at the same points)
        runs = runs[runs["run"].astype(str).isin({r for n in named for r in n})]
    df = runs.assign(_value=run_values(runs, rec["metric"], rec["tol"]))
    g = df.groupby(facet + keys, dropna=False, sort=True)["_value"]
    return pd.DataFrame({"value": g.mean(), "runs": g.size()}).reset_index()


def triangulation(pts: pd.DataFrame, rec: dict) -> Triangulation:
    """The learner's triangulation of the points (Learner2D's, over the axes in its own coordinates)."""
    # adaptive (scipy underneath): only an adaptive sweep's diagram needs it
    import adaptive

    a, b = rec["axes"][:2]
    u, v = _coord(pts[a["key"]], a), _coord(pts[b["key"]], b)
    learner = adaptive.Learner2D(None, [(float(_coord(a["lo"], a)), float(_coord(a["hi"], a))),
                                        (float(_coord(b["lo"], b)), float(_coord(b["hi"], b)))])
    learner.tell_many(list(zip(u.tolist(), v.tolist())), [0.0] * len(u))
    tri = learner.interpolator(scaled=True).tri  # its points are the told ones, in order, scaled
    return Triangulation(u, v, triangles=tri.simplices)


PANEL = "panel"  # the runs table's column of a run's recorded panel


def _facets(runs: pd.DataFrame, rec: dict) -> tuple[pd.DataFrame, list[str]]:
    """The runs and the columns their panels are drawn by: the panel each point's entry in the record names
    with its runs (a config group's runs table column is `<group>.name`, not the key the sweep crossed), else,
    for a record without panels, the crossed keys but the seed whose columns vary."""
    named: dict[str, str] = {}
    entries = [p for p in rec.get("points") or [] if isinstance(p, dict)]
    recorded = bool(entries) and "run" in runs.columns and all(
        isinstance(p.get("panel"), list) and all(isinstance(o, str) for o in p["panel"])
        and isinstance(p.get("runs"), list) and all(isinstance(r, str) for r in p["runs"]) for p in entries)
    if recorded:
        for p in entries:
            named.update((r, ", ".join(p["panel"])) for r in p["runs"])
        if len(set(named.values())) < 2:
            return runs, []
        return runs.assign(**{PANEL: runs["run"].astype(str).map(named)}), [PANEL]
    return runs, [k for k in rec.get("crossed", []) if k != "seed" and k in runs.columns
                  and runs[k].nunique(dropna=False) > 1]


def _theory(sub: pd.DataFrame, rec: dict, tri: Triangulation, pts: pd.DataFrame, ax, notes: list) -> bool:
    """The escape theory's boundary: where the predicted break step is the run's last step. Drawn when the
    runs start from the Gaussian init with σ on an axis."""
    keys = [a["key"] for a in rec["axes"][:2]]
    if "init.sigma" not in keys or not (sub.get("init") == "gaussian").all():
        return False
    # torch, through the theory: only this overlay needs it
    from .escape import PREDICTED, add_predictions

    try:
        pred = add_predictions(sub)
    except Exception as e:  # noqa: BLE001 - the diagram stands without its overlay
        notes.append(f"escape theory not drawn: {type(e).__name__}: {e}")
        return False
    with np.errstate(divide="ignore", invalid="ignore"):  # a break predicted at step 0, or never (inf)
        ratio = np.log10(pd.to_numeric(pred[PREDICTED], errors="coerce").to_numpy(dtype=float)
                         / pd.to_numeric(pred["steps"], errors="coerce").to_numpy(dtype=float))
    ratio = pd.Series(np.clip(np.where(np.isposinf(ratio), 3.0, ratio), -3, 3), index=pred.index)
    per = pred.assign(_r=ratio).groupby(keys, sort=True)["_r"].median()
    z = per.reindex(pd.MultiIndex.from_frame(pts[keys])).to_numpy(dtype=float)
    if not np.isfinite(z).any() or np.nanmin(z) > 0 or np.nanmax(z) < 0:
        return False
    z = np.where(np.isfinite(z), z, 3.0)
    ax.tricontour(tri, z, levels=[0.0], colors="tab:red", linestyles="--", linewidths=1.5)
    return True


def _span(axis: dict) -> tuple[float, float]:
    """An axis's bounds in its drawn coordinates, with a margin of 4 % either side."""
    lo, hi = (float(_coord(axis[k], axis)) for k in ("lo", "hi"))
    return lo - 0.04 * (hi - lo), hi + 0.04 * (hi - lo)


def adaptive_diagram(runs: pd.DataFrame, rec: dict, notes: list):
    """The sweep's phase diagram (see the module's doc); the figure carries `phase_points` (its points)."""
    axes = rec["axes"]
    runs, facet = _facets(runs, rec)
    pts = points(runs, rec, facet)
    if pts.empty:
        raise ValueError(f"none of the runs loaded is one the sweep's {RECORD} names")
    groups = list(pts.groupby(facet, sort=True, dropna=False)) if facet else [((), pts)]
    n = len(groups)
    fig, axs = plt.subplots(1, n, figsize=(5.2 * n, 4.4), squeeze=False)
    metric, level = rec["metric"], rec["level"]
    unit = metric in (SUCCESS, "test_acc", "parent_attention", "acc_norm")
    vmin, vmax = (0.0, 1.0) if unit else (np.nanmin(pts["value"]), np.nanmax(pts["value"]))
    x = axes[0]
    for ax, (name, whole) in zip(axs[0], groups):
        g, empty = whole[whole["value"].notna()], whole[whole["value"].isna()]
        label = ", ".join(str(v) if k == PANEL else f"{k}={v}"
                          for k, v in zip(facet, name if isinstance(name, tuple) else (name,)))
        if len(axes) == 1:
            g = g.sort_values(x["key"])
            u = _coord(g[x["key"]], x)
            ax.plot(u, g["value"], "-o", ms=3)
            ax.axhline(level, color="k", lw=0.8)
            s = g["value"].to_numpy() - level
            for i in np.flatnonzero(np.sign(s[:-1]) * np.sign(s[1:]) < 0):
                cross = u[i] + (u[i + 1] - u[i]) * s[i] / (s[i] - s[i + 1])
                ax.axvline(cross, color="k", ls=":", lw=1)
            ax.set_ylabel(metric)
            if len(empty):  # no value to place them by: marked along the axis
                ax.plot(_coord(empty[x["key"]], x), np.full(len(empty), 0.03), "x", color="0.4", ms=5,
                        transform=ax.get_xaxis_transform(), label="no value (every run failed or diverged)")
                ax.legend(loc="best", fontsize=7)
        else:
            y = axes[1]
            u, v = _coord(g[x["key"]], x), _coord(g[y["key"]], y)
            if len(axes) == 2 and len(g) >= 3:
                sub = runs
                for k, val in zip(facet, name if isinstance(name, tuple) else (name,)):
                    sub = sub[sub[k] == val]
                tri = triangulation(g, rec)
                # filled contours of the linear interpolation: the colormap's own colours (Gouraud shading
                # would blend red and green into brown)
                im = ax.tricontourf(tri, g["value"].to_numpy(), levels=np.linspace(vmin, vmax, 21), cmap="RdYlGn",
                                    extend="both")
                if crosses(g["value"], level):
                    ax.tricontour(tri, g["value"].to_numpy(), levels=[level], colors="k", linewidths=1.5)
                if _theory(sub, rec, tri, g, ax, notes):
                    ax.plot([], [], "--", color="tab:red", label="theory: break at the last step")
                    ax.legend(loc="lower left", fontsize=7)
            else:
                im = ax.scatter(u, v, c=g["value"], cmap="RdYlGn", vmin=vmin, vmax=vmax, s=14)
            ax.plot(u, v, "k.", ms=3, clip_on=False)  # the corners too
            if len(empty):
                ax.plot(_coord(empty[x["key"]], x), _coord(empty[y["key"]], y), "x", color="0.4", ms=5,
                        clip_on=False)  # the title says what they are (a legend would hide the diagram)
            ax.set_ylim(*_span(y))
            ax.set_ylabel(("log10 " if y["log"] else "") + LABELS.get(y["key"], y["key"]))
            fig.colorbar(im, ax=ax, label=metric)
        ax.set_xlim(*_span(x))  # the sweep's domain, whatever its points' values
        ax.set_xlabel(("log10 " if x["log"] else "") + LABELS.get(x["key"], x["key"]))
        none = f"; {len(empty)} without a value (every run failed or diverged)" if len(empty) else ""
        ax.set_title(f"{label + ': ' if label else ''}{len(whole)} points, {int(whole['runs'].sum())} runs{none}",
                     fontsize=9)
    if len(axes) > 2:
        notes.append(f"adaptive sweep over {len(axes)} axes: drawn over the first two, the rest pooled")
    fig.phase_points = pts
    fig.tight_layout()
    return fig


def crosses(values, level: float) -> bool:
    """Do the points' values lie on both sides of the level, so that a two-axis panel draws its level set?"""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return len(v) > 0 and v.min() < level < v.max()


def _boundary_caption(runs: pd.DataFrame, rec: dict) -> str:
    """The caption's sentence on the boundary, from the points drawn: the level line of a one-axis sweep; the
    level set of each two-axis panel whose values cross it, and where none does, that none is drawn."""
    metric, level = rec["metric"], rec["level"]
    if len(rec["axes"]) == 1:
        return f"black line: {metric} = {level:g}, dotted where the curve crosses it"
    if len(rec["axes"]) > 2:
        return f"no boundary drawn (more than two axes: the points coloured by {metric})"
    runs, facet = _facets(runs, rec)
    pts = points(runs, rec, facet)
    panels = list(pts.groupby(facet, sort=True, dropna=False)) if facet else [((), pts)]
    drawn = sum(len(g.dropna(subset=["value"])) >= 3 and crosses(g["value"], level) for _, g in panels)
    if not drawn:
        v = pd.to_numeric(pts["value"], errors="coerce")
        return (f"no boundary drawn: no panel's points cross {metric} = {level:g} (the points' values "
                f"{v.min():.3g}–{v.max():.3g})")
    where = "" if drawn == len(panels) else f" (in {drawn} of {len(panels)} panels; the others' points do not cross it)"
    return f"black: the boundary {metric} = {level:g}{where}"


def _described(runs: pd.DataFrame, rec: dict) -> str:
    try:
        return _boundary_caption(runs, rec)
    except KeyError:  # runs without an axis's column: the diagram is not drawn either, and says why
        return "the boundary not read (the runs lack an axis)"


def adaptive_figures(runs: pd.DataFrame, records: dict, notes: list) -> list:
    """(name, caption, draw) for each adaptive sweep's diagram; `records` = {sweep folder: its record}."""
    made = []
    for i, (sweep, rec) in enumerate(records.items()):
        sub = runs[runs["sweep"] == sweep]
        if not len(sub):
            continue
        on = " × ".join(a["key"] for a in rec["axes"])
        name = f"adaptive_{rec['metric']}" + (f"_{i}" if len(records) > 1 else "")
        caption = (f"{rec['metric']} over {on} ({Path(sweep).name}, an adaptive sweep): the mean over each "
                   f"point's runs, interpolated on the learner's triangulation; dots: the sampled points; "
                   f"{_described(sub, rec)}"
                   + (f" (success: test_acc ≥ OPT − {rec['tol']:g})" if rec["metric"] == SUCCESS else ""))
        made.append((name, caption, lambda sub=sub, rec=rec: adaptive_diagram(sub, rec, notes)))
    return made
