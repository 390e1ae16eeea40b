"""The reading search: each run of `experiment=fig6_readings` / `fig10_readings` scored
against the paper's claims about its random-init experiments (§5b, §6, App. F), and one table row per reading.

A reading is one setting of the keys the paper leaves open (model.normalize, model.ffn,
optim.reduction, optim.name, optim.lr, model.pos_scale, init.sigma, and any other key its sweep varies
except the task's own: p, the data set, the model, the seed). Each cell is the fraction of the
reading's runs (seeds pooled) for which the claim holds; "–" where the reading has no run that can
say (no run of that setting, or none long enough). Rows are sorted best first: the mean over the
claims that have data.

The claims (steps are GD iterations; history.jsonl holds test_acc every eval_every steps, so a step
is known to that resolution):
  fig6a   p = 0.5: test_acc first reaches OPT − 0.03 (OPT_GAP) at a step in [100, 1000]: "close to
          the optimal accuracy after around 400 iterations", so neither within the first 100 steps
          (the zero-init speed of Fig. 4) nor never.
  fig6c   p = 1: test_acc stays below 0.99 at every evaluation through step 1000: "cannot reach the
          optimal accuracy (100 %) within 1000 iterations".
  fig11   p = 0.5, at step 1000: parent attention ≥ 0.9 and cos(V, Πᵀ) ≥ 0.9.
  fig12   p = 1: cos(V, 1_{K×K}) ≥ 0.99 at every snapshot from step 100 through 700, and < 0.99 at
          step 1000 ("V ≈ ∝ all-ones within 700 iterations … no longer after 1000"). The window
          starts at 100, the first step Fig. 12 shows: V(0) is the random draw, not ∝ 1.
  fig13   p = 1: the variance of X·S across test sequences (snapshot h_var, its max over the K
          entries) is ≤ 1e-6 (H_VAR_ZERO) at every snapshot from step 100 through 700. Why 1e-6: an
          entry of X·S is ≈ 1/K ≈ 0.17 while the attention is symmetric, and a variance of 1e-6 is a
          spread of 1e-3, under 1 % of it; once the attention locks onto one token X·S is nearly
          one-hot and the variance is ≈ (1/K)(1 − 1/K) ≈ 0.14. Any threshold far between the two
          separates them.
  fig10a  QA Task 1 (qa_majority) with the FFN: test_acc ≥ 0.95 at step 100. Fig. 10(a)'s curve reaches
          ~100 % and stays there; a transient peak that falls back (which several readings show:
          1.0 at step 15, 0.5 from step 20 on) is not that curve.
  fig10c  QA Task 2 (qa_preference) with the FFN: |test_acc − 0.5| ≤ 0.1 at step 100 ("remains
          around 50 %"). Why 0.1: with 1024 test sequences the binomial spread of a coin is 0.016, so
          0.1 is ~6 spreads, while a model that learned the task scores 1.
A run that diverged fails every claim of its setting (the figures show runs that go on); a run that
failed (an error, not an outcome of the reading) says nothing.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .load import config_keys, load_history, load_snapshots
from .phase import axis_label

READING_EXPERIMENTS = ("fig6_readings", "fig10_readings")
# the keys the paper leaves open, in this order; any other key a reading sweep varies follows
READING_KEYS = ["model.normalize", "model.ffn", "optim.reduction", "optim.name", "optim.lr",
                "model.pos_scale", "init.sigma"]
# what a claim is about rather than how it is read: never a reading key
SETTING_KEYS = {"seed", "experiment", "data.p", "data.name", "data.K", "data.N", "data.n_test",
                "model.name", "model.m", "optim.steps", "eval_every", "snapshot_steps",
                "checkpoint_every", "objective", "device"}
FFN_ONLY = ("model.ffn", "model.m")   # shown as "–" for runs without the FFN: they do not apply

OPT_GAP, NOT_BEFORE, HORIZON = 0.03, 100, 1000
DET_CEILING = 0.99
V_ONES_COS, WINDOW = 0.99, (100, 700)
H_VAR_ZERO = 1e-6
F11_PARENT, F11_COS = 0.9, 0.9
QA_HORIZON, QA1_ACC, QA2_CHANCE, QA2_TOL = 100, 0.95, 0.5, 0.1

LABELS = {"fig6a": "Fig. 6(a)", "fig6c": "Fig. 6(c)", "fig11": "Fig. 11", "fig12": "Fig. 12",
          "fig13": "Fig. 13", "fig10a": "Fig. 10(a)", "fig10c": "Fig. 10(c)"}
TEXT = {
    "fig6a": f"p = 0.5 first reaches OPT − {OPT_GAP:g} at a step in [{NOT_BEFORE}, {HORIZON}]",
    "fig6c": f"p = 1 stays below {DET_CEILING:g} test accuracy through step {HORIZON}",
    "fig11": f"p = 0.5 at step {HORIZON}: parent attention ≥ {F11_PARENT:g} and "
             f"cos(V, Πᵀ) ≥ {F11_COS:g}",
    "fig12": f"p = 1: cos(V, 1) ≥ {V_ONES_COS:g} at every snapshot in steps {WINDOW[0]}–"
             f"{WINDOW[1]}, < {V_ONES_COS:g} at step {HORIZON}",
    "fig13": f"p = 1: max_k Var(X·S)_k ≤ {H_VAR_ZERO:g} at every snapshot in steps {WINDOW[0]}–"
             f"{WINDOW[1]}",
    "fig10a": f"QA Task 1 with the FFN: test accuracy ≥ {QA1_ACC:g} at step {QA_HORIZON}",
    "fig10c": f"QA Task 2 with the FFN: |test accuracy − {QA2_CHANCE:g}| ≤ {QA2_TOL:g} at step "
              f"{QA_HORIZON}",
}
CLAIMS = tuple(LABELS)


# ---------------------------------------------------------------------------------------------
# which runs a claim is about

def _walk(run, p) -> bool:
    return run.get("data.name") == "random_walk" and run.get("data.p") == p


def _qa_ffn(run, task) -> bool:
    return run.get("data.name") == task and run.get("model.name") == "transformer_ffn"


SETTING = {"fig6a": lambda r: _walk(r, 0.5), "fig11": lambda r: _walk(r, 0.5),
           "fig6c": lambda r: _walk(r, 1.0), "fig12": lambda r: _walk(r, 1.0),
           "fig13": lambda r: _walk(r, 1.0),
           "fig10a": lambda r: _qa_ffn(r, "qa_majority"),
           "fig10c": lambda r: _qa_ffn(r, "qa_preference")}
NEEDS_SNAPSHOTS = {"fig12", "fig13"}


# ---------------------------------------------------------------------------------------------
# the claims, one run each: True, False, or None (the run cannot say)

def _first(hist, threshold):
    hit = hist.loc[hist["test_acc"] >= threshold, "step"]
    return int(hit.iloc[0]) if len(hit) else None


def _covers(hist, step) -> bool:
    return len(hist) > 0 and hist["step"].max() >= step


def fig6a(run, hist, snaps):
    hit = _first(hist, run["opt_acc"] - OPT_GAP)
    if hit is not None:
        return NOT_BEFORE <= hit <= HORIZON
    return False if _covers(hist, HORIZON) else None


def fig6c(run, hist, snaps):
    through = hist[hist["step"] <= HORIZON]
    if (through["test_acc"] >= DET_CEILING).any():
        return False
    return True if _covers(hist, HORIZON) else None


def fig11(run, hist, snaps):
    at = hist[hist["step"] == HORIZON]
    if not len(at) or at["v_pi_cosine"].isna().all():
        return None
    r = at.iloc[-1]
    return bool(r["parent_attention"] >= F11_PARENT and r["v_pi_cosine"] >= F11_COS)


def _window(snaps):
    """The snapshots from WINDOW[0] through WINDOW[1], or None when the run was not snapshotted
    that far (a run shorter than WINDOW[1] cannot say whether it stayed symmetric)."""
    if not len(snaps) or snaps["step"].max() < WINDOW[1]:
        return None
    w = snaps[snaps["step"].between(*WINDOW)]
    return w if len(w) else None


def ones_cosine(V) -> float:
    """cos(V, 1): Σ V_ij / (‖V‖_F · ‖1‖_F); 1 exactly when V = α·1 with α > 0."""
    V = np.asarray(V, dtype=float)
    norm = np.linalg.norm(V) * math.sqrt(V.size)
    return float(V.sum() / norm) if norm > 0 else math.nan


def fig12(run, hist, snaps):
    w = _window(snaps)
    if w is None:
        return None
    if not all(ones_cosine(V) >= V_ONES_COS for V in w["V"]):
        return False
    end = snaps[snaps["step"] == HORIZON]
    return ones_cosine(end["V"].iloc[-1]) < V_ONES_COS if len(end) else None


def fig13(run, hist, snaps):
    w = _window(snaps)
    if w is None or any(h is None or not np.size(h) for h in w["h_var"]):
        return None
    return bool(max(float(np.max(h)) for h in w["h_var"]) <= H_VAR_ZERO)


def fig10a(run, hist, snaps):
    if not _covers(hist, QA_HORIZON):
        return None
    return bool(hist.loc[hist["step"] <= QA_HORIZON, "test_acc"].iloc[-1] >= QA1_ACC)


def fig10c(run, hist, snaps):
    if not _covers(hist, QA_HORIZON):
        return None
    acc = hist.loc[hist["step"] <= QA_HORIZON, "test_acc"].iloc[-1]
    return bool(abs(acc - QA2_CHANCE) <= QA2_TOL)


JUDGE = {"fig6a": fig6a, "fig6c": fig6c, "fig11": fig11, "fig12": fig12, "fig13": fig13,
         "fig10a": fig10a, "fig10c": fig10c}


# ---------------------------------------------------------------------------------------------
# runs -> scores -> the table

def reading_runs(runs: pd.DataFrame) -> pd.DataFrame:
    if "experiment" not in runs.columns:
        return runs.iloc[:0]
    return runs[runs["experiment"].isin(READING_EXPERIMENTS)]


def score_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One column per claim, aligned with `runs`: 1.0 (holds), 0.0 (does not), NaN (the run is
    not of the claim's setting, or cannot say)."""
    out = pd.DataFrame(np.nan, index=runs.index, columns=list(CLAIMS))
    if not len(runs):
        return out
    hist = load_history(runs)
    hist = {p: h.sort_values("step") for p, h in hist.groupby("path")} if len(hist) else {}
    wants = [i for i, r in runs.iterrows()
             if any(SETTING[c](r) for c in NEEDS_SNAPSHOTS) and r["status"] == "done"]
    snaps = load_snapshots(runs.loc[wants]) if wants else pd.DataFrame()
    snaps = {p: s.sort_values("step") for p, s in snaps.groupby("path")} if len(snaps) else {}
    empty = pd.DataFrame({"step": [], "test_acc": []})
    for i, run in runs.iterrows():
        for c in CLAIMS:
            if not SETTING[c](run):
                continue
            if run["status"] == "diverged":
                out.at[i, c] = 0.0
            elif run["status"] == "done":
                v = JUDGE[c](run, hist.get(run["path"], empty), snaps.get(run["path"], empty))
                out.at[i, c] = np.nan if v is None else float(v)
    return out


def reading_keys(runs: pd.DataFrame) -> list[str]:
    """The keys that tell readings apart: those that vary within one reading experiment's runs
    (a key that differs only between fig6_readings and fig10_readings, like data.K, is the task)."""
    keys = set()
    cfg = [k for k in config_keys(runs) if k not in SETTING_KEYS and not k.startswith("wandb.")]
    for _, sub in runs.groupby("experiment"):
        keys |= {k for k in cfg if _shown(sub, k).nunique(dropna=False) > 1}
    return sorted(keys, key=lambda k: (READING_KEYS.index(k) if k in READING_KEYS
                                       else len(READING_KEYS), k))


def _shown(runs, key) -> pd.Series:
    """A reading key as the table shows it: FFN-only keys are None for runs without the FFN."""
    s = runs[key].astype(object).where(runs[key].notna(), None)
    if key in FFN_ONLY and "model.name" in runs.columns:
        s = s.where(runs["model.name"] == "transformer_ffn", None)
    return s


def reading_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per reading of the reading experiments' runs: the reading keys, `runs`, `seeds`,
    per claim the fraction of runs it holds for (NaN: no run can say) and `n_<claim>` the runs
    scored, and `mean` over the claims with data. Best first."""
    runs = reading_runs(runs)
    cols = list(CLAIMS)
    if not len(runs):
        return pd.DataFrame(columns=["runs", "seeds", *cols, "mean"])
    keys = reading_keys(runs)
    scores = score_runs(runs)
    g = pd.DataFrame({k: _shown(runs, k) for k in keys}, index=runs.index)
    g = g.fillna("–").join(scores)   # "–": a key that does not apply, one group of its own
    g["seed"] = runs["seed"]
    parts = []
    for key, sub in (g.groupby(keys, sort=False) if keys else [((), g)]):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row.update(runs=len(sub), seeds=sub["seed"].nunique())
        for c in cols:
            row[c] = sub[c].mean()             # NaN when no run of the reading can say
            row[f"n_{c}"] = int(sub[c].notna().sum())
        parts.append(row)
    table = pd.DataFrame(parts)
    table["mean"] = table[cols].mean(axis=1)
    table["_claims"] = table[cols].notna().sum(axis=1)
    table = table.sort_values(["mean", "_claims"], ascending=False, na_position="last",
                              kind="stable").drop(columns="_claims").reset_index(drop=True)
    table.attrs["reading_keys"] = keys
    return table


def display(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the report shows it: keys formatted, claims as fractions or "–"."""
    keys = table.attrs.get("reading_keys", [c for c in table.columns if "." in c])
    out = pd.DataFrame({k: [v if isinstance(v, str) else axis_label(k, v) for v in table[k]]
                        for k in keys})
    out["seeds"] = table["seeds"]
    for c in (*CLAIMS, "mean"):
        out[LABELS.get(c, c)] = ["–" if v != v else f"{v:.2f}" for v in table[c]]
    return out


def to_markdown(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, df.columns)) + " |",
             "|" + "|".join("---" for _ in df.columns) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def legend() -> str:
    return "; ".join(f"{LABELS[c]}: {TEXT[c]}" for c in CLAIMS)


# ---------------------------------------------------------------------------------------------
# the claims register (docs/claims.md): a rate over seeds with its 95 % interval

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
PLATEAU = 0.5  # a run is on the unigram plateau at a step where its relative loss there exceeds this


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a rate of k successes in n trials (95 % by default): unlike the normal
    interval it stays inside [0, 1] and is not empty at k = 0 or k = n, which is where small seed counts
    sit. (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at k = 0 (k = n) the bound is 0 (1) exactly; the subtraction leaves rounding there
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def rate(k: int, n: int) -> str:
    """`k of n (lo–hi)`, the Wilson 95 % interval, as docs/claims.md writes a rate."""
    lo, hi = wilson(k, n)
    return f"{k} of {n} ({lo:.2f}–{hi:.2f})"


def plateau_table(hist: pd.DataFrame, steps, keys, threshold: float = PLATEAU) -> pd.DataFrame:
    """Makkuva et al.'s finding as a rate: per cell of `keys`, how many runs sit on the unigram plateau at
    each of `steps` (relative loss (test_loss − opt_loss)/(unigram_loss − opt_loss) > threshold at the
    history row of that step, the baselines as that row has them), with Wilson 95 % intervals. `hist` is
    `load_history(runs, columns=keys)` of the done runs. A run with no row at a step, or whose baselines
    there coincide (within 1e-3 nats, where relative_loss is null), is not counted at it."""
    rows = []
    for cell, sub in hist.groupby(list(keys), sort=True):
        row = dict(zip(keys, cell if isinstance(cell, tuple) else (cell,)))
        for t in steps:
            at = sub[sub["step"] == t]
            at = at[(at["unigram_loss"] - at["opt_loss"]).abs() > 1e-3]
            on = int(((at["test_loss"] - at["opt_loss"]) / (at["unigram_loss"] - at["opt_loss"]) > threshold).sum())
            lo, hi = wilson(on, len(at))
            row.update({f"on_{t}": on, f"n_{t}": len(at), f"lo_{t}": lo, f"hi_{t}": hi})
        rows.append(row)
    return pd.DataFrame(rows)
