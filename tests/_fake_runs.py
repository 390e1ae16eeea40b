"""Synthetic run folders that follow the README's results contract exactly, for analysis tests and benchmarks.

The numbers are made up but shaped like the paper's outcomes: zero init fails on deterministic
walks (p in {0, 1}: accuracy 1/K, uniform attention, V ∝ 1) and reaches OPT = max(p, 1-p)
otherwise (attention on the parent x_{N-1}, V -> Πᵀ).
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import yaml

from rw_sweeps.core.markov import Pi

# grid keys (Hydra dotted names) -> write_run keyword
KEYS = {"data.p": "p", "data.K": "K", "data.N": "N", "model.M": "M", "init": "init",
        "init.sigma": "sigma", "optim.lr": "lr", "optim.steps": "steps", "seed": "seed",
        "data.name": "data", "experiment": "experiment", "model.normalize": "normalize",
        "optim.reduction": "reduction", "optim.name": "optim", "model.ffn": "ffn", "model.name": "model",
        "model.pos_scale": "pos_scale", "precision": "precision", "data.n_train": "n_train"}
SNAPSHOT_STEPS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 400, 700, 1000]


def write_run(run_dir, *, p=0.5, K=6, N=97, M=1000, init="zero", sigma=0.0, lr=1.0, steps=10,
              seed=0, eps=0.1, data="random_walk", experiment=None, group="fake-sweep",
              status="done", acc=None, light=False, normalize=None, reduction="mean", optim="gd",
              ffn="after", model="transformer", pos_scale=1.0, precision="float64", n_train=1000,
              history=None, snapshots=None, summary=None) -> Path:
    """Write one run folder. `acc` overrides the final test accuracy; `light` writes a two-line
    history and no snapshots (for the 10,000-run benchmark). `history` / `snapshots` (lists of
    rows, missing metrics filled in) replace the made-up ones; the summary then reads the last
    history row, and `summary` overrides any of its fields. `normalize` defaults to the paper's
    protocol: whole with a Gaussian init, none with zero init."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed * 7919 + int(1000 * p) + K)
    rw = data == "random_walk"
    opt = max(p, 1 - p) if rw else 1.0
    # Thm 4.1: zero init cannot break the symmetry of a deterministic walk
    fails = (rw and init == "zero" and p in (0.0, 1.0)) or data == "qa_preference"
    final = acc if acc is not None else min(1.0, (1 / K if fails else opt) + rng.uniform(-0.03, 0.01))
    broke = None if fails else 2

    config = {
        # the steps its snapshots are at (the contract: the config's snapshot_steps up to the last step, and it)
        "seed": seed, "precision": precision, "eval_every": 1,
        "snapshot_steps": sorted({s["step"] for s in snapshots}) if snapshots is not None else SNAPSHOT_STEPS,
        "checkpoint_every": 0,
        "data": {"name": data, "K": K, "N": N, "p": p, "n_train": n_train, "n_test": 1000},
        "model": {"name": model, "M": M,
                  "normalize": normalize or ("none" if init == "zero" else "whole"), "pos": "sine",
                  "pos_denom": "M", "pos_scale": pos_scale,
                  "m": 19 if model == "transformer_ffn" else None, "ffn": ffn},
        "init": {"name": init, **({} if init == "zero" else {"sigma": sigma})},  # zero init has no σ
        "optim": {"name": optim, "lr": lr, "steps": steps, "eps": eps, "reduction": reduction,
                  "beta1": 0.9, "beta2": 0.999, "adam_eps": 1e-8},
        "wandb": {"mode": "offline", "project": "rw-sweeps", "group": group, "tags": []},
        "experiment": experiment,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def history_row(t):
        w = 1 - np.exp(-t / 2)
        return {
            "step": t, "train_loss": 2.3 * (1 - w) + 0.7, "test_loss": 2.3 * (1 - w) + 0.72,
            "test_acc": 1 / K + (final - 1 / K) * w if t < steps else final,
            "test_kl": 1.5 * (1 - w) + (1.2 if fails else 0.05),
            "parent_attention": 1 / N if fails else 1 / N + (0.99 - 1 / N) * w,
            "attention_spread": 0.0 if fails else 0.99 * w,
            "v_pi_cosine": (0.7 if fails else 0.5 + 0.49 * w) if rw else None,
            "pred_dist": 0.9 if fails else 0.9 * (1 - w),
        }

    if history is None:
        history = [history_row(t) for t in ([0, steps] if light else range(steps + 1))]
    else:                              # the caller's rows, any metric it leaves out as above
        history = [{**history_row(r["step"]), **r} for r in history]
    last = history[-1]
    fields = {
        "status": status, "error": None if status == "done" else "boom",
        "test_acc": last["test_acc"], "opt_acc": opt, "test_loss": last["test_loss"],
        "train_loss": last["train_loss"], "test_kl": last["test_kl"],
        "parent_attention": last["parent_attention"], "v_pi_cosine": last["v_pi_cosine"],
        "pred_dist": last["pred_dist"], "attention_spread": last["attention_spread"],
        "symmetry_break_step": broke, "steps": steps, "wall_s": 0.01, "p": p, "K": K, "N": N,
        "M": M, "model": model, "data": data, "init": init, "sigma": sigma, "lr": lr,
        "eps": eps, "seed": seed, "precision": precision, "run_id": f"{group}-{run.name}",
        "locked_position": None, "eval_step": last["step"],
    }
    if status == "failed":
        fields.update(test_acc=None, test_loss=None, test_kl=None)
    fields.update(summary or {})
    # the contract: a done run's summary reads its history's last row
    last.update({k: v for k, v in (summary or {}).items() if k in last and k != "step"})
    (run / "summary.json").write_text(json.dumps(fields))
    (run / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    if snapshots is not None:
        snaps = [{**_snapshot(s["step"], steps, K, N, p, fails, rng), **s} for s in snapshots]
    elif not light:
        snaps = [_snapshot(t, steps, K, N, p, fails, rng)
                 for t in sorted({s for s in SNAPSHOT_STEPS if s <= steps} | {steps})]
    if snapshots is not None or not light:
        (run / "snapshots.jsonl").write_text("".join(json.dumps(s) + "\n" for s in snaps))
    return run


def set_result(run_dir, **fields) -> None:
    """Rewrite a finished run's result as a rerun would: its summary's fields, and the same metrics in its
    history's last row (a summary alone edited breaks the contract: the run is then corrupt)."""
    run = Path(run_dir)
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    summary.update(fields)
    rows[-1].update({k: v for k, v in fields.items() if k in rows[-1] and k != "step"})
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _snapshot(t, steps, K, N, p, fails, rng):
    w = t / max(steps, 1)
    V = (np.ones((K, K)) / K if fails else Pi(K, p).T) * w + rng.normal(0, 1e-3, (K, K))
    attention = np.full(N, 1 / N)
    if not fails:
        attention *= 1 - w
        attention[N - 2] += w
    return {"step": t, "V": V.tolist(), "A": None, "attention": attention.tolist(),
            "h_example": np.full(K, 1 / K).tolist() if fails else np.eye(K)[0].tolist(),
            "h_var": np.zeros(K).tolist() if fails else rng.uniform(0, 0.1, K).tolist()}


def make_sweep(root, grid: dict, seeds=(0,), **fixed) -> list[Path]:
    """A Hydra-like sweep folder: multirun.yaml plus one numbered folder per grid point."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    keys = list(grid) + ["seed"]
    combos = list(itertools.product(*grid.values(), seeds))
    overrides = [f"{k}={','.join(map(str, v))}" for k, v in grid.items()]
    overrides.append(f"seed={','.join(map(str, seeds))}")
    (root / "multirun.yaml").write_text(yaml.safe_dump(
        {"hydra": {"mode": "MULTIRUN", "overrides": {"task": overrides}}}))
    runs = []
    for i, combo in enumerate(combos):
        kw = {**fixed, **{KEYS[k]: v for k, v in zip(keys, combo)}}
        runs.append(write_run(root / str(i), **kw))
    return runs
