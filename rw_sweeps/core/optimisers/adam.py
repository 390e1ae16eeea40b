"""optim=adam: full-batch Adam, torch.optim.Adam's rule (no weight decay, no amsgrad). On the eq. 2.1 engine
its moments are kept in the compact coordinates (`rw_sweeps.core.adam`, which derives why that is exact)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..registry import option, rule
from .base import OptimConfig


class Eq21:
    """Adam on the compact state: V (and A) as they are, W through the moments of u = W x̂_N."""
    KERNEL = False  # the PyTorch path

    def __init__(self, cfgs: list, geo, dtype, device):
        from .. import (
            adam as compact,  # torch: only where a run trains (analysis reads the schemas without it)
        )

        self.compact, self.M = compact, cfgs[0].model.M
        self.hp = compact.hyper(cfgs, geo, dtype, device)

    def start(self, state) -> None:
        state.opt = self.compact.moments(state, self.M)

    def steps(self, state, data, eps, w, geo, n: int):
        return self.compact.train_steps(state, data, self.hp, eps, w, geo, n)


class Gpt:
    """model=gpt: m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², p ← p − (lr/bc₁)·m/(√v/√bc₂ + ε_A)."""
    decay = None  # AdamW's λ per run (its subclass)

    def __init__(self, col):
        self.beta1, self.beta2, self.eps = col("beta1"), col("beta2"), col("adam_eps")

    def state(self, params: dict) -> dict:
        import torch  # torch: only where a run trains

        return {f"{s}.{k}": torch.zeros_like(v) for k, v in params.items() for s in "mv"}

    def update(self, k: str, p, g, st: dict, lr, n: int, shape, decayed: bool):
        import torch  # torch: only where a run trains

        if self.decay is not None and decayed:  # AdamW: θ ← θ·(1 − lr·λ) before the Adam step
            p = p * (1 - shape(p, lr * self.decay))
        m, v = st["m." + k], st["v." + k]
        b1, b2 = shape(p, self.beta1), shape(p, self.beta2)
        m_new = m * b1 + (1 - b1) * g  # torch: exp_avg.lerp_(grad, 1 − β₁)
        v_new = v * b2 + (1 - b2) * g * g
        bc1, bc2 = 1 - self.beta1 ** n, 1 - self.beta2 ** n
        denom = torch.sqrt(v_new) / shape(p, torch.sqrt(bc2)) + shape(p, self.eps)
        return p - shape(p, lr / bc1) * m_new / denom, {"m." + k: m_new, "v." + k: v_new}


class Oracle:
    @staticmethod
    def make(params: list, o):
        import torch  # torch: only where a run trains

        return torch.optim.Adam(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.adam_eps)


@option("optim")
@dataclass
class Adam(OptimConfig):
    """Full-batch Adam: torch.optim.Adam's rule, no weight decay, no amsgrad (rw_sweeps/core/adam.py)."""
    name: str = "adam"
    beta1: float = field(default=0.9, metadata=rule(lo=0, hi=1, hi_open=True))  # first-moment decay
    beta2: float = field(default=0.999, metadata=rule(lo=0, hi=1, hi_open=True))  # second-moment decay
    # the denominator term, added to √v̂
    adam_eps: float = field(default=1e-8, metadata=rule(lo=0, lo_open=True))
    PER_RUN: ClassVar[tuple] = ("lr", "eps", "reduction", "beta1", "beta2", "adam_eps")
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}
