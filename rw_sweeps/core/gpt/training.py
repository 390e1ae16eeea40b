"""model=gpt's training loop: R runs of one shape from their configs to their records, by autograd.

data (the fixed training set, or with data.online a fresh batch per step from the run's step stream) →
initial parameters (or a checkpoint) → for t = 0 … T: the loss and gradients at θ_t, an evaluation of the
fixed test set every `eval_every` steps, the update → records. Evaluation, snapshots and checkpoints sit on
absolute steps, and the batch of step t is a function of (seed, t) only, so a resumed run equals an
uninterrupted one bit for bit. A run whose loss or gradients stop being finite is `diverged` at that step,
its parameters frozen, while the others go on.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from .. import allocator, data as data_mod
from .. import results
from ..config import RunConfig
from ..metrics import GPT_EVALUATED, GPT_LAST
from ..loop import BREAK_SPREAD, Record, SaveOnSignal, Ticker, device_of
from ..training import bayes_test_acc, parent_positions
from . import model, strategies
from .schema import SNAPSHOT_MAP_MAX_T
from .optim import Optimiser

STEP_STREAM = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9)  # (seed, t) ↦ the generator seed of step t's batch
RELATIVE_MIN_GAP = 1e-3  # nats between unigram_loss and opt_loss below which relative_loss is null


def step_seed(seed: int, t: int) -> int:
    """The seed of the online batch of step t of a run: a mix of (seed, t) that is never a run's own data
    seed s for t ≥ 0 in practice (an odd multiplier and an offset), so the test set is not a training batch."""
    a, b = STEP_STREAM
    return (seed * a + (t + 1) * b) % 2**63


def _inputs(tokens: torch.Tensor, cfg: RunConfig) -> torch.Tensor:
    """The model's input positions: s_1 … s_{N−1}, and the blank query (token K) with model.query=blank."""
    if cfg.model.query == "blank":
        blank = torch.full_like(tokens[..., :1], cfg.data.K)
        return torch.cat([tokens, blank], -1)
    return tokens


def _targets(tokens: torch.Tensor, y: torch.Tensor, target: str) -> torch.Tensor:
    """(R, n, P) the tokens predicted at the positions read."""
    return y[..., None] if target == "last" else torch.cat([tokens[..., 1:], y[..., None]], -1)


class Batch:
    """Inputs and targets of R runs (R, n, ·) on the device."""

    def __init__(self, tokens: torch.Tensor, y: torch.Tensor, cfg: RunConfig, device):
        self.x = _inputs(tokens, cfg).to(device)
        self.y = _targets(tokens, y, cfg.data.target).to(device)


class TestSet(Batch):
    """The fixed test set with everything an evaluation compares the model with (R, n, P, K each)."""

    def __init__(self, split: data_mod.Split, cfgs: list[RunConfig], dtype, device):
        super().__init__(split.tokens, split.y, cfgs[0], device)
        d0 = cfgs[0].data
        K, target = d0.K, d0.target
        seq = torch.cat([split.tokens, split.y[..., None]], -1).numpy()
        law, uni, bi, base = [], [], [], []
        for r, cfg in enumerate(cfgs):
            law.append(strategies.laws(cfg.data, seq[r], cfg.seed, split.P_true[r].double().numpy()))
            u, b = strategies.in_context(seq[r], K, cfg.data.smoothing, target)
            uni.append(u)
            bi.append(b)
            pi = cfg.data.stationary(cfg.seed)
            base.append(u if pi is None else np.broadcast_to(pi, u.shape))
        as_t = lambda xs: torch.from_numpy(np.stack(xs)).to(device, dtype)  # noqa: E731
        self.P_true, self.unigram, self.bigram, self.baseline = as_t(law), as_t(uni), as_t(bi), as_t(base)
        # (R, T, P): the parents' key positions of each query row, and their weights (1; 0: padding)
        self.parent_index, self.parent_weight = _as_indices(_parent_mask(cfgs, self.x.shape[-1], dtype, device))
        self.prev = _previous(self.x if cfgs[0].model.query == "none" else self.x[..., :-1])
        # (R, n, T): the key an induction head at position i attends to, prev(i) + 1, or −1 (none; the blank query)
        anchor = torch.where(self.prev >= 0, self.prev + 1, -1)
        self.anchor = torch.nn.functional.pad(anchor, (0, self.x.shape[-1] - anchor.shape[-1]), value=-1)


def _parent_mask(cfgs: list[RunConfig], T: int, dtype, device) -> torch.Tensor:
    """(R, T, T): row i marks the keys that are parents of what the query at input position i predicts:
    the token at 1-based position t + 2, t = i (query=none) or i − 1 (the blank query); all 0 for the QA
    tasks. Runs with the same parents share one row block."""
    shift = 1 if cfgs[0].model.query == "blank" else 0
    blocks: dict = {}
    out = []
    for cfg in cfgs:
        of = cfg.data.parents_of(cfg.seed)
        key = None if of is None else tuple(map(tuple, of))
        if key not in blocks:
            m = np.zeros((T, T))
            for i in range(T):
                predicted = i - shift + 2  # 1-based
                if of is not None and 2 <= predicted <= len(of):
                    for j in of[predicted - 1]:
                        m[i, j - 1] = 1.0
            blocks[key] = torch.from_numpy(m)
        out.append(blocks[key])
    return torch.stack(out).to(device, dtype)


def _as_indices(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (R, T, T) 0/1 mask as (R, T, P) column indices and weights (1, or 0 where a row has fewer than P)."""
    P = max(1, int(mask.sum(-1).amax()))
    weight, index = mask.topk(P, dim=-1)  # the 1s first
    return torch.where(weight > 0, index, 0), weight


def _previous(x: torch.Tensor) -> torch.Tensor:
    """(R, n, T): for each position i the last j < i with x_j = x_i, or −1 (the induction score's anchor). One
    pass over the positions with the last position of each token so far: no T × T comparison is held (at 64
    test sequences of 1,024 tokens that was 512 MiB a run)."""
    flat = x.reshape(-1, x.shape[-1]).cpu().numpy().astype(np.int64)  # (R·n, T), tokens 0 … K (the blank)
    rows = np.arange(flat.shape[0])
    last = np.full((flat.shape[0], int(flat.max(initial=0)) + 1), -1, np.int64)
    out = np.empty_like(flat)
    for i in range(flat.shape[1]):
        out[:, i] = last[rows, flat[:, i]]
        last[rows, flat[:, i]] = i
    return torch.from_numpy(out).view(x.shape).to(x.device)


def _objective(out: torch.Tensor, y: torch.Tensor, cfg: RunConfig, eps: torch.Tensor) -> torch.Tensor:
    """(R, n, P) the loss at every position read: cross-entropy, or −log(f_y + ε) (readout=linear)."""
    if cfg.model.readout == "linear":
        return -torch.log(out.gather(-1, y[..., None])[..., 0] + eps[:, None, None])
    return -torch.log_softmax(out, -1).gather(-1, y[..., None])[..., 0]


def _predicted(out: torch.Tensor, cfg: RunConfig) -> torch.Tensor:
    """The model's predictive law: softmax, or f clipped to a tiny positive value and normalised (as
    model=transformer's KL reads f)."""
    if cfg.model.readout == "linear":
        q = out.clamp_min(torch.finfo(out.dtype).tiny)
        return q / q.sum(-1, keepdim=True)
    return torch.softmax(out, -1)


TIE = 64  # outputs within TIE units of rounding (of the largest |output|) of the maximum are tied


def first_max(out: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension, ties → the smallest label (Def. 2.1), where outputs within rounding
    of the maximum (TIE·machine epsilon·max|out|) are tied: the exact engine's ties (at the symmetric point,
    every label of a histogram's maximum) stay ties here, whatever order the sums were taken in."""
    top = out.amax(-1, keepdim=True)
    tol = TIE * torch.finfo(out.dtype).eps * out.abs().amax(-1, keepdim=True)
    return (out >= top - tol).to(torch.int8).argmax(-1)


def _kl(P: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Mean over sequences and positions of KL(P ‖ q) (R,)."""
    tiny = torch.finfo(q.dtype).tiny
    return torch.where(P > 0, P * (torch.log(P.clamp_min(tiny)) - torch.log(q.clamp_min(tiny))), 0.0).sum(-1).mean((1, 2))


def _loss_of(law: torch.Tensor, y: torch.Tensor, cfg: RunConfig, eps: torch.Tensor) -> torch.Tensor:
    """The objective (R,) of a predictor that outputs `law` (R, n, P, K): its log as logits, or f = law."""
    out = law if cfg.model.readout == "linear" else torch.log(law.clamp_min(torch.finfo(law.dtype).tiny))
    return _objective(out, y, cfg, eps).mean((1, 2))


def train_loss(params: dict, batch: Batch, cfg: RunConfig, eps: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """(R,) the training objective: per sequence the mean over its positions read, then the mean over the
    batch, or the sum where the run's optim.reduction=sum (`sums`, (R,) bool: the key is per run, so runs of
    either reduction train in one batch)."""
    out, _ = model.forward(params, batch.x, cfg.model, cfg.data.K, cfg.data.target)
    per_seq = _objective(out, batch.y, cfg, eps).mean(-1)
    return torch.where(sums, per_seq.sum(1), per_seq.mean(1))


def evaluate(params: dict, test: TestSet, cfg: RunConfig, eps: torch.Tensor, snapshot: bool) -> tuple[dict, dict | None]:
    """The metrics of a history row on the test set ({name: (R,) tensor or (R, L, H) for the per-layer
    attention scores}), and at a snapshot step the mean attention maps."""
    out, maps = model.forward(params, test.x, cfg.model, cfg.data.K, cfg.data.target, attention_maps=True)
    q = _predicted(out, cfg)
    row = {"test_loss": _objective(out, test.y, cfg, eps).mean((1, 2)),
           "test_acc": (first_max(out) == test.y).to(out.dtype).mean((1, 2)),
           "test_kl": _kl(test.P_true, q),
           "kl_uniform": _kl(torch.full_like(q, 1.0 / q.shape[-1]), q),
           "kl_unigram": _kl(test.unigram, q), "kl_bigram": _kl(test.bigram, q)}
    parent, induction = [], []
    T = test.x.shape[-1]
    tokens_T = test.prev.shape[-1]
    for rows in maps:  # each block's S as `Rows`: queries T − Tq … T − 1, read a block of rows at a time
        p, i = _parent_and_induction(rows, test, T, tokens_T, cfg.data.target == "last")
        parent.append(p)
        induction.append(i)
    # the attention's departure from uniform at the last position read, largest over layers, heads and
    # test sequences (what BREAK_SPREAD judges: Theorem 4.1's symmetric point has spread 0)
    # over the token keys (the blank query's own column is not a token: model=transformer's spread likewise)
    last = [rows.last() for rows in maps]  # (R, n, H, T) each
    row["attention_spread"] = torch.stack([(S[..., :tokens_T].amax(-1) - S[..., :tokens_T].amin(-1)).amax(2).amax(1)
                                           for S in last]).amax(0)
    row["parent_attention"] = parent[0].mean(1)
    row["attn_parent"] = torch.stack(parent, 1)
    row["induction"] = torch.stack(induction, 1)
    snap = None
    if snapshot:
        snap = {"attention": [S.mean(1) for S in last],
                "maps": [rows.whole().mean(1) for rows in maps] if T <= SNAPSHOT_MAP_MAX_T else None}
    return row, snap


def _parent_and_induction(rows, test: TestSet, T: int, tokens_T: int, last_only: bool):
    """One block's (R, H) parent attention (mean over test sequences and the positions read of the weight on
    the parents of what each predicts) and induction score (mean weight from a token position i to the
    position after x_i's previous occurrence, over the token positions read that have one: 0 where none has, NaN
    where the block reads no token position)."""
    first = T - rows.Tq  # the first query's position
    parent = induction = count = None
    for i0, S in rows.blocks():  # (R, n, H, b, k): read by index, no product with the whole block
        R, n, H, b, _ = S.shape
        qs = slice(first + i0, first + i0 + b)
        if not last_only:
            idx = test.parent_index[:, None, None, qs].expand(R, n, H, b, -1)
            part = (S.gather(-1, idx) * test.parent_weight[:, None, None, qs]).sum((-1, 3))
            parent = part if parent is None else parent + part
        a = test.anchor[:, :, qs]  # (R, n, b)
        w = S.gather(-1, a.clamp_min(0)[:, :, None, :, None].expand(R, n, H, b, 1))[..., 0]  # (R, n, H, b)
        hm = (a >= 0)[:, :, None, :].to(S.dtype)
        w, c = (w * hm).sum((1, 3)), hm.sum((1, 3))
        induction, count = (w, c) if induction is None else (induction + w, count + c)
    if last_only:
        S = rows.last()  # (R, n, H, T)
        idx = test.parent_index[:, None, None, T - 1].expand(*S.shape[:3], -1)
        parent = (S.gather(-1, idx) * test.parent_weight[:, None, None, T - 1]).sum(-1).mean(1)
    else:
        parent = parent.mean(1) / rows.Tq
    if first >= tokens_T:  # the block reads the blank query only: no token position, no score
        return parent, torch.full(parent.shape, float("nan"), dtype=parent.dtype, device=parent.device)
    return parent, induction / count.clamp_min(1)  # 0 where no position read has an earlier occurrence


def _finite_grads(loss: torch.Tensor, grads: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(R,) whether each run's loss and gradients are finite; (R,) the first that is not, for its summary's
    error (0: the loss, i: the i-th of `grads`)."""
    bad = torch.stack([~torch.isfinite(loss), *(~torch.isfinite(g.reshape(g.shape[0], -1)).all(1) for g in grads.values())])
    return ~bad.any(0), bad.to(torch.int8).argmax(0)


def _drawn(cfgs: list[RunConfig], n: int, seeds: list[int]) -> data_mod.Split:
    """n sequences per run, run r's from a generator seeded with seeds[r], stacked (R, n, ·)."""
    d0 = cfgs[0].data
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    splits = d0.draw_many([c.data for c in cfgs], n, gens, [c.seed for c in cfgs])
    return data_mod.Split(*(torch.stack([getattr(s, k) for s in splits]) for k in ("tokens", "y", "P_true")))


def _batch_of(cfgs: list[RunConfig], t: int, device) -> Batch:
    """The online batch of step t: data.batch sequences per run from its step stream (`step_seed`)."""
    s = _drawn(cfgs, cfgs[0].data.batch, [step_seed(c.seed, t) for c in cfgs])
    return Batch(s.tokens, s.y, cfgs[0], device)


def _sets(cfgs: list[RunConfig], dtype, device) -> tuple[Batch | None, TestSet]:
    """The fixed training set (None with data.online) and the test set. Offline both are `make`'s (train then
    test from the run's seed); online the test set is the first n_test draws of the run's seed."""
    if cfgs[0].data.online:
        return None, TestSet(_drawn(cfgs, cfgs[0].data.n_test, [c.seed for c in cfgs]), cfgs, dtype, device)
    train_split, test_split = data_mod.make_batches(cfgs)
    return Batch(train_split.tokens, train_split.y, cfgs[0], device), TestSet(test_split, cfgs, dtype, device)


def train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
          resumed: list[dict] | None = None, live=None) -> list[Record]:
    """Train R runs of one shape (optionally from their checkpoints) and return their records. `live(recs,
    walls)`, if given, gets the records after every evaluation (rows are read to the host there anyway)."""
    c0 = cfgs[0]
    dtype, dev = getattr(torch, c0.precision), device_of(c0)
    if dev.type == "cpu":  # each step frees and takes back tens of MB of activations: kept, not unmapped
        allocator.keep_freed_blocks()
    K, N, T = c0.data.K, c0.data.N, c0.optim.steps
    train_set, test = _sets(cfgs, dtype, dev)
    recs = [Record(cfg, Path(d)) for cfg, d in zip(cfgs, run_dirs)]
    opt_acc = test.P_true.double().amax(-1).mean((1, 2)).tolist()
    eps = torch.tensor([c.optim.eps for c in cfgs], dtype=dtype, device=dev)
    sums = torch.tensor([c.optim.reduction == "sum" for c in cfgs], device=dev)
    # constant over training: on the host once, written into every history row
    baselines = {"opt_loss": _loss_of(test.P_true, test.y, c0, eps).tolist(),
                 "unigram_loss": _loss_of(test.baseline, test.y, c0, eps).tolist()}
    spec = model.params_of(c0.model, K, N)
    params = {k: v.to(dev) for k, v in model.init_params(cfgs, K, N, dtype).items()}
    opt = Optimiser(cfgs, params, {p.name: cfgs[0].optim.decays(p.role) for p in spec}, dtype, dev)
    start = 0
    dead = torch.full((len(cfgs),), T + 1, dtype=torch.int64, device=dev)  # the step a run diverged at
    cause = torch.zeros(len(cfgs), dtype=torch.int64, device=dev)  # what was not finite there (`_finite_grads`)
    quantities = ["training loss", *(f"gradient of {name}" for name in params)]
    if resumed:
        start = int(resumed[0]["state"]["step"])
        params = {k: torch.stack([b["state"]["params"][k] for b in resumed]).to(dev, dtype) for k in params}
        opt.state = {k: (torch.stack([b["state"]["opt"][k] for b in resumed]).to(dev) if k != "t"
                         else resumed[0]["state"]["opt"]["t"].clone()) for k in opt.state}
        for r, (rec, b) in enumerate(zip(recs, resumed)):
            rec.history, rec.snapshots, rec.status, rec.error = b["history"], b["snapshots"], b["status"], b["error"]
            rec.steps = b["steps"]
            if rec.status != "done":
                dead[r] = -1
    for rec, a, b in zip(recs, opt_acc, bayes_test_acc(test.P_true, test.y)):
        rec.opt_acc, rec.opt_test_acc = a, b
    snap_steps = {s for s in c0.snapshot_steps if s <= T} | {T}
    ticker = Ticker(len(cfgs), start, T) if progress is not False else None
    stop = SaveOnSignal()
    walls: dict[int, float] = {}  # step → the wall-clock time it was evaluated at
    with stop:
        for t in range(start, T + 1):
            batch = train_set if train_set is not None else _batch_of(cfgs, t, dev)
            live_params = {k: v.detach().requires_grad_(t < T) for k, v in params.items()}
            with torch.set_grad_enabled(t < T):
                loss = train_loss(live_params, batch, c0, eps, sums)
                grads = dict(zip(live_params, torch.autograd.grad(loss.sum(), list(live_params.values())))) \
                    if t < T else {}
            ok, first = _finite_grads(loss, grads)
            cause = torch.where((dead > T) & ~ok, first, cause)
            dead = torch.where((dead > T) & ~ok, torch.full_like(dead, t), dead)
            if t % c0.eval_every == 0 or t == T:
                with torch.no_grad():
                    row, snap = evaluate(params, test, c0, eps, t in snap_steps)
                _record(recs, t, loss, row, baselines, snap, dead)
                walls[t] = time.time()
                if live is not None:
                    live(recs, walls)
            if t < T:
                opt.step(params, grads, dead > T, t)
                if (c0.checkpoint_every and (t + 1) % c0.checkpoint_every == 0) or stop.pending:
                    _close(recs, dead, t + 1, T, [quantities[i] for i in cause.tolist()])
                    stop.save(recs, lambda r: checkpoint(recs[r], params, opt, r, t + 1))  # one that fails is a line
                    stop.deliver()
                if ticker is not None:
                    ticker(t + 1)
    _close(recs, dead, T, T, [quantities[i] for i in cause.tolist()])
    return recs


def _close(recs: list[Record], dead: torch.Tensor, step: int, T: int, causes: list[str]) -> None:
    """Each record's status and steps as of `step` (the parameters' step): a run that diverged at d <= T
    stopped there, its error naming what was not finite (`causes`, per run); a run still going has taken
    `step` steps; one that ended before this session stays."""
    for rec, d, cause in zip(recs, dead.tolist(), causes):
        if rec.status != "done":
            continue
        if 0 <= d <= T:
            rec.status, rec.steps = "diverged", d
            rec.error = f"non-finite {cause} at step {d}"
        else:
            rec.steps = step


def _record(recs, t, loss, row, baselines, snap, dead) -> None:
    """One history row per run still alive at t (a diverged run keeps its rows up to the step it diverged)."""
    host = {k: v.detach().cpu().tolist() for k, v in row.items()}
    losses, d = loss.detach().cpu().tolist(), dead.cpu().tolist()
    for r, rec in enumerate(recs):
        if d[r] < t or rec.status != "done":
            continue
        item = {"step": t, "train_loss": losses[r], **{k: host[k][r] for k in GPT_EVALUATED if k in host},
                "opt_loss": baselines["opt_loss"][r],
                "unigram_loss": baselines["unigram_loss"][r]}
        rec.history.append(item)
        if snap is not None:
            rec.snapshots.append({"step": t, "attention": [a[r].cpu().tolist() for a in snap["attention"]],
                                  "maps": [m[r].cpu().tolist() for m in snap["maps"]] if snap["maps"] else None})


def checkpoint(rec: Record, params: dict, opt: Optimiser, r: int, step: int) -> dict:
    """Everything needed to continue run r exactly: its parameters and optimiser state after `step` steps."""
    state = {"step": step, "params": {k: v[r].detach().cpu().clone() for k, v in params.items()},
             "opt": {k: (v[r].cpu().clone() if k != "t" else v.clone()) for k, v in opt.state.items()}}
    return {"config": rec.cfg.to_dict(), "state": state, "history": rec.history, "snapshots": rec.snapshots,
            "status": rec.status, "error": rec.error, "steps": rec.steps}


def prefetch(cfgs: list[RunConfig]) -> None:
    """Nothing to draw ahead: the data of a gpt batch are small next to its training."""


def batch_bytes(cfg: RunConfig) -> int:
    """Peak memory of one run inside a batch: the whole run's estimate (`run_bytes`), its runs being batched."""
    return run_bytes(cfg)[0]


def run_bytes(cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes of one run (estimate) and the key of its largest term: the attention maps (n·H·T² per
    layer, kept for the backward pass: data.N), the stream's activations (n·T·width, a dozen per layer: the
    number of sequences, data.n_test, data.n_train or data.batch) or the parameters with their gradients and
    optimiser state (model.d_model, or model.M with embed=fixed). `rw_sweeps.core.resources.cause` names the
    key a refusal shows."""
    d, m = cfg.data, cfg.model
    item = 8 if cfg.precision == "float64" else 4
    n_train, train_key = (d.batch, "data.batch") if d.online else (d.n_train, "data.n_train")
    n = max(n_train, d.n_test)
    T = model.length(m, d.N)
    D = m.width(d.K)
    attn = n * m.n_head * T * T * 4 * m.n_layer
    stream = n * T * D * (12 + 4 * m.mlp) * m.n_layer + n * T * d.K * 12
    params = sum(math.prod(p.shape) for p in model.params_of(m, d.K, d.N)) * 6
    total = (attn + stream + params) * item + 4096
    terms = {"data.N": attn, "data.n_test" if d.n_test >= n_train else train_key: stream,
             "model.M" if m.embed == "fixed" else "model.d_model": params}
    return total, max(terms, key=terms.get)


def relative_loss(cfg: RunConfig, last: dict) -> tuple[float | None, str | None]:
    """(relative_loss, why it is null): (test_loss − opt_loss)/(unigram_loss − opt_loss), 0 at the Bayes loss
    and 1 at the unigram baseline, defined only where both baselines are losses of distributions the model's
    output competes with. Null, with the reason, where the model's output is not a distribution
    (model.readout=linear, eq. 2.1's f: −log(f_y + ε) of an f that need not sum to 1 goes below the Bayes loss,
    so the ratio compares unlike things), where the baselines are within RELATIVE_MIN_GAP nats (p + q = 1 on
    the binary chain: the state tells nothing and the ratio would be sampling noise over noise), and where
    the run has no finite evaluation."""
    if cfg.model.readout != "softmax":
        return None, (f"model.readout={cfg.model.readout}: the output f is not a distribution, so its loss is "
                      "not comparable with the Bayes and unigram losses")
    if not last:
        return None, "no evaluation with finite losses"
    if abs(last["unigram_loss"] - last["opt_loss"]) <= RELATIVE_MIN_GAP:
        return None, f"unigram_loss and opt_loss within {RELATIVE_MIN_GAP:g} nats: the baselines coincide"
    return (last["test_loss"] - last["opt_loss"]) / (last["unigram_loss"] - last["opt_loss"]), None


def summary(rec: Record, wall: float) -> dict:
    """summary.json of a gpt run: its last evaluation whose metrics are finite, the baselines, the outcome
    and the run's keys, with `relative_loss` and, where it is null, `relative_loss_null` saying why."""
    cfg = rec.cfg
    broke = next((row["step"] for row in rec.history if row.get("attention_spread", 0) > BREAK_SPREAD), None)
    last = next((row for row in reversed(rec.history)
                 if all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k]) for k in ("test_loss", "train_loss"))), {})
    gap, why = relative_loss(cfg, last)
    d, m = cfg.data, cfg.model
    return {
        "status": rec.status, "error": rec.error,
        **{k: last.get(k) for k in GPT_LAST}, "relative_loss": gap,
        "relative_loss_null": why, "eval_step": last.get("step"),
        "opt_acc": rec.opt_acc, "opt_test_acc": rec.opt_test_acc, "symmetry_break_step": broke, "steps": rec.steps, "wall_s": round(wall, 6),
        "parent_positions": parent_positions(cfg),
        "p": getattr(d, "p", None), "q": getattr(d, "q", None), **d.echoed(),  # the family's keys (`ECHO`)
        "K": d.K, "N": d.N, "model": m.name,
        "n_layer": m.n_layer, "n_head": m.n_head, "tie": m.tie, "target": d.target, "online": d.online,
        "data": d.name, "init": cfg.init.name, "sigma": cfg.init.scale(), "lr": cfg.optim.lr, "optim": cfg.optim.name,
        "eps": cfg.optim.eps, "seed": cfg.seed, "precision": cfg.precision, "run_id": results.run_id(rec.run_dir),
    }

