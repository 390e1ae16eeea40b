"""The literal reference: eq. 2.1 with dense X̃ ∈ R^{(K+M)×N} and W ∈ R^{(K+M)×(K+M)}, trained by autograd;
the forward after the logits is the run's model option's own (`ModelConfig.forward`).

It exists to hold the engine to the paper (tests) and as the one-run-per-process baseline of the
benchmarks. It is deliberately naive: memory is O(n·(K+M)·N) per run (≈0.8 GB at the §5 shape).
"""
from __future__ import annotations

import dataclasses
import json
import resource
import time

import torch
from omegaconf import OmegaConf

from . import data as data_mod
from . import model
from .config import RunConfig, from_dict, option_class
from .models import NORMALIZE_ALIASES, FfnModelConfig, ModelConfig


def embed(tokens: torch.Tensor, P: torch.Tensor, K: int, normalize: str) -> torch.Tensor:
    """X̃ (n, K+M, N): column j < N is [e_{s_j}; p_j], column N is [0_K; p_N] (§2), with the part that
    `normalize` names scaled to unit length, column by column: whole x̃_j, its positional part p_j, or its
    token part x_j (where it is not zero)."""
    n, L = tokens.shape
    X = torch.zeros(n, K, L + 1, dtype=P.dtype)
    X[:, :, :L] = torch.nn.functional.one_hot(tokens, K).transpose(1, 2).to(P.dtype)
    Pos = P.T.expand(n, -1, -1)
    where = NORMALIZE_ALIASES.get(normalize, normalize)
    if where == "positional":
        Pos = Pos / Pos.norm(dim=1, keepdim=True)
    elif where == "token":
        X = X / X.norm(dim=1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    Xt = torch.cat([X, Pos], 1)
    if where == "whole":
        Xt = Xt / Xt.norm(dim=1, keepdim=True)
    return Xt


def inputs(cfg: RunConfig, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X (n, K, N), the one-hot tokens with x_N's token part 0 (what the value path reads), and X̃ (embed)."""
    dtype, K, N = getattr(torch, cfg.precision), cfg.data.K, cfg.data.N
    Xt = embed(tokens, model.positions(cfg.model, N, dtype), K, cfg.model.normalize)
    X = Xt.new_zeros(tokens.shape[0], K, N)
    X[:, :, :-1] = torch.nn.functional.one_hot(tokens, K).transpose(1, 2).to(dtype)
    return X, Xt


def forward(theta: dict, X: torch.Tensor, Xt: torch.Tensor, model) -> tuple[torch.Tensor, torch.Tensor]:
    """f(X) and S at the dense θ: the logits z = X̃ᵀ W x̃_N, then the model option's own forward
    (`ModelConfig.forward`: eq. 2.1's V X S(z), F.1's, a temperature's, …). `model`: the run's model option,
    or for eq. 2.1 and F.1 the FFN's placement alone (`model.ffn`), read as F.1's where θ has A."""
    if isinstance(model, str):
        model = FfnModelConfig(ffn=model) if "A" in theta else ModelConfig()
    u = theta["W"] @ Xt[0, :, -1]  # x̃_N is the same for every sequence
    return model.forward(theta, X, torch.einsum("bdj,d->bj", Xt, u))


def train(cfg: RunConfig, steps: int | None = None, trajectory: bool = True):
    """Train one run literally: the dense θ, autograd, and the optimiser's own torch.optim optimizer (its
    `oracle` implementation: SGD for GD and momentum, Adam, AdamW); returns
    the list of (step, V, mean attention (N,), theta) after each step (only the last one without
    `trajectory`)."""
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
    o = cfg.optim
    opt = o.implementation("oracle", cfg.model.name).make(list(theta.values()), o)  # the literal torch.optim one
    out = []
    for t in range(steps if steps is not None else cfg.optim.steps):
        f, S = forward(theta, X, Xt, cfg.model)
        loss = -w * torch.log(f[torch.arange(n), y] + cfg.optim.eps).sum()
        grads = torch.autograd.grad(loss, list(theta.values()))
        with torch.no_grad():
            for p_, g_ in zip(theta.values(), grads):
                p_.grad = g_
            opt.step()
            if trajectory or t + 1 == (steps if steps is not None else cfg.optim.steps):
                _, S = forward(theta, X, Xt, cfg.model)
                out.append((t + 1, theta["V"].detach().clone(), S.mean(0).detach(),
                            {k: v.detach().clone() for k, v in theta.items()}))
    return out


def initial(cfg: RunConfig, dtype) -> dict:
    """The dense initial θ, as the run's init draws it for the literal model (its `oracle` implementation,
    `rw_sweeps.core.inits`): zeros, or the engine's own Gaussian draws (same generator, same order)."""
    return cfg.init.implementation("oracle", cfg.model.name).dense(cfg, dtype)


def main(argv: list[str]) -> None:
    """`python -m rw_sweeps.core.oracle key=value …`: one dense run, as a one-run-per-process baseline (with the
    literal dense Gaussian draw, init.draw=dense, for an init that has the key, unless the arguments say
    otherwise). Every key the arguments leave out reads at its schema default (`from_dict`)."""
    d = OmegaConf.to_container(OmegaConf.from_dotlist(argv))
    init = d.setdefault("init", {})
    if "draw" in {f.name for f in dataclasses.fields(option_class("init", init, "init"))}:
        init.setdefault("draw", "dense")  # only the Gaussian init draws; zero init has no such key
    cfg = from_dict(d)
    t0 = time.perf_counter()
    *_, (_, _, _, theta) = train(cfg, trajectory=False)
    _, test_set = data_mod.make(cfg.data, cfg.seed)
    X, Xt = inputs(cfg, test_set.tokens)
    with torch.no_grad():
        f, S = forward(theta, X, Xt, cfg.model)
    acc = (f.argmax(1) == test_set.y).double().mean().item()
    print(json.dumps({"test_acc": acc, "parent_attention": S[:, -2].mean().item(), "wall_s": time.perf_counter() - t0}))
    print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
