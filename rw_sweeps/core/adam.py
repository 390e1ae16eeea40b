"""Full-batch Adam (`optim=adam`) for R runs in the compact state: torch.optim.Adam's rule on the dense θ
(no weight decay, no amsgrad), without ever forming W or its (K+M)² moments.

torch.optim.Adam, per parameter entry, at step t = 1, 2, …:

    m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²,   θ ← θ − (lr / bc₁) · m / (√v / √bc₂ + ε_A),

bc₁ = 1 − β₁ᵗ, bc₂ = 1 − β₂ᵗ, moments starting at 0. V (and A for the FFN) take this rule as it stands.

W. Only u = W x̂_N enters the model, so W's gradient is always G_W = g_u x̂_Nᵀ with g_u = ∂L/∂u ∈ R^{K+M}
(Lemma B.1): g_u[:K] = grads.a and g_u[K:] = Pᵀ grads.c (P = model.positions: rows p_j; c_j = p_jᵀ u[K:]).
The moments are linear in g and in g² and start at 0, so at every step

    m_W = m_u x̂_Nᵀ,   v_W = v_u (x̂_N²)ᵀ,

and only the (K+M)-vectors m_u, v_u are kept (`State.opt`, so checkpoints carry them). Adam's update of W,

    ΔW_ij = −(lr / bc₁) · m_u,i x̂_j / (s_i |x̂_j| + ε_A),   s_i = √v_u,i / √bc₂,

is not rank one (the denominator mixes i and j), but the model only sees Δu = ΔW x̂_N:

    Δu_i = −(lr / bc₁) · m_u,i · φ(s_i),   φ(s) = Σ_j x̂_j² / (s |x̂_j| + ε_A),

the sum over the M positional entries of x̂_N = [0_K; p_N / ν_q] (its token part is 0). Then a += Δu[:K]
and c += P Δu[K:]. The part of W off x̂_N moves too, but nothing ever reads it (the dense oracle's W,
reduced to (a, c) by `model.compact`, is what the tests compare).

Cost. φ at K+M points over M entries directly is (K+M)·M per run and step, more than the gradient itself
at the §5 shape. Two exact reductions:
 1. Grouping. For the sine embedding |x̂_j| ∝ |sin(π N j / D)| depends only on min(k, D − k), k = N j mod D,
    so the sum runs over those G ≤ D/2 + 1 distinct values r_g (ascending), each weighted by q_g = Σ x̂_j²
    over its entries (G = 501 for N = 97, D = 1000; 6 for N = 100). Exact in real arithmetic: only the
    rounding of mathematically equal sines differs between an entry and its group's value.
 2. A series for the large |x̂_j|. With ρ_g = ε_A / (s r_g), 1 / (s r_g + ε_A) = (1 / (s r_g)) Σ_k (−ρ_g)^k,
    so for a split J (every group g ≥ J has ρ_g ≤ ρ_J) and n terms:

        φ(s) = Σ_{g<J} q_g / (s r_g + ε_A)  +  (1/s) Σ_{k<n} T_{J,k} (−ρ_J)^k,   T_{J,k} = Σ_{g≥J} (q_g / r_g)(r_J / r_g)^k.

    Each group's term is positive and its truncated series is off by the factor 1 − (−ρ_g)^n, so the
    series part's relative error is ≤ ρ_Jⁿ: with ρ_J ≤ 1/4 and n = SERIES_TERMS = 27, 4⁻²⁷ ≈ 6e-17, below float64's
    half ulp. A point takes the smallest split J ∈ {0, 1, 2, 4, 8, …} with ρ_J ≤ 1/4, i.e. r_J ≥ 4 ε_A / s
    (J = G, all direct, when there is none, e.g. at s = 0): in §5-shape training a point sums about a
    dozen groups directly instead of 501. The tables T are per batch, (log₂ G) × n.
    On a GPU every point is summed directly (its throughput makes that cheap, and choosing the splits
    would read the device back every step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import engine, model
from .model import Geometry
from .models import ModelConfig

if TYPE_CHECKING:
    from .config import RunConfig

CHUNK = 1 << 18  # entries of the (points × groups) block a direct sum takes at once (2 MiB in float64)
GPU_CHUNK = 1 << 24  # the same on a GPU, where fewer, larger kernels pay
POINTS = 1 << 16  # points φ is taken at per pass (bounds the (points × SERIES_TERMS) powers too)
SERIES_RHO, SERIES_TERMS = 0.25, 27  # the series where ρ ≤ 1/4, to ρ^26: relative error ≤ 4⁻²⁷


@dataclass
class Hyper:
    """What Adam needs per batch: the per-run constants (R,) and the query's embedding entries."""

    lr: torch.Tensor
    beta1: torch.Tensor
    beta2: torch.Tensor
    eps: torch.Tensor  # ε_A, added to √v̂ (not the loss's ε)
    P: torch.Tensor  # (N, M) positions p_j as rows
    r: torch.Tensor  # (G,) the distinct nonzero |x̂_j| of x̂_N's positional part, ascending
    q: torch.Tensor  # (G,) Σ x̂_j² over the entries j with that |x̂_j|
    splits: torch.Tensor  # (S,) int64: the splits J = 0, 1, 2, 4, … below G
    r_split: torch.Tensor  # (S,) r_J at each split
    T: torch.Tensor  # (S, SERIES_TERMS) the series' coefficients T_{J,k} at each split


def query_groups(cfg: ModelConfig, N: int, geo: Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, q) of `Hyper`, float64: the entries x̂_j = [p_N]_j / ν_q grouped by the integer key of |sin|."""
    D = cfg.M if cfg.pos_denom == "M" else cfg.M + 1
    k = N * torch.arange(1, cfg.M + 1) % D  # sin(π N j / D) = ±sin(π k / D)
    key = torch.minimum(k, D - k)  # sin(π (D − k) / D) = sin(π k / D)
    x = model.positions(cfg, N)[-1].abs() / geo.nu_q
    _, group, count = torch.unique(key, return_inverse=True, return_counts=True)
    G = len(count)
    r = torch.zeros(G, dtype=x.dtype).index_add_(0, group, x) / count
    q = torch.zeros(G, dtype=x.dtype).index_add_(0, group, x * x)
    keep = q > 0  # an x̂_j = 0 adds nothing (and would divide 0 by 0 in T)
    r, q = r[keep], q[keep]
    order = r.argsort()
    return r[order], q[order]


def series(r: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The splits J = 0, 1, 2, 4, … < G and T_{J,k} = Σ_{g≥J} (q_g / r_g)(r_J / r_g)^k, float64."""
    splits = [0] + [1 << b for b in range(max(len(r) - 1, 0).bit_length())]
    k = torch.arange(SERIES_TERMS, dtype=r.dtype)
    T = [((r[J] / r[J:])[:, None] ** k * (q[J:] / r[J:])[:, None]).sum(0) for J in splits if J < len(r)]
    return torch.tensor(splits[:len(T)], dtype=torch.int64), torch.stack(T) if T else r.new_zeros(0, SERIES_TERMS)


def hyper(cfgs: list[RunConfig], geo: Geometry, dtype, device) -> Hyper:
    c0 = cfgs[0]
    per_run = lambda key: torch.tensor([getattr(c.optim, key) for c in cfgs], dtype=dtype, device=device)  # noqa: E731
    r, q = query_groups(c0.model, c0.data.N, geo)
    splits, T = series(r, q)
    on = lambda x: x.to(device, dtype)  # noqa: E731
    return Hyper(per_run("lr"), per_run("beta1"), per_run("beta2"), per_run("adam_eps"),
                 on(model.positions(c0.model, c0.data.N)), on(r), on(q), splits, on(r[splits]), on(T))


def moments(state: engine.State, M: int) -> dict:
    """Adam's zero moments for a fresh state: of u = W x̂_N (R, K+M), of V and of A (as they are)."""
    R, K = state.a.shape
    out = {"m_u": state.a.new_zeros(R, K + M), "v_u": state.a.new_zeros(R, K + M)}
    for name, p in state.params.items():
        out["m_" + name], out["v_" + name] = torch.zeros_like(p), torch.zeros_like(p)
    return out


def _per_run(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.view(-1, *([1] * (like.dim() - 1)))


def _moments(m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, hp: Hyper) -> None:
    """m ← β₁ m + (1 − β₁) g, v ← β₂ v + (1 − β₂) g², in place (as torch: lerp, then mul and add)."""
    b1, b2 = _per_run(hp.beta1, g), _per_run(hp.beta2, g)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).add_((1 - b2) * g * g)


def phi(s: torch.Tensor, hp: Hyper) -> torch.Tensor:
    """φ(s) = Σ_j x̂_j² / (s |x̂_j| + ε_A) for every entry of s (R, D), ε_A per run (see the module docstring)."""
    R, D = s.shape
    flat, e = s.reshape(-1), hp.eps.repeat_interleave(D)
    if flat.is_cuda or not len(hp.splits):
        return _direct(flat, e, hp.r, hp.q, GPU_CHUNK if flat.is_cuda else CHUNK).view(R, D)
    out = torch.empty_like(flat)
    for i in range(0, len(flat), POINTS):
        out[i:i + POINTS] = _split_sum(flat[i:i + POINTS], e[i:i + POINTS], hp)
    return out.view(R, D)


def _split_sum(s: torch.Tensor, e: torch.Tensor, hp: Hyper) -> torch.Tensor:
    """φ at the points s (flat): each point's groups below its split directly, the rest by the series."""
    S, G = len(hp.splits), len(hp.r)
    # a point's split i: the first J with ρ_J ≤ ρ_max, i.e. r_J ≥ ε_A / (ρ_max s) (i = S: none, all direct)
    split, order = torch.searchsorted(hp.r_split, e / (SERIES_RHO * s)).sort()
    bounds = torch.searchsorted(split, torch.arange(S + 2, device=split.device)).tolist()
    out = torch.empty_like(s)
    for i in range(S + 1):
        if bounds[i] == bounds[i + 1]:
            continue
        idx = order[bounds[i]:bounds[i + 1]]
        s_, e_ = s[idx], e[idx]
        J = int(hp.splits[i]) if i < S else G
        part = _direct(s_, e_, hp.r[:J], hp.q[:J])
        if J < G:
            part += (hp.T[i, 0] + _powers(-e_ / (s_ * hp.r[J]), SERIES_TERMS - 1) @ hp.T[i, 1:]) / s_
        out[idx] = part
    return out


def _powers(x: torch.Tensor, n: int) -> torch.Tensor:
    """(len(x), n): x^1 … x^n by doubling (log₂ n broadcast products rather than a sequential cumprod)."""
    out = x.new_empty(len(x), n)
    out[:, 0] = x
    have = 1
    while have < n:  # out[:, :have] is x^1 … x^have: times x^have gives the next ones
        take = min(have, n - have)
        out[:, have:have + take] = out[:, :take] * out[:, have - 1:have]
        have += take
    return out


def _direct(s: torch.Tensor, e: torch.Tensor, r: torch.Tensor, q: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Σ_g q_g / (s r_g + e) for every point (s, e flat), in blocks of at most `chunk` entries."""
    out = s.new_zeros(s.shape)
    if not len(r):
        return out
    rows = max(1, chunk // len(r))
    for i in range(0, len(s), rows):
        den = torch.outer(s[i:i + rows], r).add_(e[i:i + rows, None])
        out[i:i + rows] = den.reciprocal_() @ q
    return out


def step(state: engine.State, grads: engine.Grads, hp: Hyper) -> None:
    """One Adam step on every run, in place (V and A are replaced by new tensors, as engine.gd_update does)."""
    if state.opt is None:
        raise ValueError("optim=adam needs the state's moments (adam.moments) and it has none")
    opt, K = state.opt, state.a.shape[1]
    t = state.step + 1
    step_size = hp.lr / (1 - hp.beta1 ** t)  # lr / bc₁
    bc2_sqrt = (1 - hp.beta2 ** t).sqrt()
    for name, g in (("V", grads.V), ("A", grads.A)):
        if g is None:
            continue
        m, v = opt["m_" + name], opt["v_" + name]
        _moments(m, v, g, hp)
        den = (v.sqrt() / _per_run(bc2_sqrt, v)).add_(_per_run(hp.eps, v))
        state.params[name] = state.params[name] - _per_run(step_size, m) * m / den
    m, v = opt["m_u"], opt["v_u"]
    _moments(m, v, torch.cat([grads.a, grads.c @ hp.P], 1), hp)
    du = -step_size[:, None] * m * phi(v.sqrt() / bc2_sqrt[:, None], hp)
    state.a += du[:, :K]
    state.c += du[:, K:] @ hp.P.T
    state.step += 1


def train_steps(state: engine.State, data: engine.Batch, hp: Hyper, eps: torch.Tensor, w: torch.Tensor,
                geo: Geometry, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` Adam steps on every run; returns (loss (R, steps), bad (R,)) as fused.train_steps does: the
    loss before each step, and the first step whose loss or updated parameters are not finite (or −1)."""
    def one() -> torch.Tensor:
        loss, grads = engine.gradients(state, data, eps, w, geo)
        step(state, grads, hp)
        return loss

    return engine.run_steps(state, steps, one)
