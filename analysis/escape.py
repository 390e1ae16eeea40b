"""The escape map (beyond the paper): where a small Gaussian init escapes Theorem 4.1's
symmetric trap, and how well the linearised theory (`rw_sweeps.core.theory`) predicts when.

Runs of `experiment=escape`, drawn as phase diagrams over σ × η (both log-spaced), one row of panels
per p and one column per model.normalize, one figure per precision:
  - the success rate (acc ≥ OPT − tol, over seeds);
  - the median symmetry-break step (over the runs that broke; k/n says how many did), each cell
    "measured / predicted", the prediction being `rw_sweeps.core.theory.predict`'s median over the
    cell's runs, and cells whose runs are all predicted never to break outlined;
  - the median step at which success is reached.
And predicted vs measured break step per run, log-log, with the median ratio and its quartiles.

The predictions take a while (a jvp per step per trajectory), so they are cached per sweep in
`<sweep>/theory_escape.json`, keyed by run id, each with the sha1 of the run's config.yaml: a run
whose config changed is predicted again. Only the scalar fields are kept (not `growth`).
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from rw_sweeps.core.safefs import atomic_write

from rw_sweeps.core import contract, readers
from rw_sweeps.core.config import stored
from .phase import axis_label, phase_diagram

ESCAPE = "escape"
CACHE = "theory_escape.json"
CACHE_VERSION = 1
# runs predicted per call, the cache written after each (a kill loses little); runs that differ only in σ
# or precision share one linearised trajectory, so they are sorted together and a chunk holds ~30 of them
CHUNK = 512
KEEP = ("predicted_break_step", "base_break_step", "growth_per_step", "reason", "trap")
PREDICTED = "predicted_break_step"
FACETS = ("model.normalize", "precision")


def escape_runs(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["experiment"] == ESCAPE] if "experiment" in runs.columns else runs.iloc[:0]


# ---------------------------------------------------------------------------------------------
# the theory, cached per sweep

def add_predictions(runs: pd.DataFrame, predict=None, progress=None) -> pd.DataFrame:
    """`runs` with `predicted_break_step`: the step theory predicts, inf for "never within the
    run's steps", NaN where it makes no prediction (its `theory_reason` says why). `predict`
    defaults to rw_sweeps.core.theory.predict (list[RunConfig] -> list[dict])."""
    if predict is None:
        # torch (through rw_sweeps.core.theory): only predictions not yet cached need it, and the report
        # draws every other figure without it
        from rw_sweeps.core.theory import predict
    out = runs.copy()
    got = {}
    for sweep, sub in out.groupby("sweep", sort=False):
        got.update(_sweep_predictions(Path(sweep), sub, predict, progress))
    rows = [got.get(p, {}) for p in out["path"]]
    out[PREDICTED] = [_as_step(r) for r in rows]
    out["theory_reason"] = [r.get("reason") for r in rows]
    return out


def _as_step(r: dict) -> float:
    if not r or r.get("reason"):
        return math.nan
    s = r.get(PREDICTED)
    return math.inf if s is None else float(s)


def _sweep_predictions(sweep: Path, runs: pd.DataFrame, predict, progress) -> dict:
    """{run path: prediction} for one sweep's runs, from its cache where the config is unchanged."""
    cache_file = sweep / CACHE
    cache = _read_cache(cache_file)
    keyed, todo = {}, []
    for path, rid in zip(runs["path"], runs.get("run_id", runs["path"])):
        rid = rid if isinstance(rid, str) and rid else Path(path).name
        text = readers.read_bytes(Path(path) / contract.CONFIG, contract.CAPS[contract.CONFIG])
        sha = hashlib.sha1(text).hexdigest()
        keyed[path] = rid
        hit = cache.get(rid)
        if not (hit and hit.get("config_sha1") == sha):
            todo.append((path, rid, sha, text))
    if todo:
        todo.sort(key=lambda item: _trajectory_order(item[3]))
        for i in range(0, len(todo), CHUNK):
            part = todo[i:i + CHUNK]
            cfgs = [stored(_yaml(path, text)) for path, _, _, text in part]
            for (_, rid, sha, _), r in zip(part, predict(cfgs)):
                cache[rid] = {"config_sha1": sha, **{k: r.get(k) for k in KEEP}}
            _write_cache(cache_file, cache)
            if progress:
                progress(min(i + CHUNK, len(todo)), len(todo))
    return {path: cache[rid] for path, rid in keyed.items()}


def _trajectory_order(text: bytes) -> str:
    """A run's config without σ and precision: runs sharing it share the theory's trajectory."""
    cfg = dict(_yaml("config.yaml", text))
    cfg.pop("precision", None)
    if isinstance(cfg.get("init"), dict):
        cfg["init"] = {k: v for k, v in cfg["init"].items() if k != "sigma"}
    return json.dumps(cfg, sort_keys=True, default=str)


def _yaml(path, text: bytes) -> dict:
    """A run's config.yaml (already judged by the contract when the table was loaded), read as it reads it."""
    return readers.yaml_value(text.decode("utf-8"), Path(path) / contract.CONFIG)


def _progress(done: int, total: int) -> None:
    print(f"theory: {done}/{total} escape runs predicted", file=sys.stderr, flush=True)


CACHE_CAP = 1 << 30  # the theory cache's bytes (a few hundred a run)


def _read_cache(f: Path) -> dict:
    try:
        data = readers.read_json(f, CACHE_CAP)
        return data["runs"] if data.get("version") == CACHE_VERSION and isinstance(data["runs"], dict) else {}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:   # torn or foreign: predict again
        warnings.warn(f"ignoring unreadable theory cache {f}: {e}")
        return {}


def _write_cache(f: Path, runs: dict) -> None:
    try:                                 # the one atomic writer: a reader sees the old cache or the new one
        atomic_write(f, json.dumps({"version": CACHE_VERSION, "runs": runs}, allow_nan=False))
    except (OSError, ValueError) as e:   # a read-only sweep still gets its overlay, uncached
        warnings.warn(f"could not write theory cache {f}: {e}")


# ---------------------------------------------------------------------------------------------
# predicted vs measured

def ratio_stats(runs: pd.DataFrame) -> dict:
    """Predicted / measured break step over the runs where both are finite and > 0: n, median,
    quartiles; and how the runs where one side is "never" split."""
    m = pd.to_numeric(runs["symmetry_break_step"], errors="coerce").astype(float)
    t = pd.to_numeric(runs[PREDICTED], errors="coerce").astype(float)
    has = t.notna() & (runs["status"] == "done")
    both = has & m.notna() & np.isfinite(t) & (m > 0) & (t > 0)
    r = (t[both] / m[both]).to_numpy()
    q = np.percentile(r, [25, 50, 75]) if len(r) else [math.nan] * 3
    return {"n": int(both.sum()), "q25": q[0], "median": q[1], "q75": q[2],
            "both_never": int((has & m.isna() & np.isinf(t)).sum()),
            "measured_never_only": int((has & m.isna() & np.isfinite(t)).sum()),
            "predicted_never_only": int((has & m.notna() & np.isinf(t)).sum()),
            "at_zero": int((has & m.notna() & np.isfinite(t) & ((m == 0) | (t == 0))).sum()),
            "no_prediction": int((t.isna() & (runs["status"] == "done")).sum())}


LATE = 10  # a trap run that breaks after this step is the theory's real test: the trap held, then gave way


def regimes(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The runs the theory is judged on, apart: trap runs (summary `trap`: zero init would never leave the
    symmetric point) that break late, where the break step is set by σ and the growth rate; and the rest
    (un-normalised runs that break within a few steps, near-deterministic walks that break at the zero-init
    run's own σ-independent step), which pooled would make the theory look better than it is tested."""
    m = pd.to_numeric(runs["symmetry_break_step"], errors="coerce").astype(float)
    trap = runs["trap"].fillna(False).astype(bool) if "trap" in runs else pd.Series(False, index=runs.index)
    late = trap & (m > LATE)
    return {f"trap runs breaking after step {LATE}": late, "the rest": ~late}


def fig_predicted_vs_measured(runs: pd.DataFrame):
    """Per run: measured break step (x) against the predicted one (y), log-log, y = x drawn;
    colour: p, marker: normalize and precision."""
    m = pd.to_numeric(runs["symmetry_break_step"], errors="coerce").astype(float)
    t = pd.to_numeric(runs[PREDICTED], errors="coerce").astype(float)
    ok = (runs["status"] == "done") & m.notna() & np.isfinite(t) & (m > 0) & (t > 0)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    sub = runs[ok]
    ps = sorted(sub["data.p"].dropna().unique()) if "data.p" in sub else [None]
    styles = sorted({_style(r) for _, r in sub.iterrows()})
    markers = dict(zip(styles, "os^Dv<>P*X"))
    for i, p in enumerate(ps):
        for st in styles:
            sel = ok & (runs["data.p"] == p) & (runs.apply(_style, axis=1) == st)
            if sel.any():
                ax.scatter(m[sel], t[sel], s=18, alpha=0.6, color=f"C{i}", marker=markers[st],
                           label=f"p = {axis_label('data.p', p)}, {st}")
    if ok.any():
        lo, hi = min(m[ok].min(), t[ok].min()) / 1.5, max(m[ok].max(), t[ok].max()) * 1.5
        ax.plot([lo, hi], [lo, hi], color="k", lw=1, ls="--", label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="upper left", ncol=1 + len(ps) * len(styles) // 12)
    else:
        ax.text(0.5, 0.5, "no run with both a measured and a predicted break step",
                ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xlabel("measured symmetry-break step (summary.json)")
    ax.set_ylabel("predicted (rw_sweeps.core.theory)")
    ax.set_title("escape: predicted vs measured break step, one point per run", fontsize=10)
    fig.tight_layout()
    return fig


def _style(run) -> str:
    return ", ".join(str(run.get(k)) for k in FACETS if k in run.index)


# ---------------------------------------------------------------------------------------------
# the figures

def escape_figures(runs: pd.DataFrame, notes: list[str], predict=None):
    """Yield (name, caption, draw) for the escape map of the escape runs in `runs` (with
    `success` and `success_step` added), theory drawn on where rw_sweeps.core.theory is there."""
    runs = escape_runs(runs)
    if not len(runs):
        return
    try:
        runs = add_predictions(runs, predict, _progress)
    except Exception as e:   # the theory missing or failing costs the overlay, not the map
        notes.append(f"escape: no theory overlay ({type(e).__name__}: {e})")
        runs = runs.assign(**{PREDICTED: math.nan})
    theory = PREDICTED if runs[PREDICTED].notna().any() else None
    x, y = _varying(runs, "init.sigma"), _varying(runs, "optim.lr")
    row = _varying(runs, "data.p")
    col, split = [k for k in FACETS if _varying(runs, k)] + [None, None], None
    col, split = col[0], col[1]
    if x is None:
        x, y = y or "data.p", None
    parts = [(None, runs)] if split is None else [
        (v, runs[runs[split] == v]) for v in sorted(runs[split].dropna().unique())]
    for v, sub in parts:
        tag = f"_{v}" if v is not None else ""
        where = f", {split} = {v}" if v is not None else ""
        on = f"σ × η, by p{f' and {col}' if col else ''}{where}"
        yield (f"escape_success{tag}", f"Escape map: success rate over seeds, {on}.",
               partial(_diagram, sub, x, y, "success", row, col, "mean", None))
        cap = (f"Escape map: median symmetry-break step (first evaluated step with attention "
               f"spread > 1e-3), {on}")
        if theory:
            cap += ("; each cell measured / predicted (rw_sweeps.core.theory, median over the cell's "
                    "runs predicted to break), blue dotted: theory predicts no break")
        yield (f"escape_break{tag}", cap + ".",
               partial(_diagram, sub, x, y, "symmetry_break_step", row, col, "median", theory))
        yield (f"escape_success_step{tag}",
               f"Escape map: median first step at success (acc ≥ OPT − tol), {on}.",
               partial(_diagram, sub, x, y, "success_step", row, col, "median", None))
    if theory:
        st = ratio_stats(runs)
        every = sorted(runs["eval_every"].dropna().unique()) if "eval_every" in runs else []
        by = "; ".join(f"{label}: {r['n']} runs, median {r['median']:.3g}, quartiles {r['q25']:.3g}–{r['q75']:.3g}"
                       for label, mask in regimes(runs).items() for r in [ratio_stats(runs[mask])])
        yield ("escape_theory", "Escape: predicted vs measured break step per run (log-log, "
               f"dashed y = x). Predicted / measured, by regime: {by}. Never broke "
               f"within the run: both {st['both_never']}, measured only "
               f"{st['measured_never_only']}, predicted only {st['predicted_never_only']}; "
               f"{st['at_zero']} runs broke at step 0 (left out), {st['no_prediction']} have no "
               f"prediction. Break steps are known to eval_every = "
               f"{', '.join(map(str, every)) or '?'} steps.",
               partial(fig_predicted_vs_measured, runs))


def _diagram(runs, x, y, metric, row, col, agg, theory):
    fig = phase_diagram(runs, x, y, metric, row, col, agg=agg, theory=theory)
    return fig


def _varying(runs, key):
    return key if key in runs.columns and runs[key].nunique(dropna=False) > 1 else None
