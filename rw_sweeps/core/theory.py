"""The theory drawn over the escape map: the symmetry-break step of a small Gaussian init, predicted
by linearising gradient descent along the zero-init trajectory.

Theorem 4.1: from zero init on a deterministic walk (p ∈ {0, 1}) with K | N − 1, every sequence has the same
token histogram, so GD stays on a symmetric trajectory (V_t = α_t·1, a_t ∝ 1, c_t equal on the N − 1 real
tokens: uniform attention) and never learns. A Gaussian init of size σ puts the run at θ_0 = σ·δ_0 off that
trajectory. To first order in σ the run is θ_t ≈ base_t + σ·δ_t, with

    base_{t+1} = step(base_t),      δ_{t+1} = J_t δ_t,      J_t = ∂step/∂θ at base_t,

`step` the compact GD step (eq. 2.3: engine.gradients then engine.gd_update, as a function of the state
tuple) and δ_0 the run's own unit-σ draw (what training.initial_state draws for its seed with σ = 1: V(0),
a(0), c(0), and A(0) for the FFN; every draw is σ times it). J_t δ_t is one `torch.func.jvp` per step, so a
single trajectory of the unit draw predicts every σ. The predicted crossing step is the first step at
which the attention spread of base_t + σ·δ_t on the run's test set exceeds loop.BREAK_SPREAD, and the
predicted break step the first evaluated step (a multiple of `eval_every`, or T, as training evaluates)
from the crossing on: what summary.json's `symmetry_break_step` measures on the run itself (a broken run
does not return to the symmetric point, while the linear state, past its crossing, soon means nothing).

The spread is measured (engine.evaluate) on the linearised state, not linearised itself: it is a max over
sequences of max_j S_j − min_j S_j, piecewise smooth with kinks wherever the arg-max changes, and exactly 0
on the base, where a first-order expansion would have to pick among tied branches. Evaluating the actual
spread of base_t + σ·δ_t is exact for the state the linear theory predicts and costs one forward pass.

Off the trap (p ∉ {0, 1}, or K ∤ N − 1) the zero-init trajectory is not symmetric, but the same linearisation
along it is still defined: base_t is then the zero-init run itself (which may break on its own,
`base_break_step`), and σ·δ_t the first-order effect of the init. For init=zero configs the prediction is
that zero-init run's own break step (or null).

The linearisation always runs in float64, on the CPU unless `predict` is given a device, whatever the
configs' `precision` and `device` say (they are reported, not used). A float32 run rounds away whatever
part of the perturbation is below half an ulp of the state, and adds rounding noise of its own, which the
float64 theory does not see: at the smallest σ with a slow escape (σ ≲ 1e-7, normalised, lr = 1) a float32
run breaks up to ~7 % earlier or later than predicted, or never.

GD only: Adam's step (optim=adam) is not the map linearised here, and the FFN's zero-init point (F.1) is a
fixed point at which ReLU'(0) = 0 makes J_t the identity, so its escape is second order in σ; both get a
null prediction with the reason.

    python -m rw_sweeps.sweeps.predict escape <the overrides of launch.py>   # one JSON line per composed config
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Callable, Iterator, Optional

import torch
from torch.func import jvp

from . import data as data_mod
from . import engine, loop, model, training
from .config import RunConfig, shape_key

DTYPE = torch.float64  # the linearisation's precision, whatever the runs' (module docstring)
MAX_ELEMENTS = 1 << 23  # R·n·(N − 1) of one batched trajectory or evaluation: bounds the memory of a chunk


# --------------------------------------------------------------------------------------- the step and J
def as_tuple(state: engine.State) -> tuple[torch.Tensor, ...]:
    """The state tuple torch.func differentiates: (V, a, c), and A last for the FFN."""
    return (state.params["V"], state.a, state.c) + ((state.params["A"],) if "A" in state.params else ())


def as_state(xs: tuple[torch.Tensor, ...], step: int = 0) -> engine.State:
    params = {"V": xs[0]} if len(xs) == 3 else {"V": xs[0], "A": xs[3]}
    return engine.State(params, xs[1], xs[2], step)


def compact_step(data: engine.Batch, lr: torch.Tensor, eps: torch.Tensor, w: torch.Tensor,
                 geo: model.Geometry) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The GD step of eq. 2.3 as a pure function of the state tuple (V, a, c[, A]) of R runs: its inputs are
    cloned, never changed (engine.gd_update works in place), so torch.func can differentiate it."""
    def step(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = as_state(tuple(x.clone() for x in xs))
        _, grads = engine.gradients(state, data, eps, w, geo)
        engine.gd_update(state, grads, lr, geo)
        return as_tuple(state)
    return step


def linearised_step(step: Callable, base: tuple, delta: tuple) -> tuple[tuple, tuple]:
    """(step(base), J·delta), J = ∂step/∂θ at base: one forward-mode pass."""
    return jvp(step, base, delta)


def _norm(xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(R,) the Euclidean norm of each run's part of a state tuple."""
    return torch.sqrt(sum(x.flatten(1).pow(2).sum(1) for x in xs))


# ------------------------------------------------------------------------------------------ trajectories
def eval_steps(T: int, every: int) -> list[int]:
    """The steps training evaluates at (training.train): multiples of eval_every, and T."""
    return [t for t in range(T + 1) if t % every == 0 or t == T]


@dataclasses.dataclass
class Linearised:
    """The runs' zero-init trajectory and their perturbation at step t: the linearised state at σ is
    base + σ·exp(log_scale)·delta (per run; delta has unit norm, its size is kept in log_scale)."""

    t: int
    base: tuple  # (V, a, c[, A]), each (R, …)
    delta: tuple  # the same shapes, unit norm per run
    log_scale: torch.Tensor  # (R,) log ‖δ_t‖ of the unit-σ draw
    growth: Optional[torch.Tensor]  # (R,) ‖δ_t‖/‖δ_{t−1}‖ of the attention part (a, c); None at t = 0

    def at(self, sigma: torch.Tensor, runs: torch.Tensor) -> tuple:
        """The linearised state base + σ·δ_t of `runs` (R',) at `sigma` (R',); σ = 0 gives the base itself."""
        log_coef = torch.log(sigma.clamp_min(1e-300)) + self.log_scale[runs]  # log σ‖δ_t‖
        coef = torch.where(sigma > 0, torch.exp(log_coef.clamp(max=300.0)), 0.0)  # no overflow of exp itself
        return tuple(b[runs] + _per_run(coef, b) * d[runs] for b, d in zip(self.base, self.delta))


def _per_run(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(R,) values shaped to broadcast against a (R, …) state tensor."""
    return v.view(-1, *[1] * (like.dim() - 1))


def linearise(cfgs: list[RunConfig], data: Optional[tuple] = None, device="cpu") -> Iterator[Linearised]:
    """base_t and δ_t of R runs of one shape (one per cfg; σ and init.name ignored), t = 0 … T, as one
    batched program: base_0 = 0, δ_0 = each run's own draw at σ = 1, then base_{t+1} = step(base_t) and
    δ_{t+1} = J_t δ_t by `torch.func.jvp`. δ is renormalised after every step (its log-norm kept apart): J
    is linear, so this changes nothing but keeps a growing perturbation finite over thousands of steps.
    data: the runs' (train, test) engine.Batches, if the caller has them."""
    c0 = cfgs[0]
    geo = model.geometry(c0.model, c0.data.N)
    if data is None:
        data = batches(cfgs)
    train = engine.Batch(*(x.to(device) for x in (data[0].tokens, data[0].y, data[0].P_true)))
    vec = lambda xs: torch.tensor(xs, dtype=DTYPE, device=device)  # noqa: E731
    lr, eps = vec([c.optim.lr for c in cfgs]), vec([c.optim.eps for c in cfgs])
    w = vec([1.0 / c.data.n_train if c.optim.reduction == "mean" else 1.0 for c in cfgs])
    unit = [dataclasses.replace(c, init=c.init.unit()) for c in cfgs]  # zero init: σ = 0 of the Gaussian axis
    delta = tuple(x.to(device) for x in as_tuple(training.initial_state(unit, geo, DTYPE)))
    base = tuple(torch.zeros_like(x) for x in delta)
    norm = _norm(delta)
    delta = tuple(x / _per_run(norm, x) for x in delta)
    log_scale, growth = torch.log(norm), None
    step = compact_step(train, lr, eps, w, geo)
    for t in range(c0.optim.steps + 1):
        yield Linearised(t, base, delta, log_scale, growth)
        if t == c0.optim.steps:
            return
        ac = _norm(delta[1:3])
        base, delta = linearised_step(step, base, delta)
        norm = _norm(delta)
        growth = _norm(delta[1:3]) / ac
        log_scale = log_scale + torch.log(norm)
        delta = tuple(x / _per_run(norm, x) for x in delta)


def batches(cfgs: list[RunConfig]) -> tuple[engine.Batch, engine.Batch]:
    """The runs' training and test sets (each run's own, as training draws them), in float64."""
    return tuple(engine.Batch(s.tokens, s.y, s.P_true) for s in data_mod.make_batches(cfgs, dtype=DTYPE))


def trajectories(cfgs: list[RunConfig], sigmas: list[list[float]], device="cpu") -> list[dict]:
    """The predictions of R runs of one shape (one per cfg, σ ignored) from one batched linearisation.

    sigmas[r]: the σ's (> 0) to predict for run r. Returns per run {"crossing": {σ: the first step t whose
    test-set spread of base_t + σ·δ_t exceeds BREAK_SPREAD, or None}, "break": {σ: the first evaluated step
    ≥ that crossing; 0.0: the base's own break step}, "growth": [‖δ_{t+1}‖/‖δ_t‖ of (a, c), t < T],
    "base_spread_max": the base's largest spread over the evaluated steps}.

    The linearised spread is checked at every step, not only at the evaluated ones: past its crossing the
    linear state soon leaves the regime where it means anything (with a fast escape, ~40× a step, it is
    not even finite by the next evaluation: tests/test_theory.py), while a run, once broken, does not
    return to the symmetric point; so its break step is the first evaluated step from the crossing on. To
    keep that cheap, a run's σ's are checked from the largest down, one a step (and the next at once, when
    one breaks): in the linear regime around Thm 4.1's symmetric point the spread grows with σ, so the σ's
    cross in that order. Off the trap the base has a spread of its own, which a perturbation can oppose (a
    larger σ then crosses later): so at the evaluated steps every σ is checked as well, which is exactly
    where training measures the break. The base (the zero-init run itself) is checked there too."""
    c0 = cfgs[0]
    geo = model.geometry(c0.model, c0.data.N)
    train, test = batches(cfgs)
    test = engine.Batch(*(x.to(device) for x in (test.tokens, test.y, test.P_true)))
    eps = torch.tensor([c.optim.eps for c in cfgs], dtype=DTYPE, device=device)
    R, T = len(cfgs), c0.optim.steps
    left = [sorted({s for s in sigmas[r] if s > 0}) for r in range(R)]  # ascending: the next to cross is last
    crossing: list[dict] = [{} for _ in range(R)]
    base_break: list = [None] * R
    base_max = [0.0] * R
    evals = eval_steps(T, c0.eval_every)
    chunk = max(1, MAX_ELEMENTS // (test.tokens.shape[1] * test.tokens.shape[2]))
    growth = []

    def spreads(lin: Linearised, pairs: list[tuple[int, float]]) -> list[float]:
        out = []
        for i in range(0, len(pairs), chunk):
            part = pairs[i:i + chunk]
            runs = torch.tensor([r for r, _ in part], device=device)
            sigma = torch.tensor([s for _, s in part], dtype=DTYPE, device=device)
            sub = engine.Batch(test.tokens[runs], test.y[runs], test.P_true[runs])
            out += engine.evaluate(as_state(lin.at(sigma, runs)), sub, eps[runs], geo).spread.tolist()
        return out

    for lin in linearise(cfgs, (train, test), device):
        if lin.growth is not None:
            growth.append(lin.growth.tolist())
        if lin.t in evals:
            for r, v in enumerate(spreads(lin, [(r, 0.0) for r in range(R)])):
                base_max[r] = max(base_max[r], v)
                if base_break[r] is None and v > loop.BREAK_SPREAD:
                    base_break[r] = lin.t
        if lin.t in evals:  # every σ where training evaluates: off the trap the spread need not grow with σ
            pairs = [(r, sg) for r in range(R) for sg in left[r]]
            for (r, sg), v in zip(pairs, spreads(lin, pairs)):
                if v > loop.BREAK_SPREAD:
                    crossing[r][sg] = lin.t
                    left[r].remove(sg)
        pending = [r for r in range(R) if left[r]]
        while pending:
            hit = []
            for r, v in zip(pending, spreads(lin, [(r, left[r][-1]) for r in pending])):
                if v > loop.BREAK_SPREAD:
                    crossing[r][left[r].pop()] = lin.t
                    if left[r]:
                        hit.append(r)
            pending = hit
    out = []
    for r in range(R):
        cross = {s: crossing[r].get(s) for s in sigmas[r] if s > 0}
        brk = {s: None if t is None else next(e for e in evals if e >= t) for s, t in cross.items()}
        out.append({"crossing": cross, "break": {**brk, 0.0: base_break[r]}, "growth": [g[r] for g in growth],
                    "base_spread_max": base_max[r]})
    return out


# ------------------------------------------------------------------------------------------------ predict
IGNORED = ("precision", "device", "wandb", "snapshot_steps", "checkpoint_every", "experiment", "objective")


def _trajectory_key(cfg: RunConfig) -> str:
    """Everything a trajectory depends on: the config but σ, the init's name (δ_0 is the unit draw either
    way) and what the float64 CPU linearisation does not use."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in IGNORED}
    d["init"] = dataclasses.asdict(cfg.init.unit())  # δ_0's draw: zero init's is the compact Gaussian one
    return json.dumps(d, sort_keys=True)


def _shape_key(cfg: RunConfig) -> tuple:
    """Runs with equal keys share one batched trajectory: the run's shape, but for what the float64 CPU
    linearisation does not use."""
    return shape_key(dataclasses.replace(cfg, precision="float64", device="cpu", snapshot_steps=[]))


def is_trap(cfg: RunConfig) -> bool:
    """Theorem 4.1's conditions on the run's data, as its family states them (`DataConfig.is_trap`: on the
    circle a deterministic walk with K | N − 1; zero init for the exact trap)."""
    return cfg.data.is_trap()


def _refused(cfg: RunConfig) -> Optional[str]:
    why = type(cfg.model).ESCAPE_THEORY
    if why is not None:
        return f"model={cfg.model.name}: {why}"
    if not cfg.optim.LINEARISED:
        return f"optim.name={cfg.optim.name}: the linearisation is of the GD step (eq. 2.3) only"
    return None


def _finite(x: float) -> Optional[float]:
    return x if math.isfinite(x) else None


def _row(cfg: RunConfig, traj: Optional[dict], reason: Optional[str]) -> dict:
    out = {"predicted_break_step": None, "predicted_crossing_step": None, "growth_per_step": None, "growth": None,
           "base_break_step": None, "base_spread_max": None, "reason": reason, "trap": is_trap(cfg),
           "sigma": cfg.init.scale(), "init": cfg.init.name, "lr": cfg.optim.lr, "p": getattr(cfg.data, "p", None),
           "seed": cfg.seed, "normalize": cfg.model.normalize, "precision": cfg.precision,
           "reduction": cfg.optim.reduction, "eps": cfg.optim.eps, "steps": cfg.optim.steps,
           "eval_every": cfg.eval_every, "K": cfg.data.K, "N": cfg.data.N, "M": cfg.model.M,
           "n_train": cfg.data.n_train, "n_test": cfg.data.n_test, "model": cfg.model.name, "data": cfg.data.name,
           "optim": cfg.optim.name}
    if traj is None:
        return out
    g = traj["growth"]
    logs = [math.log(x) for x in g if x > 0 and math.isfinite(x)]
    out.update(predicted_break_step=traj["break"][out["sigma"]], base_break_step=traj["break"][0.0],
               predicted_crossing_step=traj["crossing"].get(out["sigma"]),
               base_spread_max=traj["base_spread_max"],
               growth=[_finite(x) for x in g],
               growth_per_step=math.exp(sum(logs) / len(logs)) if logs and len(logs) == len(g) else None)
    return out


def predict(cfgs: list[RunConfig], device="cpu") -> list[dict]:
    """One prediction per config, in order (module docstring): `predicted_break_step` (null: the linearised
    state's spread stays ≤ BREAK_SPREAD through step T, or `reason` says why there is no prediction) and
    `predicted_crossing_step` (the step it crosses, before rounding up to the evaluated steps),
    `growth` (‖δ_{t+1}‖/‖δ_t‖ of the attention part (a, c), t = 0 … T−1), `growth_per_step` (its geometric
    mean), `base_break_step` (the zero-init run's own) and `base_spread_max` (its largest spread at the
    evaluated steps: exactly 0 on Thm 4.1's trap), `trap` (Thm 4.1's conditions hold) and the config's
    keys. Configs that differ only in σ (or precision, device, wandb…) share one trajectory; trajectories of
    one shape run batched, on `device` (the CPU by default; a GPU if the caller has one), in float64."""
    out: list = [None] * len(cfgs)
    for i, row in predict_each(cfgs, device):
        out[i] = row
    return out


def predict_each(cfgs: list[RunConfig], device="cpu"):
    """`predict`, as each prediction is ready: yields (index of the config, its row), the refused configs
    first, then each batch of trajectories' configs as the batch ends (so a caller can show progress and
    keep what is done when interrupted)."""
    reasons = [_refused(c) for c in cfgs]
    keys = [_trajectory_key(c) for c in cfgs]
    runs: dict[str, int] = {}  # trajectory key → index of its first config
    sigmas: dict[str, set] = {}
    by_key: dict[str, list] = {}
    for i, (c, k, why) in enumerate(zip(cfgs, keys, reasons)):
        if why is None:
            runs.setdefault(k, i)
            sigmas.setdefault(k, set()).add(c.init.scale())
            by_key.setdefault(k, []).append(i)
        else:
            yield i, _row(c, None, why)
    firsts = list(runs.items())
    for idx in loop.group_by(firsts, lambda kv: _shape_key(cfgs[kv[1]])).values():
        group = [firsts[j] for j in idx]
        c0 = cfgs[group[0][1]]
        chunk = max(1, MAX_ELEMENTS // (max(c0.data.n_train, c0.data.n_test) * (c0.data.N - 1)))
        for s in range(0, len(group), chunk):
            part = group[s:s + chunk]
            out = trajectories([cfgs[i] for _, i in part], [sorted(sigmas[k]) for k, _ in part], device)
            for (k, _), o in zip(part, out):
                for i in by_key[k]:
                    yield i, _row(cfgs[i], o, None)
