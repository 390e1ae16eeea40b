"""The metrics, defined once: what an evaluation measures, what a history row and the summary hold, and
which summary fields a task may return as its objective (`objective=...`, e.g. for Optuna)."""

import math

# What the engine's evaluation of the test set measures, in the order of its rows (engine.evaluate).
EVALUATED = ("test_loss", "test_acc", "test_kl", "parent_attention", "attention_spread", "pred_dist", "v_pi_cosine")
# A history row: the step, the training loss at it, and every evaluated metric (v_pi_cosine null where V has
# no Π to be compared with: the QA tasks, higher-order and in-context chains, the FFN).
HISTORY = ("step", "train_loss", *EVALUATED)
# The summary holds each metric's value at the last evaluated step.
LAST = ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention", "v_pi_cosine", "pred_dist",
        "attention_spread")
# model=gpt (rw_sweeps.core.gpt.training): its evaluation (attn_parent and induction per layer and head), a
# history row (with the two baselines of the data family), and its summary's metrics.
GPT_EVALUATED = ("test_loss", "test_acc", "test_kl", "kl_uniform", "kl_unigram", "kl_bigram", "parent_attention",
                 "attention_spread", "attn_parent", "induction")
GPT_HISTORY = ("step", "train_loss", *GPT_EVALUATED, "opt_loss", "unigram_loss")
GPT_LAST = ("test_acc", "test_loss", "train_loss", "test_kl", "opt_loss", "unigram_loss", "kl_uniform", "kl_unigram",
            "kl_bigram", "parent_attention", "attention_spread", "attn_parent", "induction")
# Summary fields a task can return as its objective.
OBJECTIVES = (*LAST, "symmetry_break_step", "steps", "wall_s", "opt_loss", "unigram_loss", "relative_loss",
              "kl_uniform", "kl_unigram", "kl_bigram")

# The success rule (paper §5): a run succeeds when it is done and its test accuracy is within `tol` of OPT.
# It is `acc >= OPT - tol`, not |acc - OPT| <= tol: a finite test set can score above OPT. The analysis's
# phase diagrams and the adaptive sweeper's `metric=success` both read it from here.
SUCCESS_TOL = 0.02


def succeeded(summary: dict, tol: float = SUCCESS_TOL) -> bool:
    """Did the run with this (contract-checked) summary succeed?"""
    acc, opt = summary.get("test_acc"), summary.get("opt_acc")
    return summary.get("status") == "done" and acc is not None and opt is not None and acc >= opt - tol


SUCCESS = "success"


def metric_value(summary: dict, metric: str, tol: float = SUCCESS_TOL) -> float | None:
    """A finished run's value of a metric a sweep learns (the adaptive sweeper's and its diagram's): for
    `success`, 1 or 0 (a failed or diverged run did not succeed); for a summary field, its value if the run
    is done and the value is a finite number, else None. A step that never came (a symmetry break) is the
    run's step budget: it did not come within it."""
    if metric == SUCCESS:
        return 1.0 if succeeded(summary, tol) else 0.0
    if summary.get("status") != "done":
        return None
    v = summary.get(metric)
    if v is None and metric.endswith("_step"):
        v = summary.get("steps")
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None
