"""The literal reference: eq. 2.1 with dense X̃ ∈ R^{(K+M)×N} and W ∈ R^{(K+M)×(K+M)}, trained by autograd.

It exists to hold the engine to the paper (tests) and as the one-run-per-process baseline of the
benchmarks. It is deliberately naive: memory is O(n·(K+M)·N) per run (≈0.8 GB at the §5 shape).
"""
from __future__ import annotations

import torch

from . import data as data_mod
from . import model
from .config import RunConfig


def embed(tokens: torch.Tensor, P: torch.Tensor, K: int, normalize: bool) -> torch.Tensor:
    """X̃ (n, K+M, N): column j < N is [e_{s_j}; p_j], column N is [0_K; p_N] (§2); unit-length if asked."""
    n, L = tokens.shape
    X = torch.zeros(n, K, L + 1, dtype=P.dtype)
    X[:, :, :L] = torch.nn.functional.one_hot(tokens, K).transpose(1, 2).to(P.dtype)
    Xt = torch.cat([X, P.T.expand(n, -1, -1)], 1)
    if normalize:
        Xt = Xt / Xt.norm(dim=1, keepdim=True)
    return Xt


def forward(theta: dict, X: torch.Tensor, Xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """f(X) = V X S(X̃ᵀ W x̃_N) (eq. 2.1) or A ReLU(V X S(·)) (F.1); the softmax runs over all N columns."""
    u = theta["W"] @ Xt[0, :, -1]  # x̃_N is the same for every sequence
    S = torch.softmax(torch.einsum("bdj,d->bj", Xt, u), dim=1)
    xs = torch.einsum("bkj,bj->bk", X, S)
    out = xs @ theta["V"].T
    if "A" in theta:
        out = torch.relu(out) @ theta["A"].T
    return out, S


def train(cfg: RunConfig, steps: int | None = None, record=None):
    """Train one run literally; returns the list of (step, V, mean attention (N,), theta) after each step."""
    dtype = getattr(torch, cfg.precision)
    train_set, _ = data_mod.make(cfg.data, cfg.seed)
    K, N = cfg.data.K, cfg.data.N
    P = model.positions(cfg.model, N, dtype)
    Xt = embed(train_set.tokens, P, K, cfg.model.normalize)
    X = Xt.new_zeros(train_set.tokens.shape[0], K, N)
    X[:, :, :-1] = torch.nn.functional.one_hot(train_set.tokens, K).transpose(1, 2).to(dtype)
    theta = initial(cfg, dtype)
    for t in theta.values():
        t.requires_grad_(True)
    y = train_set.y
    n = y.shape[0]
    w = 1.0 / n if cfg.optim.reduction == "mean" else 1.0
    out = []
    for t in range(steps if steps is not None else cfg.optim.steps):
        f, S = forward(theta, X, Xt)
        loss = -w * torch.log(f[torch.arange(n), y] + cfg.optim.eps).sum()
        grads = torch.autograd.grad(loss, list(theta.values()))
        with torch.no_grad():
            for p_, g_ in zip(theta.values(), grads):
                p_ -= cfg.optim.lr * g_
            _, S = forward(theta, X, Xt)
        out.append((t + 1, theta["V"].detach().clone(), S.mean(0).detach(), {k: v.detach().clone() for k, v in theta.items()}))
    return out


def initial(cfg: RunConfig, dtype) -> dict:
    """The dense initial θ: zeros, or the engine's own Gaussian draws (same generator, same order)."""
    K, M = cfg.data.K, cfg.model.M
    if cfg.init.name == "zero":
        theta = {"V": torch.zeros(K, K, dtype=dtype)}
        if cfg.model.name == "transformer_ffn":
            theta = {"A": torch.zeros(K, cfg.model.m, dtype=dtype), "V": torch.zeros(cfg.model.m, K, dtype=dtype)}
        theta["W"] = torch.zeros(K + M, K + M, dtype=dtype)
        return theta
    from .run import init_generator  # the engine's own seeding, so both start from the same draw

    return model.init_dense(cfg.model, K, cfg.init.sigma, init_generator(cfg.seed), dtype)
