"""The paper's figures (Shi & Cao 2025) redrawn from stored histories and snapshots.

Fig. 2        Π for chosen p (computed here, paper §1: π_{i,i+1} = p, π_{i,i−1} = 1 − p, cyclic).
Figs. 4/5/8/9 one run: test accuracy vs step, V beside Πᵀ, mean attention S_j by position j,
              and a zoom on the last positions (the parent x_{N−1} and the query).
Figs. 6/7/10  accuracy and KL vs step, mean over seeds with the min–max band, one row per
              setting (p, or the QA task).
Figs. 11–13   Fig. 6's runs: V and attention of the random walk (11); V over snapshot steps (12)
              and the weighted-average token X·S of one sequence with its variance across
              sequences (13), for the deterministic walk.
"""
from __future__ import annotations

from functools import partial

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from . import claims
from .claims import F11_COS, F11_PARENT, H_VAR_ZERO, HORIZON, OPT_GAP
from .heatmap import heatmap
from .load import load_history, load_snapshots
from rw_sweeps.core.markov import Pi   # plain numpy: the one Π

from .phase import axis_label, swept_keys

PER_RUN = ("fig4", "fig5", "fig8", "fig9")
CURVES = ("fig6", "fig7", "fig10")
# the reading-search, escape and locking presets: drawn by claims.py (the reading table), escape.py and locking.py
RANDOM_INIT = ("fig6_readings", "fig10_readings", "escape", "locking")
PAPER_STEPS = (100, 400, 700, 1000)   # the snapshot steps of Figs. 12-13
ZOOM = 10                             # last positions shown in the attention zoom, Fig. 4(d)
# What each paper figure shows (the paper's text, arXiv 2511.23239), written in its caption
# beside what the run shows: a caption states the run's numbers, never the paper's picture as the run's.
PAPER = {
    "fig4": "at p = 0.5, accuracy close to OPT (50 %) within a few steps, V recovers Πᵀ, attention on the parent "
            "x_{N−1} close to 1",
    "fig5": "accuracy ≈ 1/K, V ≈ ∝ 1_{K×K}, the same attention on every token",
    "fig8": "as Fig. 4 at K = 20, N = 101: accuracy near OPT, V recovers Πᵀ, attention on the parent",
    "fig9": "as Fig. 5 at K = 20, N = 101: accuracy ≈ 1/K, the same attention on every token",
    "fig6": "p = 0.5 close to OPT (50 %) after about 400 steps; p = 1 below 100 % through step 1000",
    "fig7": "Task 1 close to 100 % within 100 steps; Task 2 around 50 %",
    "fig10": "with the FFN: Task 1 close to 100 % within 100 steps; Task 2 around 50 %",
    "fig11": "V recovers Πᵀ, and the attention on the direct parent is the largest and close to 1",
    "fig12": "V ≈ ∝ 1_{K×K} through step 700, no longer at step 1000",
    "fig13": "X·S ≈ ∝ 1 with variance ≈ 0 across sequences through step 700; at step 1000 one token's score "
             "much larger than the others",
}


def fig_pi(K: int = 6, ps=(0.5, 0.7, 1.0)):
    """Fig. 2: Π as a heatmap for each p."""
    fig, axes = plt.subplots(1, len(ps), figsize=(3.3 * len(ps), 3), squeeze=False)
    for ax, p in zip(axes[0], ps):
        _matrix(ax, Pi(K, p), f"Π, p = {p:g}", vmin=0, vmax=1)
    fig.suptitle(f"Fig. 2: transition matrix Π (K = {K})")
    fig.tight_layout()
    return fig


def fig_run(run: pd.Series, title: str = ""):
    """Figs. 4/5/8/9 for one run (a row of the loaded table): (a) test accuracy vs step with OPT
    and chance 1/K, (b) final V beside Πᵀ, (c) mean attention by position, (d) the last
    positions."""
    hist = load_history([run["path"]])
    snaps = load_snapshots([run["path"]])
    K = int(run.get("data.K", run.get("K")))
    fig = plt.figure(figsize=(17, 3.6))
    gs = fig.add_gridspec(1, 5, width_ratios=[1.2, 1, 1, 1.4, 0.9], wspace=0.5)
    ax = fig.add_subplot(gs[0])
    _curve(ax, hist, "test_acc", run)
    ax.set_title("(a) test accuracy")
    last = snaps.loc[snaps["step"].idxmax()] if len(snaps) else None
    V = last["V"] if last is not None else None
    _matrix(fig.add_subplot(gs[1]), V, f"(b) V at step {_step(last)}")
    ax = fig.add_subplot(gs[2])
    if _is_walk(run):
        _matrix(ax, Pi(K, float(run.get("data.p", run.get("p")))).T, "Πᵀ", vmin=0, vmax=1)
    else:
        _empty(ax, "no Π: QA task")
    S = last["attention"] if last is not None else None
    _attention(fig.add_subplot(gs[3]), S, f"(c) mean attention S_j, step {_step(last)}")
    _attention(fig.add_subplot(gs[4]), S, "(d) zoom: last positions", zoom=ZOOM)
    fig.suptitle(title or _describe(run), y=1.02)
    return fig


def fig_curves(runs: pd.DataFrame, by: list[str], title: str = ""):
    """Figs. 6/7/10: one row per setting of `by`; test accuracy and KL vs step, mean over the
    setting's seeds with a min–max band."""
    hist = load_history(runs, columns=by)
    groups = list(runs.groupby(by, sort=True, dropna=False)) if by else [((), runs)]
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3 * len(groups)), squeeze=False)
    for (key, sub), (ax_acc, ax_kl) in zip(groups, axes):
        h = hist[hist["path"].isin(sub["path"])] if len(hist) else hist
        label = ", ".join(f"{k} = {axis_label(k, v)}" for k, v in zip(by, np.atleast_1d(key)))
        _band(ax_acc, h, "test_acc")
        _band(ax_kl, h, "test_kl")
        opt = sub["opt_acc"].dropna()
        if len(opt):
            ax_acc.axhline(opt.iloc[0], color="k", ls="--", lw=1, label="OPT")
        K = sub.get("data.K", sub.get("K"))
        if K is not None and len(K.dropna()):
            ax_acc.axhline(1 / K.dropna().iloc[0], color="grey", ls=":", lw=1, label="1/K")
        ax_acc.set_ylim(-0.02, 1.02)
        ax_acc.set_title(f"test accuracy — {label or 'all runs'} ({len(sub)} seeds)", fontsize=9)
        ax_kl.set_title(f"KL(true ‖ prediction) — {label or 'all runs'}", fontsize=9)
        ax_acc.legend(fontsize=7)
    fig.suptitle(title, y=1.0)
    fig.tight_layout()
    return fig


def fig_v_steps(run: pd.Series, steps=PAPER_STEPS, title: str = ""):
    """Fig. 12: V at chosen snapshot steps (the paper's, else four spread over the run)."""
    snaps = _pick_steps(load_snapshots([run["path"]]), steps)
    fig, axes = plt.subplots(1, max(len(snaps), 1), figsize=(3.2 * max(len(snaps), 1), 3),
                             squeeze=False)
    for ax, (_, s) in zip(axes[0], snaps.iterrows()):
        _matrix(ax, s["V"], f"V, step {s['step']}")
    if not len(snaps):
        _empty(axes[0, 0], "no snapshots")
    fig.suptitle(title or f"V over training — {_describe(run)}")
    fig.tight_layout()
    return fig


def fig_h_steps(run: pd.Series, steps=PAPER_STEPS, title: str = ""):
    """Fig. 13: the weighted-average token X·S of test sequence 0 (top) and the variance of
    each of its K entries across test sequences (bottom), at chosen snapshot steps."""
    snaps = _pick_steps(load_snapshots([run["path"]]), steps)
    n = max(len(snaps), 1)
    fig, axes = plt.subplots(2, n, figsize=(3 * n, 5), squeeze=False, sharey="row")
    for j, (_, s) in enumerate(snaps.iterrows()):
        for i, key in enumerate(("h_example", "h_var")):
            h = s[key]
            if h is None or not np.size(h):
                _empty(axes[i, j], f"no {key}")
                continue
            axes[i, j].bar(np.arange(1, len(h) + 1), h, color="C0" if i == 0 else "C1")
            axes[i, j].set_xlabel("entry k")
        axes[0, j].set_title(f"step {s['step']}")
    axes[0, 0].set_ylabel("X·S, sequence 0")
    axes[1, 0].set_ylabel("variance across sequences")
    if not len(snaps):
        _empty(axes[0, 0], "no snapshots")
    fig.suptitle(title or f"weighted-average token over training — {_describe(run)}")
    fig.tight_layout()
    return fig


def fig_11(run: pd.Series, title: str = ""):
    """Fig. 11: the random-walk run of Fig. 6: final V beside Πᵀ, and attention by position."""
    snaps = load_snapshots([run["path"]])
    last = snaps.loc[snaps["step"].idxmax()] if len(snaps) else None
    K = int(run.get("data.K", run.get("K")))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1, 1.6]})
    _matrix(axes[0], last["V"] if last is not None else None, f"(a) V at step {_step(last)}")
    _matrix(axes[1], Pi(K, float(run.get("data.p", run.get("p")))).T, "Πᵀ", vmin=0, vmax=1)
    _attention(axes[2], last["attention"] if last is not None else None,
               f"(b) mean attention S_j, step {_step(last)}")
    fig.suptitle(title or f"Fig. 11 — {_describe(run)}")
    fig.tight_layout()
    return fig


def paper_figures(runs: pd.DataFrame, notes: list[str] | None = None, max_runs: int = 8):
    """Yield (name, caption, draw) for every paper figure the runs' experiment presets
    (config `experiment`) call for; `draw()` makes the figure, so that a caller can go on
    past one that fails. What cannot be drawn is said in `notes`."""
    notes = [] if notes is None else notes
    if "experiment" not in runs.columns or runs["experiment"].isna().all():
        notes.append("no run used an experiment preset (config `experiment` is null): "
                     "--paper draws nothing")
        return
    walks = runs[runs["data.name"] == "random_walk"] if "data.name" in runs else runs
    for K in sorted(walks["data.K"].dropna().unique()) if "data.K" in walks else []:
        yield (f"fig2_pi_K{int(K)}", f"Fig. 2: Π for p = 0.5, 0.7, 1 with K = {int(K)}.",
               partial(fig_pi, int(K)))
    for exp, sub in runs.dropna(subset=["experiment"]).groupby("experiment", sort=True):
        sub = _sorted(sub)
        n = f"Fig. {exp[3:]}"
        if exp in PER_RUN:
            for i, (_, run) in enumerate(_one_per_setting(sub).head(max_runs).iterrows()):
                yield (f"{exp}_run{i}", f"{n}: accuracy, V beside Πᵀ, mean attention by "
                       f"position and its last {ZOOM} positions — {_describe(run)}. "
                       f"The paper: {PAPER[exp]}. {_shows(run)}: {RUN_VERDICT[exp](run)}.",
                       partial(fig_run, run, f"{n} — {_describe(run)}"))
        elif exp in CURVES:
            by = swept_keys(sub)
            yield (f"{exp}_curves", f"{n}: test accuracy and KL over steps, mean and min–max "
                   f"over seeds, by {', '.join(by) or 'nothing (one setting)'}. The paper: {PAPER[exp]}. "
                   f"These runs at their last step: {_ends(sub, by)}: {_curves_verdict(exp, sub)}.",
                   partial(fig_curves, sub, by, f"{n}: {len(sub)} runs"))
            if exp == "fig6":
                yield from _figs_11_to_13(sub)
        elif exp not in RANDOM_INIT:
            notes.append(f"experiment {exp!r} has no paper figure here")


def _figs_11_to_13(sub: pd.DataFrame):
    """Fig. 11 from the random walk of Fig. 6 (0 < p < 1), Figs. 12-13 from the deterministic
    one (p in {0, 1})."""
    p = pd.to_numeric(sub.get("data.p"), errors="coerce")
    rw, det = sub[~p.isin([0.0, 1.0])], sub[p.isin([0.0, 1.0])]
    if len(rw):
        run = rw.iloc[0]
        yield ("fig11", f"Fig. 11: the random walk of Fig. 6 — {_describe(run)}. The paper: {PAPER['fig11']}. "
               f"{_shows(run)}: {_fig4_verdict(run, acc=False)}.", partial(fig_11, run))
    run = det.iloc[0] if len(det) else sub.iloc[0]
    yield ("fig12", f"Fig. 12: V at the snapshot steps nearest {list(PAPER_STEPS)} — "
           f"{_describe(run)}. The paper: {PAPER['fig12']}. {_shows(run)}: {_snapshot_verdict('fig12', run)}.",
           partial(fig_v_steps, run, title=f"Fig. 12 — {_describe(run)}"))
    yield ("fig13", "Fig. 13: the weighted-average token X·S of one test sequence, and the "
           f"variance of its entries across test sequences — {_describe(run)}. The paper: {PAPER['fig13']}. "
           f"{_shows(run)}: {_snapshot_verdict('fig13', run)}.",
           partial(fig_h_steps, run, title=f"Fig. 13 — {_describe(run)}"))


# ---------------------------------------------------------------------------------------------
# what the runs show, for the captions: their own summary numbers

def _value(run, key):
    """The run's summary value of `key` as a float, or None where it has none (missing, null, NaN)."""
    v = pd.to_numeric(pd.Series([run.get(key)]), errors="coerce").iloc[0]
    return None if pd.isna(v) else float(v)


def _shows(run) -> str:
    """What the run shows at its last step, from its summary: accuracy against OPT and 1/K, and (a walk) the
    attention on the parent, cos(V, Πᵀ) and where the symmetric attention broke."""
    acc, opt, K, steps = (_value(run, k) for k in ("test_acc", "opt_acc", "data.K", "steps"))
    parts = [f"test_acc {_g(acc)}" + (f" (OPT {_g(opt)}, 1/K {1 / K:.3g})" if opt is not None and K else "")]
    if _is_walk(run):
        parts += [f"{label} {_g(_value(run, key))}" for key, label in
                  (("parent_attention", "parent attention"), ("v_pi_cosine", "cos(V, Πᵀ)"))
                  if _value(run, key) is not None]
        broke = _value(run, "symmetry_break_step")
        if broke is not None:
            parts.append(f"symmetric attention left at step {int(broke)}")
        elif "symmetry_break_step" in run.index and steps is not None:
            parts.append(f"attention symmetric through step {int(steps)}")
    at = f" at step {int(steps)}" if steps is not None else ""
    return f"This run{at}: " + ", ".join(parts)


def verdict(checks: dict) -> str:
    """The one rule of every paper caption: `checks` maps what the paper's picture needs (its threshold named)
    to True (the runs show it), False (they do not) or None (no run here measures it). The paper's picture
    where every check holds; not, where one fails; else that it cannot say. Each check is named once."""
    said = {v: [k for k, got in checks.items() if got is v] for v in (False, True, None)}
    if checks and len(said[True]) == len(checks):
        return "the paper's picture"
    parts = [f"{what}: {'; '.join(said[v])}" for v, what in ((False, "not met"), (True, "met"),
                                                                (None, "not measured")) if said[v]]
    head = "not the paper's picture" if said[False] else "cannot say whether it is the paper's picture"
    return f"{head} ({'; '.join(parts)})"


def _at_least(value, threshold):
    return None if value is None else value >= threshold


def _fig4_verdict(run, acc: bool = True) -> str:
    """Figs. 4/8 (and, without the accuracy, Fig. 11) from the run's summary at its last step: accuracy
    within OPT_GAP of OPT, the attention on the parent and cos(V, Πᵀ) at the reading table's thresholds."""
    opt, got = _value(run, "opt_acc"), _value(run, "test_acc")
    checks = {f"test_acc ≥ OPT − {OPT_GAP:g}": None if opt is None or got is None else got >= opt - OPT_GAP} \
        if acc else {}
    checks[f"parent attention ≥ {F11_PARENT:g}"] = _at_least(_value(run, "parent_attention"), F11_PARENT)
    checks[f"cos(V, Πᵀ) ≥ {F11_COS:g}"] = _at_least(_value(run, "v_pi_cosine"), F11_COS)
    return verdict(checks)


def _fig5_verdict(run) -> str:
    """Figs. 5/9: accuracy within OPT_GAP of 1/K, and the attention still symmetric (no symmetry break)."""
    got, K = _value(run, "test_acc"), _value(run, "data.K")
    symmetric = (None if "symmetry_break_step" not in run.index
                 else _value(run, "symmetry_break_step") is None)
    return verdict({f"|test_acc − 1/K| ≤ {OPT_GAP:g}": None if got is None or not K else abs(got - 1 / K) <= OPT_GAP,
                    "the same attention on every token through the last step (no symmetry break)": symmetric})


RUN_VERDICT = {"fig4": _fig4_verdict, "fig8": _fig4_verdict, "fig5": _fig5_verdict, "fig9": _fig5_verdict}
# Figs. 6/7/10: the reading table's claims (`analysis.claims`), each judged on the runs of its setting
CURVE_CLAIMS = {"fig6": {"fig6a": claims.SETTING["fig6a"], "fig6c": claims.SETTING["fig6c"]},
                "fig7": {"fig10a": lambda r: r.get("data.name") == "qa_majority",
                         "fig10c": lambda r: r.get("data.name") == "qa_preference"},
                "fig10": {"fig10a": claims.SETTING["fig10a"], "fig10c": claims.SETTING["fig10c"]}}


def _curves_verdict(exp: str, runs: pd.DataFrame) -> str:
    """Each claim of the figure true of every run of its setting (a diverged run fails it)."""
    hist = load_history(runs)
    hist = {p: h.sort_values("step") for p, h in hist.groupby("path")} if len(hist) else {}
    empty = pd.DataFrame({"step": [], "test_acc": []})
    checks = {}
    for claim, selects in CURVE_CLAIMS[exp].items():
        said = [False if run["status"] == "diverged" else
                claims.JUDGE[claim](run, hist.get(run["path"], empty), empty)
                for _, run in runs.iterrows() if selects(run) and run["status"] in ("done", "diverged")]
        checks[f"{claims.TEXT[claim]}, every run"] = (None if not said or None in said and False not in said
                                                      else all(said))
    return verdict(checks)


def _snapshot_verdict(fig: str, run) -> str:
    """Figs. 12/13 from the run's snapshots: the reading table's window claim, and the paper's step
    1000 (V no longer ∝ 1, in the claim for Fig. 12; one token's score standing out, Var(X·S) > H_VAR_ZERO,
    for Fig. 13)."""
    snaps = load_snapshots([run["path"]]).sort_values("step")
    checks = {claims.TEXT[fig]: claims.JUDGE[fig](run, pd.DataFrame(), snaps)}
    if fig == "fig13":
        end = snaps[snaps["step"] == HORIZON]
        h = end["h_var"].iloc[-1] if len(end) else None
        checks[f"max_k Var(X·S)_k > {H_VAR_ZERO:g} at step {HORIZON}"] = (
            None if h is None or not np.size(h) else float(np.max(h)) > H_VAR_ZERO)
    return verdict(checks)


def _ends(runs: pd.DataFrame, by: list[str]) -> str:
    """Per setting of `by`: the final test accuracy, mean and min–max over its runs, against OPT."""
    groups = runs.groupby(by, sort=True, dropna=False) if by else [((), runs)]
    out = []
    for key, sub in groups:
        acc = pd.to_numeric(sub.get("test_acc", pd.Series(dtype=float)), errors="coerce").dropna()
        opt = pd.to_numeric(sub.get("opt_acc", pd.Series(dtype=float)), errors="coerce").dropna()
        label = ", ".join(f"{k} = {axis_label(k, v)}" for k, v in zip(by, np.atleast_1d(key))) or "all runs"
        if not len(acc):
            out.append(f"{label}: no test_acc")
            continue
        spread = f" ({_g(acc.min())}–{_g(acc.max())})" if len(acc) > 1 else ""
        out.append(f"{label}: test_acc {_g(acc.mean())}{spread} over {len(acc)} run(s)"
                   + (f", OPT {_g(opt.iloc[0])}" if len(opt) else ""))
    return "; ".join(out)


def _g(v) -> str:
    return "none" if v is None else f"{v:.3g}"


# ---------------------------------------------------------------------------------------------
# panels

def _matrix(ax, M, title, vmin=None, vmax=None):
    if M is None:
        return _empty(ax, "no snapshot")
    M = np.asarray(M)
    ticks = np.arange(1, M.shape[1] + 1)
    # K = 6: the numbers are readable, and V ≈ Πᵀ is judged by them
    # the numbers as written, a value that rounds to 0 as 0.00 (never "-0.00", which reads as a sign)
    numbers = np.vectorize(lambda x: f"{x:.2f}" if round(x, 2) else "0.00")(M) if M.shape[0] <= 8 else None
    heatmap(ax, M, cmap="Blues", vmin=vmin, vmax=vmax, square=True, cbar=True, xticklabels=ticks,
            yticklabels=np.arange(1, M.shape[0] + 1), annot=numbers, fmt="", annot_kws={"fontsize": 6})
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7, length=0)  # a row's tick mark beside its first number reads as a minus sign


def _attention(ax, S, title, zoom=None):
    if S is None:
        return _empty(ax, "no snapshot")
    S = np.asarray(S)
    N = len(S)
    j = np.arange(1, N + 1)
    lo = N - zoom if zoom else 0
    colors = ["C3" if k == N - 1 else "C2" if k == N else "C0" for k in j[lo:]]
    ax.bar(j[lo:], S[lo:], color=colors, width=0.8)
    # the key names only the bars drawn: a zoom, a map without the query's column, or a bar of height 0 lacks one
    drawn = {c for c, s in zip(colors, S[lo:]) if s > 0}
    key = [text for c, text in (("C3", "red: position N−1, a walk's parent"), ("C2", "green: the query"))
           if c in drawn]
    ax.set_xlabel("position j" + (f"  ({', '.join(key)})" if key else ""), fontsize=8)
    ax.set_ylabel("S_j")
    ax.set_title(title, fontsize=9)
    if zoom:
        ax.set_xticks(j[lo:])
        ax.tick_params(axis="x", labelsize=6)


def _curve(ax, hist, metric, run):
    if len(hist) and metric in hist:
        ax.plot(hist["step"], hist[metric], marker=".", ms=3)
    opt = run.get("opt_acc")
    if opt == opt and opt is not None:
        ax.axhline(opt, color="k", ls="--", lw=1, label=f"OPT = {opt:.2g}")
    K = run.get("data.K", run.get("K"))
    ax.axhline(1 / K, color="grey", ls=":", lw=1, label=f"1/K = {1 / K:.2g}")
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)


def _band(ax, hist, metric):
    if not len(hist) or metric not in hist or hist[metric].isna().all():
        return _empty(ax, f"no {metric} in histories")
    g = hist.groupby("step")[metric]
    mean, lo, hi = g.mean(), g.min(), g.max()
    ax.plot(mean.index, mean, lw=1.5, label="mean")
    ax.fill_between(mean.index, lo, hi, alpha=0.25, label="min–max over seeds")
    ax.set_xlabel("step")
    if lo.min() > 0 and hi.max() > 100 * lo.min():   # KL from a random init spans decades
        ax.set_yscale("log")


def _empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------------------------------------
# choosing runs and steps

def _pick_steps(snaps: pd.DataFrame, wanted) -> pd.DataFrame:
    """The paper's steps if the run stored them, else four spread over the run (last included)."""
    if not len(snaps):
        return snaps
    have = sorted(snaps["step"])
    if set(wanted) <= set(have):
        chosen = list(wanted)
    else:
        later = [s for s in have if s > 0] or have
        chosen = sorted({later[round(q * (len(later) - 1))] for q in (0.25, 0.5, 0.75, 1.0)})
    return snaps[snaps["step"].isin(chosen)].sort_values("step")


def _sorted(runs):
    keys = [k for k in swept_keys(runs) + ["seed"] if k in runs.columns]
    return runs.sort_values(keys, kind="stable") if keys else runs


def _one_per_setting(runs):
    """The lowest seed of each setting: one figure per point of the sweep, not per seed."""
    keys = swept_keys(runs)
    return runs.drop_duplicates(keys) if keys else runs.head(1)


def _is_walk(run) -> bool:
    return run.get("data.name", run.get("data", "random_walk")) == "random_walk"


def _step(snap):
    return "—" if snap is None else int(snap["step"])


def _describe(run) -> str:
    parts = []
    if _is_walk(run):
        parts.append(f"p = {axis_label('data.p', run.get('data.p'))}")
    else:
        parts.append(str(run.get("data.name")))
    parts.append(f"K = {run.get('data.K')}, N = {run.get('data.N')}")
    init = run.get("init")
    parts.append("zero init" if init == "zero" else
                 f"{init} init σ = {axis_label('init.sigma', run.get('init.sigma'))}")
    parts.append(f"lr = {axis_label('optim.lr', run.get('optim.lr'))}, seed {run.get('seed')}")
    return ", ".join(parts)
