"""model=gpt's optimisers, run by run in one batched update: every hyperparameter is a (R,) tensor.

GD and SGD (torch.optim.SGD's rule: b ← μ·b + g, b = g at the first step), Adam (torch.optim.Adam's) and
AdamW (torch.optim.AdamW's: θ ← θ·(1 − lr·λ), then the Adam step; nanoGPT's grouping: decay on matrices
and embeddings, not on biases or gains). The learning rate of step t is lr·w(t) (`factor`); clipping scales a
run's whole gradient to norm ≤ optim.clip, as torch.nn.utils.clip_grad_norm_ does. A run that is not live
(diverged) is not updated.
"""
from __future__ import annotations

import math

import torch

from ..config import AdamConfig, AdamWConfig, SgdConfig, _Scheduled


def factor(optim, t: int) -> float:
    """w(t) for the step from θ_t: (t + 1)/W for the W = round(warmup·T) warm-up steps, then 1 (constant) or
    (1 + cos(π·(t − W)/(T − W)))/2 (cosine)."""
    if not isinstance(optim, _Scheduled):
        return 1.0
    T = optim.steps
    W = round(optim.warmup * T)
    if t < W:
        return (t + 1) / W
    if optim.schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (t - W) / max(T - W, 1)))
    return 1.0


class Optimiser:
    """The update of R runs of one optimiser option; its state (`state`) is what a checkpoint saves."""

    def __init__(self, cfgs: list, params: dict, decayed: dict, dtype, device):
        o = cfgs[0].optim
        self.kind = "adam" if isinstance(o, AdamConfig) else "sgd" if isinstance(o, SgdConfig) else "gd"
        col = lambda key, default=0.0: torch.tensor([getattr(c.optim, key, default) for c in cfgs], dtype=dtype,  # noqa: E731
                                                    device=device)
        self.cfgs, self.decayed = cfgs, decayed
        self.lr = col("lr")
        self.clip = col("clip")
        self.clipping = any(getattr(c.optim, "clip", 0.0) > 0 for c in cfgs)  # known once: no read of the device
        self.momentum = col("momentum")
        self.beta1, self.beta2, self.eps = col("beta1", 0.9), col("beta2", 0.999), col("adam_eps", 1e-8)
        self.wd = col("weight_decay") if isinstance(o, AdamWConfig) else None
        self.state: dict = {"t": torch.zeros((), dtype=torch.int64)}
        if self.kind == "adam":
            for k, v in params.items():
                self.state["m." + k] = torch.zeros_like(v)
                self.state["v." + k] = torch.zeros_like(v)
        elif self.kind == "sgd":
            for k, v in params.items():
                self.state["b." + k] = torch.zeros_like(v)

    def step(self, params: dict, grads: dict, live: torch.Tensor, t: int) -> None:
        """One update of every live run from its gradients (in place)."""
        shape = lambda v, x: x.view(-1, *([1] * (v.dim() - 1)))  # noqa: E731 - (R,) against (R, …)
        lr = self.lr * factor(self.cfgs[0].optim, t)
        if self.clipping:
            norm = torch.sqrt(sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in grads.values()))
            coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0)
            coef = torch.where(self.clip > 0, coef, torch.ones_like(coef))
            grads = {k: g * shape(g, coef) for k, g in grads.items()}
        n = int(self.state["t"]) + 1
        for k, p in params.items():
            g = grads[k]
            keep = shape(p, live)
            if self.kind == "gd":
                new = p - shape(p, lr) * g
            elif self.kind == "sgd":
                b = self.state["b." + k]
                b_new = g.clone() if n == 1 else shape(b, self.momentum) * b + g
                self.state["b." + k] = torch.where(keep, b_new, b)
                new = p - shape(p, lr) * b_new
            else:
                if self.wd is not None and self.decayed[k]:
                    p = p * (1 - shape(p, lr * self.wd))
                m, v = self.state["m." + k], self.state["v." + k]
                b1, b2 = shape(p, self.beta1), shape(p, self.beta2)
                m_new = m * b1 + (1 - b1) * g  # torch: exp_avg.lerp_(grad, 1 − β₁)
                v_new = v * b2 + (1 - b2) * g * g
                bc1, bc2 = 1 - self.beta1 ** n, 1 - self.beta2 ** n
                denom = torch.sqrt(v_new) / shape(p, torch.sqrt(bc2)) + shape(p, self.eps)
                new = p - shape(p, lr / bc1) * m_new / denom
                self.state["m." + k] = torch.where(keep, m_new, m)
                self.state["v." + k] = torch.where(keep, v_new, v)
            params[k] = torch.where(keep, new, params[k])
        self.state["t"] = torch.tensor(n)
