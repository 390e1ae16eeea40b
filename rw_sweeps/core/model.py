"""The one-layer transformer of eq. 2.1, f(X) = V·X·S(X̃ᵀ W x̃_N), and its FFN variant F.1,
f(X) = A·ReLU(V·X·S(X̃ᵀ W x̃_N)) (`model.ffn=after`) or, with the FFN before the attention, per token,
f(X) = Σ_i S_i·A·ReLU(V x_i) = A·ReLU(V)·X·S (`model.ffn=before`: one-hot x_i pick columns of ReLU(V), and
x_N's token part is 0), in the compact form the engine trains.

Why compact: x̃_N = [0_K; p_N] is the same for every sequence, so the W-gradient is rank one, (·)·x̃_Nᵀ
(paper §2), and the attention only ever sees u = W x̃_N ∈ R^{K+M}. With one-hot tokens a logit splits into
a token part and a positional part:

    z_bj = a[s_bj] / ν_tok + c_j / ν_pos   (j < N),      z_bN = c_N / ν_q,

with a = u[:K] and c_j = p_jᵀ u[K:]. The ν are what `model.normalize` divides x̃'s parts by to put
unit-length x̂ inside the softmax (§4; `Geometry`): ν_tok = ν_pos = ‖x̃_j‖ for whole, ν_pos = ‖p‖ alone for
positional, 1 for none (and token, the identity on one-hot x_j). Because p_iᵀp_j = ‖p‖²·1[i=j] exactly for the sine embedding (Lemma E.5), c moves
by ‖p‖² times its own gradient, and nothing of size M is touched after the initial state. Using the exact
Gram identity also keeps Theorem 4.1's symmetric point exact in floating point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from .models.base import NORMALIZE_ALIASES

if TYPE_CHECKING:
    from .models.transformer import ModelConfig


def positions(cfg: ModelConfig, N: int, dtype=torch.float64) -> torch.Tensor:
    """P = [p_1..p_N] as rows (N, M): [p_i]_j = pos_scale · sin(π i j / D), D = M or M + 1 (§2.1 [G])."""
    D = cfg.M if cfg.pos_denom == "M" else cfg.M + 1
    i = torch.arange(1, N + 1, dtype=torch.float64)[:, None]
    j = torch.arange(1, cfg.M + 1, dtype=torch.float64)[None, :]
    return (cfg.pos_scale * torch.sin(math.pi * i * j / D)).to(dtype)


@dataclass
class Geometry:
    """What the compact model needs of the embeddings and of its reading, fixed per shape."""

    pp: float  # ‖p_i‖², equal for every i (Lemma D.3 uses it)
    nu_tok: float  # what the token part of x̃_j (j < N) is divided by inside the softmax (1: not at all)
    nu_q: float  # what x̃_N is divided by inside the softmax
    kappa: float  # ‖x̂_N‖²: u = W x̂_N moves by −lr·κ·G
    gram: Optional[torch.Tensor]  # (N, N) numeric P Pᵀ, or None for the exact identity ‖p‖²·I
    nu_pos: float = 1.0  # what the positional part of x̃_j (j < N) is divided by (= nu_tok but for positional)
    ffn: str = "after"  # where the FFN of F.1 sits (model.ffn; transformer_ffn only): after | before the attention
    # the model option whose forward these runs compute (its reference, `ModelConfig.forward`), and the
    # implementations of it they may take (its `IMPLEMENTATIONS`); a bare Geometry is eq. 2.1's engine and kernel
    model: Optional[ModelConfig] = field(default=None, compare=False, repr=False)
    paths: tuple = ("engine", "kernel")


def geometry(cfg: ModelConfig, N: int) -> Geometry:
    """The geometry of the model option's runs of length N, as the option gives it (`ModelConfig.geometry`)."""
    return cfg.geometry(N)


def embedding(cfg: ModelConfig, N: int) -> Geometry:
    """eq. 2.1's geometry: the sine embedding's ‖p‖², the ν of `model.normalize`, and the option's forward and
    declared implementations."""
    D = cfg.M if cfg.pos_denom == "M" else cfg.M + 1
    pp = cfg.pos_scale ** 2 * D / 2  # Σ_j sin²(π i j / D) = D/2 for 1 ≤ i < D
    gram = None
    if cfg.gram == "numeric":
        P = positions(cfg, N)
        gram = P @ P.T
    where = NORMALIZE_ALIASES.get(cfg.normalize, cfg.normalize)
    if where == "whole":  # x̂_j = [e_s; p_j] / √(1 + ‖p‖²), x̂_N = [0; p_N] / ‖p‖
        nu_tok = nu_pos = math.sqrt(1 + pp)
        nu_q, kappa = math.sqrt(pp), 1.0
    elif where == "positional":  # x̂_j = [e_s; p_j / ‖p‖]: only the positional part has unit length
        nu_tok, nu_pos, nu_q, kappa = 1.0, math.sqrt(pp), math.sqrt(pp), 1.0
    elif where in ("none", "token"):  # a one-hot x_i already has unit length; x_N's token part is 0
        nu_tok, nu_pos, nu_q, kappa = 1.0, 1.0, 1.0, pp
    else:
        raise ValueError(f"model.normalize={where!r}: must be one of none, whole, positional, token (auto is "
                         "resolved by RunConfig)")
    return Geometry(pp, nu_tok, nu_q, kappa, gram, nu_pos, cfg.ffn, cfg, type(cfg).IMPLEMENTATIONS)


@dataclass
class Attention:
    """The factorised softmax of one batch: exp(z_bj − m) = α[s_bj]·β_j, so S_bj = α[s_bj] β_j / Z_b."""

    alpha: torch.Tensor  # (R, K)
    beta: torch.Tensor  # (R, N−1)
    Z: torch.Tensor  # (R, n)
    h: torch.Tensor  # (R, n, K) the weighted-average token X·S = Σ_{j<N} S_bj e_{s_bj}
    S_q: torch.Tensor  # (R, n) the attention on the query column, wasted mass (§2)


def attend(a: torch.Tensor, c: torch.Tensor, tokens: torch.Tensor, geo: Geometry) -> Attention:
    """Softmax over all N columns (query included, §2) without materialising the (R, n, N) logits."""
    R, n, L = tokens.shape
    za, zc, zq = a / geo.nu_tok, c[:, :L] / geo.nu_pos, c[:, L:] / geo.nu_q
    ma = za.amax(1, keepdim=True)
    m = torch.maximum(ma + zc.amax(1, keepdim=True), zq)  # one stabiliser per run: z − m ≤ 0
    alpha, beta, beta_q = torch.exp(za - ma), torch.exp(zc - (m - ma)), torch.exp(zq - m)
    # H_bk = Σ_{j<N: s_bj = k} β_j, the β-weighted token histogram (one of two O(n·N) passes).
    H = torch.zeros(R, n, a.shape[1], dtype=a.dtype, device=a.device).scatter_add_(2, tokens, beta[:, None, :].expand(R, n, L))
    AH = alpha[:, None, :] * H
    Z = AH.sum(2) + beta_q
    return Attention(alpha, beta, Z, AH / Z[..., None], beta_q / Z)


def output(params: dict, h: torch.Tensor, ffn: str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """f = V h (eq. 2.1), f = A ReLU(V h) (F.1, ffn=after) or f = A ReLU(V) h (F.1, ffn=before), h = X·S.
    Returns f (R, n, K) and, for ffn=after, the pre-activation r = V h (R, n, m) (else None)."""
    V = params["V"]
    if "A" not in params:
        return torch.bmm(h, V.transpose(1, 2)), None
    if ffn == "before":
        return torch.bmm(h, value_before(params).transpose(1, 2)), None
    r = torch.bmm(h, V.transpose(1, 2))
    return torch.bmm(torch.relu(r), params["A"].transpose(1, 2)), r


def value_before(params: dict) -> torch.Tensor:
    """A·ReLU(V) (R, K, K): with the FFN before the attention, Σ_i S_i A ReLU(V x_i) for one-hot x_i (and
    x_N's token part 0, which adds A·ReLU(0) = 0) is this matrix times h = X·S, as V h is in eq. 2.1."""
    return torch.bmm(params["A"], torch.relu(params["V"]))


INIT_STREAM = (0x9E3779B1, 0x7F4A7C15)  # s ↦ (a·s + b) mod 2³²: odd a and odd b, so never s itself


def init_seed(seed: int) -> int:
    """The seed of a run's initial parameters. torch seeds MT19937 from the low 32 bits only, so seed + 2³²
    (what this once was) gave the data's own stream: a bijection with no fixed point gives every run an
    init stream that is not its data stream (it is another seed's, which no run shares with itself)."""
    a, b = INIT_STREAM
    return (a * seed + b) % 2**32


def init_generator(seed: int) -> torch.Generator:
    """Initial parameters get their own stream, so changing n_train or n_test leaves them unchanged."""
    return torch.Generator().manual_seed(init_seed(seed))


def _draw_AV(cfg_model: ModelConfig, K: int, sigma: float, gen: torch.Generator) -> dict:
    """A (FFN) then V ~ N(0, σ²) i.i.d., float64: the first draws of both Gaussian inits."""
    out = {}
    if cfg_model.is_ffn:
        out["A"] = sigma * torch.randn(K, cfg_model.m, generator=gen, dtype=torch.float64)
        out["V"] = sigma * torch.randn(cfg_model.m, K, generator=gen, dtype=torch.float64)
    else:
        out["V"] = sigma * torch.randn(K, K, generator=gen, dtype=torch.float64)
    return out


def init_dense(cfg_model: ModelConfig, K: int, sigma: float, gen: torch.Generator, dtype) -> dict:
    """The literal initial parameters: A (FFN), V, W ~ N(0, σ²) i.i.d. (§4), drawn in that order."""
    out = _draw_AV(cfg_model, K, sigma, gen)
    out["W"] = sigma * torch.randn(K + cfg_model.M, K + cfg_model.M, generator=gen, dtype=torch.float64)
    return {k: v.to(dtype) for k, v in out.items()}


def init_compact(cfg_model: ModelConfig, K: int, N: int, sigma: float, gen: torch.Generator, geo: Geometry,
                 dtype) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
    """The Gaussian initial state drawn compactly (`init.draw=compact`): A (FFN) and V exactly as
    `init_dense` draws them (same generator, same order, so the same sample), then (a, c) of W directly
    instead of the dense (K+M)² W. u = W x̂_N has i.i.d. N(0, σ²κ) entries (κ = ‖x̂_N‖²), a = u[:K], and with
    the exact Gram c = P u[K:] is i.i.d. N(0, σ²κ‖p‖²): the dense draw's distribution, not its sample.
    With gram=numeric the rounded P Pᵀ is the point of the run, so u[K:] ∈ R^M is drawn and c = P u[K:]
    is taken literally: c's law is then exactly N(0, σ²κ P Pᵀ) for whatever Gram P has (M normals, still
    no (K+M)² draw)."""
    params = _draw_AV(cfg_model, K, sigma, gen)
    scale = sigma * math.sqrt(geo.kappa)
    a = scale * torch.randn(K, generator=gen, dtype=torch.float64)
    if cfg_model.gram == "numeric":
        c = positions(cfg_model, N) @ (scale * torch.randn(cfg_model.M, generator=gen, dtype=torch.float64))
    else:
        c = scale * math.sqrt(geo.pp) * torch.randn(N, generator=gen, dtype=torch.float64)
    return {k: v.to(dtype) for k, v in params.items()}, (a.to(dtype), c.to(dtype))


def dense_W(a: torch.Tensor, c: torch.Tensor, cfg_model: ModelConfig, K: int, N: int, geo: Geometry,
            dtype=torch.float64) -> torch.Tensor:
    """A dense W ∈ R^{(K+M)×(K+M)} whose compact state is (a, c) (to rounding), so that the dense oracle can
    start from a compact draw: W = u x̂_Nᵀ / ‖x̂_N‖² gives W x̂_N = u, with u[:K] = a and u[K:] the
    minimum-norm solution of P u[K:] = c, Pᵀ c / ‖p‖² for the exact Gram (Pᵀ(P Pᵀ)⁻¹ c for gram=numeric).
    Only u = W x̂_N enters eq. 2.1's forward pass and W's gradient is rank one along x̂_N, so the dense
    dynamics from this W are those of (a, c)."""
    P = positions(cfg_model, N, torch.float64)
    a, c = a.to(torch.float64), c.to(torch.float64)
    if cfg_model.gram == "numeric":
        uM = P.T @ torch.linalg.solve(P @ P.T, c)
    else:
        uM = P.T @ c / geo.pp
    u = torch.cat([a, uM])
    x_hat = torch.cat([torch.zeros(K, dtype=torch.float64), P[-1] / geo.nu_q])
    return (torch.outer(u, x_hat) / (x_hat @ x_hat)).to(dtype)


def compact(W: torch.Tensor, cfg_model: ModelConfig, K: int, N: int, geo: Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, c) of a dense W: u = W x̂_N, a = u[:K], c_j = p_jᵀ u[K:]."""
    P = positions(cfg_model, N, W.dtype)
    u = W[:, K:] @ (P[-1] / geo.nu_q)
    return u[:K].clone(), P @ u[K:]
