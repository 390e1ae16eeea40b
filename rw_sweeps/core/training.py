"""The training loop, top to bottom: R runs of one shape from their configs to their records.

data → initial state (or a checkpoint) → for t = 0 … T: evaluate (every `eval_every` steps), take a GD
step (the optimiser's own, `rw_sweeps.core.optimisers`), check finiteness → records (history rows, snapshots, status).
Nothing here writes a result file but checkpoints: `rw_sweeps.sweeps.run` turns the records into run folders.
Runs never disturb each other: a run whose loss or parameters stop being finite is `diverged` at that step
while the others go on.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import numpy as np
import torch

from . import data as data_mod
from . import engine, fused, model, results
from .config import RunConfig
from .loop import BREAK_SPREAD, Record, SaveOnSignal, Ticker, device_of, has_terminal
from .metrics import EVALUATED, LAST

LIVE_S = 1.0  # at most one live report (`train(live=…)`) a second: a flush rebuilds every record
TRAP_BLOCK = 1 << 24  # histogram counts `trap_flags` holds at once (128 MB of int64)
TRAP_PROBE = 8  # sequences `trap_flags` compares first, before the whole training set


def trap_flags(tokens: torch.Tensor, K: int, classes: list | None = None) -> list[bool]:
    """Per run (tokens (R, n, N−1)): is the training set's token histogram of x_1 … x_{N−1} a function of
    the closed class of the chain that the walk stays in? Then zero-init GD never leaves Theorem 4.1's
    symmetric point (the docs' "When zero init is trapped" derives it): p ∈ {0, 1} with K | N − 1 on the
    circle (one class), and any deterministic permutation chain whose cycle lengths all divide N − 1, each
    cycle a class of its own (`(0 1)(2 3)`, a 3-cycle plus a fixed point), where the histogram is the same
    within each class but not across them. `classes[r]`: run r's class of each state (`closed_classes`),
    None for runs with no single Π (the QA tasks, in-context and higher-order chains): there the histogram
    must be the same for every sequence. A sequence belongs to the class of its last observed state (a
    walk never leaves a closed class; one still in transient states is its own class, −1)."""
    R, n, L = tokens.shape
    if R == 0:
        return []
    dev = tokens.device
    # each sequence's class: that of its last state; one class for every sequence where a run has no Π
    cls = torch.zeros((R, n), dtype=torch.long, device=dev)
    runs = [r for r, c in enumerate(classes or ()) if c is not None]
    if runs:  # one gather for the batch: its runs' chains have the same K states
        idx = torch.tensor(runs, device=dev)
        table = torch.tensor([classes[r] for r in runs], dtype=torch.long, device=dev) + 1
        cls[idx] = table.gather(1, tokens[idx, :, -1].long())
    # a histogram row must equal the row of its class's first sequence (ref[r, i] <= i). The first PROBE
    # sequences settle it for almost every run that is not trapped; the rest are checked whole, in blocks of
    # runs that bound the (runs, n, K) histograms to TRAP_BLOCK counts
    first = torch.full((R, int(cls.max()) + 1), n, dtype=torch.long, device=dev)
    first.scatter_reduce_(1, cls, torch.arange(n, device=dev).expand(R, n), reduce="amin")
    ref = first.gather(1, cls)
    flags = torch.zeros(R, dtype=torch.bool, device=dev)
    left = torch.arange(R, device=dev)
    for m in (min(n, TRAP_PROBE), n):
        step = max(1, TRAP_BLOCK // max(1, m * K))
        keep = []
        for a in range(0, len(left), step):
            rows = left[a:a + step]
            t = tokens[rows, :m].long()
            b = len(rows)
            off = (torch.arange(b * m, device=dev) * K).view(b, m, 1)
            h = torch.bincount((t + off).view(-1), minlength=b * m * K).view(b, m, K)
            keep.append((h == h.gather(1, ref[rows, :m, None].expand(b, m, K))).flatten(1).all(1))
        ok = torch.cat(keep) if keep else torch.zeros(0, dtype=torch.bool, device=dev)
        left = left[ok]
        if m == n or not len(left):
            break
    flags[left] = True
    return flags.tolist()


def closed_classes(Pi) -> list[int] | None:
    """Each state's closed communicating class of the chain Π (a numbered class), or −1 for a transient
    state: the strongly connected components of Π's support that no transition leaves."""
    if Pi is None:
        return None

    A = np.asarray(Pi) > 0
    K = len(A)
    reach = A | np.eye(K, dtype=bool)
    for k in range(K):  # transitive closure (Warshall): K ≤ a few hundred
        reach |= reach[:, k:k + 1] & reach[k:k + 1, :]
    out, seen = [-1] * K, 0
    for i in range(K):
        if out[i] != -1:
            continue
        comp = reach[i] & reach[:, i]
        if not (reach[i] & ~comp).any():  # nothing outside the component is reachable: closed
            for j in np.nonzero(comp)[0]:
                out[int(j)] = seen
            seen += 1
    return out


def in_kernel(cfg: RunConfig) -> bool:
    """Do runs like this one train and evaluate in the compiled kernel (on a CPU)?"""
    return device_of(cfg).type == "cpu" and fused.available(cfg)


def data_dtypes(cfg: RunConfig) -> tuple[torch.dtype, torch.dtype]:
    """(P_true's dtype, the tokens' dtype) of a batch of these runs: bytes where the fused kernel reads them."""
    return getattr(torch, cfg.precision), torch.uint8 if in_kernel(cfg) else torch.int64


def batch_bytes(c: RunConfig) -> int:
    """Peak memory of one run inside a batch (int64 tokens, the (n, N−1) gather and scatter temporaries, a
    dozen (n, K) tensors); measured within ~20 % at the §5 shape. The packing rule sizes chunks with it."""
    n, L, K = c.data.n_train + c.data.n_test, c.data.N - 1, c.data.K
    item = 8 if c.precision == "float64" else 4
    width = max(K, c.model.m or 0)
    # a model trained on its reference forward also holds the one-hot X (n, K, N) and autograd's (n, ·, N)
    # tensors: an estimate of their order, X twice and eight logit-sized tensors, not a measurement
    reference = 0 if "engine" in type(c.model).IMPLEMENTATIONS else n * (L + 1) * (2 * width + 8) * item
    return n * L * (8 + 3 * item) + n * width * item * 14 + 4096 + reference


def run_bytes(cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes of one run, and the key of the estimate's largest term: the batched data and state
    (`batch_bytes`), the K×K matrices (Π, V, Πᵀ), and the draw of the initial state (its init's `eq21`
    `draw_bytes`: for init=gaussian the dense (K+M)² float64 W with init.draw=dense, only the N×M positions
    with gram=numeric under the compact draw)."""
    d, m = cfg.data, cfg.model
    terms = {
        "model.M": cfg.init.implementation(m.ENGINE, m.name).draw_bytes(cfg),
        "data.K": 3 * d.K * max(d.K, m.m or 0) * 8,
        "data.n_train" if d.n_train >= d.n_test else "data.n_test": batch_bytes(cfg),
    }
    return sum(terms.values()), max(terms, key=terms.get)


def prefetch(cfgs: list[RunConfig]) -> None:
    """Draw these runs' data in the background (the next chunk's, while this one trains)."""
    if cfgs:
        dtype_P, dtype_tokens = data_dtypes(cfgs[0])
        data_mod.prefetch(cfgs, dtype=dtype_P, token_dtype=dtype_tokens)


def stack_data(splits: list[data_mod.Split], dtype, device) -> engine.Batch:
    return engine.Batch(torch.stack([s.tokens for s in splits]).to(device), torch.stack([s.y for s in splits]).to(device),
                        torch.stack([s.P_true for s in splits]).to(device, dtype))


def initial_state(cfgs: list[RunConfig], geo: model.Geometry, dtype) -> engine.State:
    """V(0), A(0) and the compact a(0), c(0) of W(0) for every run, as its init draws them on this engine (its
    `eq21` implementation, `rw_sweeps.core.inits`: zero, or Gaussian drawn compactly or as the dense W)."""
    params, ac = [], []
    for cfg in cfgs:
        theta, state = cfg.init.implementation(cfg.model.ENGINE, cfg.model.name).initial(cfg, geo, dtype)
        params.append(theta)
        ac.append(state)
    return engine.init_state(params, ac)


def train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
          resumed: list[dict] | None = None, live=None) -> list[Record]:
    """Train R runs of one shape (optionally from their checkpoints) and return their records.

    `live(recs, walls)`, if given, is called every LIVE_S seconds of training (and never more often than
    the evaluations) with the records flushed so far and the wall-clock time of each evaluated step: what
    logs a small batch's wandb runs while it trains (`rw_sweeps.sweeps.tracking.Live`).

    Between two evaluations the runs take their steps in one call of the optimiser's implementation for this
    engine (GD: the multi-step compiled kernel; the others: the PyTorch path, on any device). Nothing in
    the step loop reads a tensor back to the host (on a GPU, no sync): metrics, divergence steps and
    snapshots stay device tensors in a `_Log` until it is flushed, once per chunk (or when its buffer
    fills, or for a checkpoint), and the records are built from the flushed arrays.

    A chunk whose steps and evaluations are the compiled kernel's (on a CPU) runs torch's own ops on one
    thread: the kernel's threads do its parallel work (`fused.torch_serial`)."""
    kernel = in_kernel(cfgs[0])
    say_reference(cfgs[0])
    with fused.torch_serial() if kernel else contextlib.nullcontext():
        return _train(cfgs, run_dirs, progress, resumed, live, kernel)


SAID: set[str] = set()  # the model options this process has said train on their reference forward


def say_reference(cfg: RunConfig) -> None:
    """One line, once a process, for a model option that declares no fast implementation of its forward."""
    name = cfg.model.name
    if "engine" not in type(cfg.model).IMPLEMENTATIONS and name not in SAID:
        SAID.add(name)
        print(f"model={name} declares no fast implementation of its forward (IMPLEMENTATIONS): its runs train on "
              "the reference forward by autograd, exact and slower", flush=True)


def _train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None, resumed: list[dict] | None, live,
           kernel: bool) -> list[Record]:
    c0 = cfgs[0]
    dtype, dev = getattr(torch, c0.precision), device_of(c0)
    T = c0.optim.steps
    geo = model.geometry(c0.model, c0.data.N)
    # stacked (R, n, …), P_true in the run precision; tokens as bytes where the fused kernel reads them
    dtype_P, dtype_tokens = data_dtypes(c0)
    splits = data_mod.make_batches(cfgs, dtype=dtype_P, token_dtype=dtype_tokens)
    train_set, test_set = (engine.Batch(s.tokens.to(dev), s.y.to(dev), s.P_true.to(dev, dtype)) for s in splits)
    recs = [Record(cfg, d) for cfg, d in zip(cfgs, run_dirs)]
    if c0.opt_acc is None:  # mean over the test set of max_j P(y = j | context), measured once, on the host
        # on one thread: torch splits a mean with one output (a chunk of one run) among its threads, so the
        # value would depend on the machine's thread count and on whether the run trained alone or packed
        rows = test_set.P_true.amax(-1).double().cpu()
        with fused.torch_serial():
            best = rows.mean(-1).tolist()
        for rec, b in zip(recs, best):
            rec.opt_acc = b
    for rec, b in zip(recs, bayes_test_acc(test_set.P_true, test_set.y)):
        rec.opt_test_acc = b
    classes = [closed_classes(cfg.data.first_order_pi(cfg.seed)) for cfg in cfgs]
    for rec, t in zip(recs, trap_flags(train_set.tokens, c0.data.K, classes)):
        rec.trap = t
    if resumed:
        state = engine.stack_slices([b["state"] for b in resumed])
        for rec, b in zip(recs, resumed):
            rec.history, rec.snapshots, rec.status, rec.error = b["history"], b["snapshots"], b["status"], b["error"]
            rec.break_step, rec.steps = b["break_step"], b["steps"]
            rec.prediction_break_step = b.get("prediction_break_step")
    else:
        state = initial_state(cfgs, geo, dtype)
    state = engine.to(state, dev)
    # the optimiser's own step on this engine (`rw_sweeps.core.optimisers`): it keeps its state in state.opt
    update = c0.optim.implementation("eq21", c0.model.name)(cfgs, geo, dtype, dev)
    if not resumed:
        update.start(state)
    eps = torch.tensor([cfg.optim.eps for cfg in cfgs], dtype=dtype, device=dev)
    w = torch.tensor([1.0 / cfg.data.n_train if cfg.optim.reduction == "mean" else 1.0 for cfg in cfgs],
                     dtype=dtype, device=dev)
    PiT = None  # V's limit Πᵀ (Thm 3.1), for eq. 2.1 on first-order chains (random walks and the others)
    # null where there is no single Π (kth_order with order ≥ 2, icl_markov, QA); shape_key keeps data.order
    # equal within a batch, so every run of it has a Π or none has
    if c0.data.first_order_pi(c0.seed) is not None and not c0.model.is_ffn:
        PiT = torch.stack([torch.from_numpy(cfg.data.first_order_pi(cfg.seed)).to(dtype).T
                           for cfg in cfgs]).to(dev)
    snap_steps = {s for s in c0.snapshot_steps if s <= T} | {T}
    evals = [t for t in range(state.step, T + 1) if t % c0.eval_every == 0 or t == T]
    if progress is None:
        progress = has_terminal()
    bar = None
    if progress:
        from tqdm import tqdm  # tqdm: only on a terminal

        bar = tqdm(total=T, initial=state.step, desc=f"{len(cfgs)} run(s)", unit="step", leave=False)
    # Without a terminal (CI, a SLURM log) a long batch says where it is every RW_SWEEPS_PROGRESS_S seconds.
    ticker = Ticker(len(cfgs), state.step, T) if bar is None else None
    log = _Log(recs, dev, T, kernel)
    block = _Block()
    stop = SaveOnSignal()  # SLURM's USR2 (preemption, time limit), SIGTERM, Ctrl-C: checkpoint, then go on
    with stop:
        # Every evaluation, snapshot and checkpoint sits on an absolute step: a run resumed from a checkpoint
        # at any step (a signal's, or one off the evaluation grid) first steps up to its next evaluation,
        # so its files equal an uninterrupted run's.
        evaluated = None  # the last evaluated step: the first step taken from it records its training loss
        shown = time.monotonic()  # when `live` was last given the records
        for t in evals:
            while state.step < t:  # the steps up to this evaluation, in bounded calls
                t0, n = state.step, block.steps(t - state.step, c0.checkpoint_every, state.step)
                loss, bad = update.steps(state, train_set, eps, w, geo, n)
                if t0 == evaluated:
                    log.train_loss(loss[:, 0])
                log.diverged_at(t0, bad, loss)
                block.done(n)
                if bar is not None:
                    bar.update(n)
                elif ticker is not None:
                    ticker(state.step)
                if (c0.checkpoint_every and state.step % c0.checkpoint_every == 0) or stop.pending:
                    log.flush(state.step)
                    stop.save(recs, lambda r: checkpoint(recs[r], state, r))  # one that fails is a line
                    stop.deliver()  # the signal's own handler now: submitit requeues, Ctrl-C interrupts, …
            if live is not None and evaluated is not None and time.monotonic() - shown >= LIVE_S:
                log.flush(state.step)  # every evaluation so far: the last one's training loss is now known
                live(recs, log.walls)
                shown = time.monotonic()
            # fused.*: the compiled kernel where it applies (eq. 2.1, exact Gram, CPU), else engine.* itself
            snapshot = t in snap_steps  # only a snapshot needs the attention at every position
            probe = fused.evaluate(state, test_set, eps, geo, PiT, full=snapshot)
            log.evaluation(t, probe, state if snapshot else None)
            log.predictions(t, state, test_set, geo, probe)
            evaluated = t
            if t == T:
                loss = fused.evaluate(state, train_set, eps, geo, full=False, once=True).loss
                log.train_loss(loss, engine.finite_runs(loss, state))
    log.flush(T)
    if live is not None:
        live(recs, log.walls)
    if bar is not None:
        bar.close()
    return recs


class _Block:
    """How many steps one kernel call takes: up to the next evaluation or checkpoint, and no more than
    about BLOCK_S seconds, so that a signal (SLURM's USR2, a stop) is answered within a block. The batch's
    first call, before a step's time is known, takes at most PROBE steps: sized by the evaluation interval
    alone it could run for minutes past a signal."""
    BLOCK_S = 1.0
    PROBE = 16

    def __init__(self) -> None:
        self.per_step = None
        self.t = 0.0

    def steps(self, to_eval: int, checkpoint_every: int, step: int) -> int:
        n = to_eval
        if checkpoint_every:
            n = min(n, checkpoint_every - step % checkpoint_every)
        n = min(n, self.PROBE if self.per_step is None else max(1, int(self.BLOCK_S / max(self.per_step, 1e-9))))
        self.t = time.perf_counter()
        return n

    def done(self, n: int) -> None:
        self.per_step = (time.perf_counter() - self.t) / n


class _Log:
    """The records of a batch as device tensors until `flush`: per evaluation the metric columns (R,),
    per run the step it diverged at (T + 1: not yet), the snapshots' tensors. A flush copies everything
    buffered to the host at once and rebuilds the records; `FLUSH_BYTES` bounds what a device holds."""
    FLUSH_BYTES = 256 << 20
    HOST_READS = None  # the prediction check may read flags back: None → on a CPU only (where it is free)
    COLS = EVALUATED

    def __init__(self, recs: list[Record], dev, T: int, kernel: bool = False):
        self.recs, self.T = recs, T
        self.kernel = kernel  # the chunk's evaluations are the compiled kernel's: so are its histograms
        self.base = [(list(r.history), list(r.snapshots)) for r in recs]  # what a checkpoint brought
        self.cos = True
        # runs that ended before this session (a resumed diverged run) record nothing more: step −1
        self.dead = torch.tensor([T + 1 if r.status == "done" else -1 for r in recs], device=dev)
        self.loss_bad = torch.zeros(len(recs), dtype=torch.bool, device=dev)  # diverged by its loss, not its update
        # the first evaluated step whose predictions left the symmetric point's (T + 1: not yet)
        self.h_sym = None  # the symmetric point's X·S of every test sequence, built on first need
        self.off = torch.tensor([T + 1 if r.prediction_break_step is None else r.prediction_break_step for r in recs],
                                device=dev)
        self.steps_, self.rows, self.losses, self.snaps = [], [], [], []  # device, since the last flush
        self.h_steps, self.h_rows, self.h_losses, self.h_snaps = [], [], [], []  # host
        self.bytes = 0
        self.walls: dict[int, float] = {}  # step → the wall-clock time it was evaluated at (for live logging)

    def evaluation(self, t: int, probe: engine.Probe, state: engine.State | None) -> None:
        self.walls[t] = time.time()
        cos = probe.v_pi_cosine
        self.cos = cos is not None
        cols = [probe.loss, probe.acc, probe.kl, probe.parent_attention, probe.spread, probe.pred_dist,
                cos if cos is not None else torch.zeros_like(probe.loss)]
        self.steps_.append(t)
        self.rows.append(torch.stack(cols))
        self.bytes += self.rows[-1].numel() * self.rows[-1].element_size()
        if state is not None:  # θ at step t (a, c: what W's relevant blocks reduce to) and the probe's views,
            # as one (R, ·) tensor: one copy per snapshot
            parts = {"V": state.params["V"], "A": state.params.get("A"), "a": state.a, "c": state.c,
                     "attention": probe.attention, "h_example": probe.h_example, "h_var": probe.h_var}
            shapes = {k: tuple(v.shape[1:]) for k, v in parts.items() if v is not None}
            flat = torch.cat([v.reshape(v.shape[0], -1).to(probe.loss.dtype) for v in parts.values() if v is not None], 1)
            self.snaps.append((t, shapes, flat))
            self.bytes += flat.numel() * flat.element_size()
        if self.bytes > self.FLUSH_BYTES:
            self._copy()

    def predictions(self, t: int, state: engine.State, test: engine.Batch, geo, probe: engine.Probe) -> None:
        """Have the predictions of the runs still at the symmetric point's left it at step t? Only runs whose
        attention is not exactly uniform can have (spread 0: X·S is the histogram's, so is every prediction).
        The evaluation's own predictions (`Probe.pred`) are compared with the symmetric point's (one
        (n, K)·(K, K) product a run); a run whose `pred` the compiled kernel left unsure (a sample within its
        rounding of a tie, `Probe.pred_unsure`) gets engine's exact pass, so every step is engine's."""
        need = (self.off > self.T) & (self.dead > self.T) & (probe.spread > 0)
        reads = self.HOST_READS if self.HOST_READS is not None else state.a.device.type == "cpu"
        if reads and not bool(need.any()):  # on a CPU a read costs nothing: skip what is settled
            return
        if self.h_sym is None:  # the test histograms, once per batch (R·n·K values: ~1 % of its data)
            count = fused.symmetric_h if self.kernel else engine.symmetric_h
            self.h_sym = count(test, state.a.shape[1], state.a.dtype)
        # one thread on a CPU: PyTorch's idle pool threads spin after a parallel op and slow the compiled
        # kernel's own threads in the next step (measured: 2.0× → 1.3× on the worst case, bench_trust.py)
        with fused.torch_serial() if state.a.device.type == "cpu" else contextlib.nullcontext():
            off = (probe.pred != engine.symmetric_pred(state.params, self.h_sym, geo, test.tokens)).any(1)
            if probe.pred_unsure is not None:
                off = self._exact(off, need & probe.pred_unsure, state, test, geo, reads)
        self.off = torch.where(need & off, torch.full_like(self.off, t), self.off)

    def _exact(self, off: torch.Tensor, unsure: torch.Tensor, state: engine.State, test: engine.Batch, geo,
               reads: bool) -> torch.Tensor:
        """`off` with engine's exact pass where `unsure`: for those runs only where a read is free, else for
        every run, kept where asked (nothing read back)."""
        if not reads:
            return torch.where(unsure, engine.off_symmetric(state, test.tokens, geo, self.h_sym), off)
        if not bool(unsure.any()):
            return off
        idx = unsure.nonzero()[:, 0]
        sub = engine.State({k: v[idx] for k, v in state.params.items()}, state.a[idx], state.c[idx], state.step)
        off[idx] = engine.off_symmetric(sub, test.tokens[idx], geo, self.h_sym[idx])
        return off

    def train_loss(self, loss: torch.Tensor, finite: torch.Tensor | None = None) -> None:
        """The training loss before the last evaluated step; with `finite` (the final step, where no step
        is taken), the runs whose loss or parameters are not finite diverge there."""
        self.losses.append(loss)
        if finite is not None:
            new = (self.dead > self.T) & ~finite
            self.loss_bad = torch.where(new, ~torch.isfinite(loss), self.loss_bad)
            self.dead = torch.where(new, torch.full_like(self.dead, self.T), self.dead)

    def diverged_at(self, t0: int, bad: torch.Tensor, loss: torch.Tensor) -> None:
        """bad (R,): the first step of a block that starts at t0 whose loss or update was not finite, or −1;
        loss (R, steps): the block's training losses, which say which of the two it was."""
        bad = bad.to(self.dead.device)
        new = (self.dead > self.T) & (bad >= 0)
        at = loss.to(self.dead.device).gather(1, bad.clamp(min=0)[:, None])[:, 0] if loss.shape[1] else None
        if at is not None:
            self.loss_bad = torch.where(new, ~torch.isfinite(at), self.loss_bad)
        self.dead = torch.where(new, bad + t0, self.dead)

    def _copy(self) -> None:
        """Everything buffered on the device to the host, one copy."""
        if self.rows:
            self.h_rows.append(torch.stack(self.rows).cpu().numpy())
            self.h_steps += self.steps_
        if self.losses:
            self.h_losses.append(torch.stack(self.losses).cpu().numpy())
        for t, shapes, flat in self.snaps:
            host, at, snap = flat.cpu().numpy(), 0, {"step": t, "A": None}
            for k, shape in shapes.items():
                size = math.prod(shape)
                snap[k] = host[:, at:at + size].reshape(-1, *shape)
                at += size
            self.h_snaps.append(snap)
        self.steps_, self.rows, self.losses, self.snaps, self.bytes = [], [], [], [], 0

    def flush(self, step: int) -> None:
        """Copy to the host and rebuild every record (history, snapshots, status, steps, break step) as of
        `step`, the state's step: what a checkpoint saves, or the batch's result."""
        self._copy()

        dead, off, loss_bad = self.dead.cpu().numpy(), self.off.cpu().numpy(), self.loss_bad.cpu().numpy()
        rows = np.concatenate(self.h_rows) if self.h_rows else np.zeros((0, len(self.COLS), len(self.recs)))
        losses = np.concatenate(self.h_losses) if self.h_losses else np.zeros((0, len(self.recs)))
        n = min(len(rows), len(losses))  # evaluations whose training loss is known (the last may not be yet)
        steps = self.h_steps[:n]
        cols = {k: rows[:n, j].T.tolist() for j, k in enumerate(self.COLS)}
        train = losses[:n].T.tolist()
        spread = rows[:n, self.COLS.index("attention_spread")]
        evaluated = set(steps)
        for r, rec in enumerate(self.recs):
            history, snapshots = self.base[r]
            d = int(dead[r])
            keep = sum(1 for t in steps if t <= d) if d >= 0 else 0  # rows while alive (steps ascend)
            rec.history = history + [
                {"step": steps[i], "train_loss": train[r][i], **{k: cols[k][r][i] for k in self.COLS[:-1]},
                 "v_pi_cosine": cols["v_pi_cosine"][r][i] if self.cos else None} for i in range(keep)]
            rec.snapshots = snapshots + [
                {"step": s["step"], "V": s["V"][r].tolist(), "A": s["A"][r].tolist() if s["A"] is not None else None,
                 "a": s["a"][r].tolist(), "c": s["c"][r].tolist(), "attention": s["attention"][r].tolist(),
                 "h_example": s["h_example"][r].tolist(), "h_var": s["h_var"][r].tolist()}
                for s in self.h_snaps if s["step"] <= d and s["step"] in evaluated]
            if d < 0:
                continue
            if d <= self.T:
                rec.status, rec.steps = "diverged", d
                rec.error = (f"non-finite training loss at step {d}" if loss_bad[r] else
                             f"non-finite parameters after the update of step {d} (its training loss was finite)")
            else:
                rec.steps = min(step, self.T)
            if rec.break_step is None:
                hit = np.nonzero(spread[:keep, r] > BREAK_SPREAD)[0]
                rec.break_step = steps[int(hit[0])] if len(hit) else None
            o = int(off[r])
            rec.prediction_break_step = o if o <= min(d, self.T, step) else None


def checkpoint(rec: Record, state: engine.State, r: int) -> dict:
    """Everything needed to continue run r exactly: its state after `state.step` steps and its records."""
    return {"config": rec.cfg.to_dict(), "state": engine.run_slice(state, r), "history": rec.history,
            "snapshots": rec.snapshots, "status": rec.status, "error": rec.error, "break_step": rec.break_step,
            "prediction_break_step": rec.prediction_break_step, "steps": rec.steps}


METRICS = LAST


def _finite(row: dict) -> bool:
    """Every metric of a history row is a finite number (cos(V, Πᵀ) may be undefined: QA data, the FFN)."""
    for k in METRICS:
        v = row.get(k)
        if v is None and k == "v_pi_cosine":
            continue
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            return False
    return True


LOCK_MASS = 0.5  # a position other than the parent holding more than this of the mean attention has locked on


def locked_position(attention) -> int | None:
    """The 1-based position j ≠ N−1 (paper notation: x_1 … x_{N−1}, the query x_N) that the final mean
    attention S locks onto, or None: the argmax of S over the N−1 real tokens when it is not the parent,
    holds more than LOCK_MASS, and the parent holds less. `attention`: the mean S_j, length N (last: query)."""
    S = [float(v) for v in attention[:-1]]
    if not S:
        return None
    j = max(range(len(S)), key=S.__getitem__)  # first of ties, like numpy's argmax
    parent = len(S) - 1  # x_{N−1}, 0-based
    return j + 1 if j != parent and S[j] > LOCK_MASS and S[parent] < LOCK_MASS else None


def _final_lock(rec: Record) -> int | None:
    """locked_position of a finished run: its last snapshot is taken at the last step. A diverged or failed
    run has no final attention (its last snapshot predates the divergence): None."""
    if rec.status != "done" or not rec.snapshots or rec.snapshots[-1]["step"] != rec.steps:
        return None
    return locked_position(rec.snapshots[-1]["attention"])


def parent_positions(cfg: RunConfig) -> list[int] | None:
    """The 1-based positions y depends on (paper notation, x_N the query): N−1 for every first-order family
    and the in-context chains (whose posterior reads x_{N−1}), N−k … N−1 for an order-k chain, a Bayesian
    network's `parent`, none for the QA tasks (the answer depends on the whole sentence)."""
    return cfg.data.parents(cfg.seed)


def _parents_attention(rec: Record, parents: list[int] | None) -> float | None:
    """The final mean attention summed over the parent positions (the last snapshot, at the last step)."""
    if parents is None or rec.status != "done" or not rec.snapshots or rec.snapshots[-1]["step"] != rec.steps:
        return None
    attention = rec.snapshots[-1]["attention"]
    return float(sum(attention[j - 1] for j in parents))


def bayes_test_acc(P_true, y) -> list[float]:
    """The Bayes predictor's realised accuracy on each run's test set (R, …): the fraction of targets equal to
    argmax_j P(y = j | context), ties → the smallest label as the model's own predictions (Def. 2.1).
    `opt_acc` is its expectation, the mean of max_j P; this is what the model's test_acc is like with."""
    hit = (P_true.double().argmax(-1) == y).double()
    return hit.reshape(hit.shape[0], -1).mean(1).tolist()


def summary(rec: Record, wall: float) -> dict:
    """summary.json of a run (README, "Results"): its last evaluation whose every metric is finite (for a
    diverged run, the last one before it diverged; `eval_step` names it), the outcome and the run's keys."""
    cfg = rec.cfg
    last = next((row for row in reversed(rec.history) if _finite(row)), {})
    parents = parent_positions(cfg)
    return {
        "status": rec.status, "error": rec.error,
        **{k: last.get(k) for k in METRICS}, "eval_step": last.get("step"),
        "opt_acc": cfg.opt_acc if rec.opt_acc is None else rec.opt_acc, "opt_test_acc": rec.opt_test_acc,
        "trap": rec.trap,
        "symmetry_break_step": rec.break_step, "prediction_break_step": rec.prediction_break_step,
        "locked_position": _final_lock(rec),
        "parent_positions": parents, "parents_attention": _parents_attention(rec, parents),
        "steps": rec.steps,
        "wall_s": round(wall, 6),
        "p": getattr(cfg.data, "p", None), **cfg.data.echoed(),  # and the family's own keys (`DataConfig.ECHO`)
        "K": cfg.data.K, "N": cfg.data.N, "M": cfg.model.M, "model": cfg.model.name,
        "data": cfg.data.name, "init": cfg.init.name, "sigma": cfg.init.scale(), "lr": cfg.optim.lr,
        "eps": cfg.optim.eps, "seed": cfg.seed, "precision": cfg.precision, "run_id": results.run_id(rec.run_dir),
    }
