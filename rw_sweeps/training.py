"""The training loop, top to bottom: R runs of one shape from their configs to their records.

data → initial state (or a checkpoint) → for t = 0 … T: evaluate (every `eval_every` steps), take a GD
step, check finiteness → records (history rows, snapshots, status). Nothing here writes a result file
but checkpoints: `rw_sweeps.run` turns the records into run folders. Runs never disturb each other: a run
whose loss or parameters stop being finite is `diverged` at that step while the others go on.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import data as data_mod
from . import engine, fused, model, results
from .config import RunConfig

BREAK_SPREAD = 1e-3  # attention spread above which Thm 4.1's symmetric point counts as broken


def shape_key(cfg: RunConfig) -> tuple:
    """Runs with equal keys can share one tensor program (everything else is per run)."""
    d, m = cfg.data, cfg.model
    return (cfg.device, d.name, d.K, d.N, d.n_train, d.n_test, m.name, m.M, m.m, m.normalize, m.pos, m.pos_denom,
            m.pos_scale, m.gram, cfg.optim.steps, cfg.precision, cfg.eval_every, tuple(cfg.snapshot_steps))


def group_by(items: list, key) -> dict:
    """{key(item): [indices of the items with that key]}, in first-seen order (the one grouping helper)."""
    groups: dict = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item), []).append(i)
    return groups


@dataclass
class Record:
    """What one run produced: its history rows, snapshots, status and the step it stopped at."""
    cfg: RunConfig
    run_dir: Path
    history: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    status: str = "done"
    error: str | None = None
    break_step: int | None = None
    steps: int = 0


def device_of(cfg: RunConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def stack_data(splits: list[data_mod.Split], dtype, device) -> engine.Batch:
    return engine.Batch(torch.stack([s.tokens for s in splits]).to(device), torch.stack([s.y for s in splits]).to(device),
                        torch.stack([s.P_true for s in splits]).to(device, dtype))


def initial_state(cfgs: list[RunConfig], geo: model.Geometry, dtype) -> engine.State:
    """V(0), A(0) and the compact a(0), c(0) of W(0) for every run (zero, or the dense Gaussian draw)."""
    K, N = cfgs[0].data.K, cfgs[0].data.N
    params, ac = [], []
    for cfg in cfgs:
        if cfg.init.name == "zero":
            m = cfg.model.m
            params.append({"A": torch.zeros(K, m, dtype=dtype), "V": torch.zeros(m, K, dtype=dtype)}
                          if cfg.model.is_ffn else {"V": torch.zeros(K, K, dtype=dtype)})
            ac.append((torch.zeros(K, dtype=dtype), torch.zeros(N, dtype=dtype)))
        else:
            theta = model.init_dense(cfg.model, K, cfg.init.sigma, model.init_generator(cfg.seed), dtype)
            W = theta.pop("W")
            params.append(theta)
            ac.append(model.compact(W, cfg.model, K, N, geo))
    return engine.init_state(params, ac)


def train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
          resumed: list[dict] | None = None) -> list[Record]:
    """Train R runs of one shape (optionally from their checkpoints) and return their records."""
    c0 = cfgs[0]
    dtype, dev = getattr(torch, c0.precision), device_of(c0)
    T = c0.optim.steps
    geo = model.geometry(c0.model, c0.data.N)
    splits = [data_mod.make(cfg.data, cfg.seed) for cfg in cfgs]
    train_set = stack_data([s[0] for s in splits], dtype, dev)
    test_set = stack_data([s[1] for s in splits], dtype, dev)
    recs = [Record(cfg, d) for cfg, d in zip(cfgs, run_dirs)]
    if resumed:
        state = engine.stack_slices([b["state"] for b in resumed])
        for rec, b in zip(recs, resumed):
            rec.history, rec.snapshots, rec.status, rec.error = b["history"], b["snapshots"], b["status"], b["error"]
            rec.break_step, rec.steps = b["break_step"], b["steps"]
    else:
        state = initial_state(cfgs, geo, dtype)
    state = engine.to(state, dev)
    lr = torch.tensor([cfg.optim.lr for cfg in cfgs], dtype=dtype, device=dev)
    eps = torch.tensor([cfg.optim.eps for cfg in cfgs], dtype=dtype, device=dev)
    w = torch.tensor([1.0 / cfg.data.n_train if cfg.optim.reduction == "mean" else 1.0 for cfg in cfgs],
                     dtype=dtype, device=dev)
    PiT = None  # V's limit Πᵀ (Thm 3.1), for eq. 2.1 on random walks
    if c0.data.name == "random_walk" and not c0.model.is_ffn:
        PiT = torch.stack([data_mod.Pi(c0.data.K, cfg.data.p, dtype).T for cfg in cfgs]).to(dev)
    snap_steps = {s for s in c0.snapshot_steps if s <= T} | {T}
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=T, initial=state.step, desc=f"{len(cfgs)} run(s)", unit="step", leave=False)
    # Without a terminal (CI, a SLURM log) a long batch says where it is every PROGRESS_S seconds.
    ticker = _Ticker(len(cfgs), state.step, T) if bar is None else None
    stop = _SaveOnSignal()  # SLURM's USR2 (preemption, time limit), SIGTERM, Ctrl-C: checkpoint, then go on
    with stop:
        alive = torch.tensor([rec.status == "done" for rec in recs], device=dev)
        for t in range(state.step, T + 1):
            evaluating = t % c0.eval_every == 0 or t == T
            # fused.*: the compiled kernel where it applies (eq. 2.1, exact Gram, CPU), else engine.* itself
            probe = fused.evaluate(state, test_set, eps, geo, PiT) if evaluating else None
            # θ at step t; a and c are what W's relevant blocks reduce to: z_bj = (a[s_bj] + c_j)/ν
            theta = {k: v.clone() for k, v in {**state.params, "a": state.a, "c": state.c}.items()} if evaluating else None
            if t < T:
                loss = fused.train_step(state, train_set, lr, eps, w, geo)
            else:
                loss = fused.evaluate(state, train_set, eps, geo).loss
            finite = torch.isfinite(loss) & torch.isfinite(state.a).all(1) & torch.isfinite(state.c).all(1)
            for v in state.params.values():
                finite &= torch.isfinite(v).flatten(1).all(1)
            if probe is not None:
                _record(recs, alive, t, loss, probe, theta, t in snap_steps)
            newly = alive & ~finite
            for r in newly.nonzero().flatten().tolist():
                recs[r].status, recs[r].steps = "diverged", t
                recs[r].error = f"non-finite loss or parameters at step {t}"
            alive &= finite
            for r in alive.nonzero().flatten().tolist():
                recs[r].steps = t
            if bar is not None and t < T:
                bar.update(1)
            elif ticker is not None:
                ticker(t)
            if t < T and ((c0.checkpoint_every and (t + 1) % c0.checkpoint_every == 0) or stop.pending):
                for r, rec in enumerate(recs):
                    results.save_checkpoint(rec.run_dir, checkpoint(rec, state, r))
                stop.deliver()  # the signal's own handler now: submitit requeues, Ctrl-C interrupts, …
    if bar is not None:
        bar.close()
    return recs


PROGRESS_S = float(os.environ.get("RW_SWEEPS_PROGRESS_S", 30))  # seconds between progress lines in logs
SAVE_SIGNALS = tuple(getattr(signal, n) for n in ("SIGUSR2", "SIGTERM", "SIGINT") if hasattr(signal, n))


class _SaveOnSignal:
    """Defers USR2 (SLURM's warning before a preemption or the time limit; submitit requeues on it), SIGTERM
    and SIGINT to the end of the current step, where every run is checkpointed; then the signal's own
    handler runs (submitit's requeue, Ctrl-C's KeyboardInterrupt, the default exit). A preempted or
    interrupted batch so loses at most one step per run, even with checkpoint_every=0."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.previous: dict[int, object] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SAVE_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # an ignored signal stays ignored
                    self.previous[sig] = signal.signal(sig, lambda signum, frame: self.pending.append(signum))
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def deliver(self) -> None:
        if not self.pending:
            return
        signum, self.pending[:] = self.pending[0], []
        handler = self.previous.get(signum)
        print(f"rw_sweeps: signal {signal.Signals(signum).name}: every run checkpointed", file=sys.stderr, flush=True)
        if callable(handler):
            handler(signum, None)  # may raise (KeyboardInterrupt) or exit (submitit's requeue)
        elif handler == signal.SIG_DFL:
            self.__exit__()
            os.kill(os.getpid(), signum)


class _Ticker:
    """A progress line at a steady interval, for logs (no terminal, so no progress bar)."""

    def __init__(self, runs: int, start: int, T: int):
        self.runs, self.start, self.T = runs, start, T
        self.t0 = self.last = time.monotonic()
        print(f"training {runs} run(s): step {start} → {T}", flush=True)

    def __call__(self, t: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_S or t >= self.T:
            return
        self.last = now
        done = max(t - self.start, 1)
        left = (now - self.t0) / done * (self.T - t)
        print(f"training {self.runs} run(s): step {t}/{self.T} ({100 * t / self.T:.0f} %), "
              f"{now - self.t0:.0f} s so far, ~{left:.0f} s left", flush=True)


def checkpoint(rec: Record, state: engine.State, r: int) -> dict:
    """Everything needed to continue run r exactly: its state after `state.step` steps and its records."""
    return {"config": rec.cfg.to_dict(), "state": engine.run_slice(state, r), "history": rec.history,
            "snapshots": rec.snapshots, "status": rec.status, "error": rec.error, "break_step": rec.break_step,
            "steps": rec.steps}


def _record(recs: list[Record], alive, t: int, loss, probe: engine.Probe, theta: dict, snapshot: bool) -> None:
    """One history row per live run (and a snapshot at the snapshot steps), from the step's probe."""
    cols = {"train_loss": loss.tolist(), "test_loss": probe.loss.tolist(), "test_acc": probe.acc.tolist(),
            "test_kl": probe.kl.tolist(), "parent_attention": probe.parent_attention.tolist(),
            "attention_spread": probe.spread.tolist(), "pred_dist": probe.pred_dist.tolist()}
    cos = probe.v_pi_cosine.tolist() if probe.v_pi_cosine is not None else None
    if snapshot:
        att, hx, hv = probe.attention.tolist(), probe.h_example.tolist(), probe.h_var.tolist()
        Vs, a, c = theta["V"].tolist(), theta["a"].tolist(), theta["c"].tolist()
        As = theta["A"].tolist() if "A" in theta else None
    for r, rec in enumerate(recs):
        if not alive[r]:
            continue
        row = {"step": t, **{k: v[r] for k, v in cols.items()}, "v_pi_cosine": cos[r] if cos else None}
        rec.history.append(row)
        if rec.break_step is None and row["attention_spread"] > BREAK_SPREAD:
            rec.break_step = t
        if snapshot:
            rec.snapshots.append({"step": t, "V": Vs[r], "A": As[r] if As else None, "a": a[r], "c": c[r],
                                  "attention": att[r], "h_example": hx[r], "h_var": hv[r]})


METRICS = ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention", "v_pi_cosine", "pred_dist",
           "attention_spread")


def _finite(row: dict) -> bool:
    """Every metric of a history row is a finite number (cos(V, Πᵀ) may be undefined: QA data, the FFN)."""
    for k in METRICS:
        v = row.get(k)
        if v is None and k == "v_pi_cosine":
            continue
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            return False
    return True


def summary(rec: Record, wall: float) -> dict:
    """summary.json of a run (README, "Results"): its last evaluation whose every metric is finite (for a
    diverged run, the last one before it diverged; `eval_step` names it), the outcome and the run's keys."""
    cfg = rec.cfg
    last = next((row for row in reversed(rec.history) if _finite(row)), {})
    return {
        "status": rec.status, "error": rec.error,
        **{k: last.get(k) for k in METRICS}, "eval_step": last.get("step"),
        "opt_acc": cfg.opt_acc, "symmetry_break_step": rec.break_step, "steps": rec.steps,
        "wall_s": round(wall, 6),
        "p": cfg.data.p, "K": cfg.data.K, "N": cfg.data.N, "M": cfg.model.M, "model": cfg.model.name,
        "data": cfg.data.name, "init": cfg.init.name, "sigma": cfg.init.sigma, "lr": cfg.optim.lr,
        "eps": cfg.optim.eps, "seed": cfg.seed, "precision": cfg.precision, "run_id": results.run_id(rec.run_dir),
    }
