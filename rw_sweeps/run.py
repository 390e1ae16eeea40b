"""run_batch(configs, run_dirs): the one path from validated configs to results on disk.

A single Hydra job is a batch of one; a packed chunk is a batch of many runs of one shape. Runs never
disturb each other: a run whose loss stops being finite is recorded as `diverged` at that step while the
others go on, and an exception in a batch is retried run by run so that only the culprit is `failed`.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data as data_mod
from . import engine, fused, model, results, tracking
from .config import RunConfig

BREAK_SPREAD = 1e-3  # attention spread above which Thm 4.1's symmetric point counts as broken


def init_generator(seed: int) -> torch.Generator:
    """Initial parameters get their own stream, so changing n_train or n_test leaves them unchanged."""
    return torch.Generator().manual_seed(seed + 2**32)


def shape_key(c: RunConfig) -> tuple:
    """Runs with equal keys can share one tensor program (everything else is per run)."""
    d, m = c.data, c.model
    return (c.device, d.name, d.K, d.N, d.n_train, d.n_test, m.name, m.M, m.m, m.normalize, m.pos, m.pos_denom,
            m.pos_scale, m.gram, c.optim.steps, c.precision, c.eval_every, tuple(c.snapshot_steps))


def run_id(run_dir: Path) -> str:
    """Deterministic per folder, so a re-run or requeued job continues the same wandb run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


@dataclass
class _Record:
    cfg: RunConfig
    run_dir: Path
    history: list
    snapshots: list
    status: str = "done"
    error: str | None = None
    break_step: int | None = None
    steps: int = 0


def run_batch(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None) -> list[dict]:
    """Train every run, write each run's folder, log each to wandb; return the summaries."""
    if not cfgs:
        return []
    keys = {shape_key(c) for c in cfgs}
    if len(keys) > 1:
        raise ValueError("run_batch needs runs of one shape; group them with rw_sweeps.run.shape_key first")
    t0 = time.time()
    resumed = [load_checkpoint(c, d) for c, d in zip(cfgs, run_dirs)]
    for d, b in zip(run_dirs, resumed):
        if b is not None:
            print(f"resuming {d} from its checkpoint at step {b['state']['step']}", flush=True)
    step = [b["state"]["step"] if b else 0 for b in resumed]
    if len(set(step)) > 1:  # runs checkpointed at different steps continue as separate batches
        return _per_group(cfgs, run_dirs, step, progress)
    try:
        records = _train(cfgs, [Path(d) for d in run_dirs], progress, resumed if all(resumed) else None)
    except Exception as exc:  # noqa: BLE001 - isolate the culprit, never lose the others
        if len(cfgs) > 1:
            return [s for c, d in zip(cfgs, run_dirs) for s in run_batch([c], [d], progress=False)]
        rec = _Record(cfgs[0], Path(run_dirs[0]), [], [], "failed", _one_line(exc))
        traceback.print_exc(file=sys.stderr)
        records = [rec]
    wall = (time.time() - t0) / len(cfgs)
    entries = []
    for rec in records:
        summary = _summary(rec, wall)
        cfg_dict = rec.cfg.to_dict()
        results.write_run(rec.run_dir, cfg_dict, rec.history, rec.snapshots)
        entries.append({"cfg": cfg_dict, "run_dir": rec.run_dir, "run_id": summary["run_id"],
                        "history": rec.history, "summary": summary})
    try:  # before the summaries: a job stopped while logging is not yet "done", and logs again when resumed
        tracking.log_runs(entries)
    except Exception as exc:  # noqa: BLE001 - the local results are the source of truth
        print(f"warning: wandb logging failed: {_one_line(exc)}", file=sys.stderr)
    for e in entries:
        results.write_summary(e["run_dir"], e["summary"])
        (e["run_dir"] / CHECKPOINT).unlink(missing_ok=True)  # the finished results supersede it
    return [e["summary"] for e in entries]


def done_summary(c: RunConfig, run_dir: Path) -> dict | None:
    """The run folder's summary if it says `done` for exactly this config, else None."""
    s = results.read_summary(run_dir)
    if s is not None and s.get("status") == "done" and results.same_run(results.read_config(run_dir), c.to_dict()):
        return s
    return None


def is_done(c: RunConfig, run_dir: Path) -> bool:
    return done_summary(c, run_dir) is not None


def execute(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None) -> list[dict]:
    """run_batch for the runs not already done: a re-run sweep skips every run whose folder holds a
    `done` summary for the same config, and trains the rest (resume after a crash or a kill)."""
    todo, out = [], {}
    for i, (c, d) in enumerate(zip(cfgs, run_dirs)):
        s = done_summary(c, d)
        if s is not None:
            out[i] = {**s, "skipped": True}
        else:
            todo.append(i)
    if todo:
        sub = _per_group([cfgs[i] for i in todo], [run_dirs[i] for i in todo], [shape_key(cfgs[i]) for i in todo],
                         progress)
        out.update(zip(todo, sub))
    return [out[i] for i in range(len(cfgs))]


def _per_group(cfgs: list[RunConfig], run_dirs: list[Path], keys: list, progress) -> list[dict]:
    """run_batch on each group of runs with equal keys; the summaries come back in the input order."""
    groups: dict = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out: dict[int, dict] = {}
    for idx in groups.values():
        out.update(zip(idx, run_batch([cfgs[i] for i in idx], [run_dirs[i] for i in idx], progress)))
    return [out[i] for i in range(len(cfgs))]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()


def _stack_data(splits: list[data_mod.Split], dtype, device) -> engine.Batch:
    return engine.Batch(torch.stack([s.tokens for s in splits]).to(device), torch.stack([s.y for s in splits]).to(device),
                        torch.stack([s.P_true for s in splits]).to(device, dtype))


def initial_state(cfgs: list[RunConfig], geo: model.Geometry, dtype) -> engine.State:
    c0 = cfgs[0]
    K, N = c0.data.K, c0.data.N
    params, ac = [], []
    for c in cfgs:
        if c.init.name == "zero":
            if c.model.name == "transformer_ffn":
                p = {"A": torch.zeros(K, c.model.m, dtype=dtype), "V": torch.zeros(c.model.m, K, dtype=dtype)}
            else:
                p = {"V": torch.zeros(K, K, dtype=dtype)}
            params.append(p)
            ac.append((torch.zeros(K, dtype=dtype), torch.zeros(N, dtype=dtype)))
        else:
            p = model.init_dense(c.model, K, c.init.sigma, init_generator(c.seed), dtype)
            W = p.pop("W")
            params.append(p)
            ac.append(model.compact(W, c.model, K, N, geo))
    return engine.init_state(params, ac)


def device_of(c: RunConfig) -> torch.device:
    if c.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(c.device)


CHECKPOINT = "checkpoint.pt"


def _save_checkpoint(rec: _Record, state: engine.State, r: int) -> None:
    """Everything needed to continue run r exactly: its state after `state.step` steps and its records."""
    path = rec.run_dir / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{CHECKPOINT}.{os.getpid()}.tmp")
    blob = {"config": rec.cfg.to_dict(), "state": engine.run_slice(state, r), "history": rec.history,
            "snapshots": rec.snapshots, "status": rec.status, "error": rec.error, "break_step": rec.break_step,
            "steps": rec.steps}
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_checkpoint(c: RunConfig, run_dir: Path) -> dict | None:
    """A run's checkpoint if it exists and belongs to this exact config (else it is ignored)."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - a torn or foreign file: start over
        return None
    return blob if results.same_run(blob.get("config"), c.to_dict()) else None


def _train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None,
           resumed: list[dict] | None = None) -> list[_Record]:
    c0 = cfgs[0]
    dtype, dev = getattr(torch, c0.precision), device_of(c0)
    T, K = c0.optim.steps, c0.data.K
    geo = model.geometry(c0.model, c0.data.N)
    splits = [data_mod.make(c.data, c.seed) for c in cfgs]
    train_set = _stack_data([s[0] for s in splits], dtype, dev)
    test_set = _stack_data([s[1] for s in splits], dtype, dev)
    recs = [_Record(c, d, [], []) for c, d in zip(cfgs, run_dirs)]
    if resumed:
        state = engine.stack_slices([b["state"] for b in resumed])
        for rec, b in zip(recs, resumed):
            rec.history, rec.snapshots, rec.status, rec.error = b["history"], b["snapshots"], b["status"], b["error"]
            rec.break_step, rec.steps = b["break_step"], b["steps"]
    else:
        state = initial_state(cfgs, geo, dtype)
    state = engine.to(state, dev)
    lr = torch.tensor([c.optim.lr for c in cfgs], dtype=dtype, device=dev)
    eps = torch.tensor([c.optim.eps for c in cfgs], dtype=dtype, device=dev)
    w = torch.tensor([1.0 / c.data.n_train if c.optim.reduction == "mean" else 1.0 for c in cfgs], dtype=dtype,
                     device=dev)
    PiT = None
    if c0.data.name == "random_walk" and c0.model.name == "transformer":
        PiT = torch.stack([data_mod.Pi(K, c.data.p, dtype).T for c in cfgs]).to(dev)
    snap_steps = {s for s in c0.snapshot_steps if s <= T} | {T}
    if progress is None:
        progress = sys.stderr.isatty() and not os.environ.get("CI")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=T, initial=state.step, desc=f"{len(cfgs)} run(s)", unit="step", leave=False)
    alive = torch.tensor([rec.status == "done" for rec in recs], device=dev)
    for t in range(state.step, T + 1):
        evaluating = t % c0.eval_every == 0 or t == T
        # fused.*: the compiled kernel where it applies (eq. 2.1, exact Gram, CPU), else engine.* itself
        probe = fused.evaluate(state, test_set, eps, geo) if evaluating else None
        # θ at step t; a and c are what W's relevant blocks reduce to: z_bj = (a[s_bj] + c_j)/ν
        params = {**state.params, "a": state.a, "c": state.c} if evaluating else None
        params = {k: v.clone() for k, v in params.items()} if evaluating else None
        loss = fused.train_step(state, train_set, lr, eps, w, geo) if t < T else fused.evaluate(state, train_set, eps, geo).loss
        finite = torch.isfinite(loss) & torch.isfinite(state.a).all(1) & torch.isfinite(state.c).all(1)
        for v in state.params.values():
            finite &= torch.isfinite(v).flatten(1).all(1)
        if probe is not None:
            _record(recs, alive, t, loss, probe, params, PiT, t in snap_steps)
        newly = alive & ~finite
        for r in newly.nonzero().flatten().tolist():
            recs[r].status, recs[r].steps = "diverged", t
            recs[r].error = f"non-finite loss or parameters at step {t}"
        alive &= finite
        for r in alive.nonzero().flatten().tolist():
            recs[r].steps = t
        if bar is not None and t < T:
            bar.update(1)
        if c0.checkpoint_every and t < T and (t + 1) % c0.checkpoint_every == 0:
            for r, rec in enumerate(recs):
                _save_checkpoint(rec, state, r)
    if bar is not None:
        bar.close()
    return recs


def _record(recs, alive, t, loss, probe: engine.Probe, params: dict, PiT, snapshot: bool) -> None:
    cos = None
    if PiT is not None:
        V = params["V"]
        cos = ((V * PiT).sum((1, 2)) / (V.norm(dim=(1, 2)) * PiT.norm(dim=(1, 2))).clamp_min(1e-300)).tolist()
    cols = {"train_loss": loss.tolist(), "test_loss": probe.loss.tolist(), "test_acc": probe.acc.tolist(),
            "test_kl": probe.kl.tolist(), "parent_attention": probe.attention[:, -2].tolist(),
            "attention_spread": probe.spread.tolist(), "pred_dist": probe.pred_dist.tolist()}
    if snapshot:
        att, hx, hv = probe.attention.tolist(), probe.h_example.tolist(), probe.h_var.tolist()
        Vs, a, c = params["V"].tolist(), params["a"].tolist(), params["c"].tolist()
        As = params["A"].tolist() if "A" in params else None
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


def _summary(rec: _Record, wall: float) -> dict:
    c = rec.cfg
    last = rec.history[-1] if rec.history else {}
    metrics = ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention", "v_pi_cosine",
               "pred_dist", "attention_spread")
    return {
        "status": rec.status, "error": rec.error,
        **{k: last.get(k) for k in metrics},
        "opt_acc": c.opt_acc, "symmetry_break_step": rec.break_step, "steps": rec.steps,
        "wall_s": round(wall, 6),
        "p": c.data.p, "K": c.data.K, "N": c.data.N, "M": c.model.M, "model": c.model.name, "data": c.data.name,
        "init": c.init.name, "sigma": c.init.sigma, "lr": c.optim.lr, "eps": c.optim.eps, "seed": c.seed,
        "precision": c.precision, "run_id": run_id(rec.run_dir),
    }


def one_line(summary: dict) -> str:
    """The line `python launch.py` prints for a run."""
    s = summary
    if s["status"] != "done":
        return f"{s['status']}: p={s['p']} init={s['init']} seed={s['seed']}: {s['error']}"
    fmt = lambda x: "null" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"  # noqa: E731
    return (f"done: p={s['p']} K={s['K']} N={s['N']} init={s['init']} seed={s['seed']} steps={s['steps']} "
            f"test_acc={fmt(s['test_acc'])} (OPT {s['opt_acc']:.3f}) parent_attention={fmt(s['parent_attention'])} "
            f"v_pi_cosine={fmt(s['v_pi_cosine'])} kl={fmt(s['test_kl'])} break_step={s['symmetry_break_step']}")
