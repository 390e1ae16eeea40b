"""optim=sgd: torch.optim.SGD's rule with momentum (no dampening, no Nesterov): b ← μ·b + g, θ ← θ − lr·b,
with b = g at the first step (a zero buffer gives exactly that).

On the eq. 2.1 engine the buffer is kept in the compact coordinates. W's gradient is G_W = g_u x̂_Nᵀ
(`engine.Grads`), so W's buffer is B_W = b_u x̂_Nᵀ with b_u ← μ·b_u + g_u: linear in (grads.a, grads.c), so
buffers of those two halves (and of V, A) carry it exactly, and the step is GD's update (`engine.gd_update`)
with the buffers in the place of the gradients."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..registry import option, rule
from .base import OptimConfig
from .scheduled import Scheduled, refuse_schedule


class Eq21:
    KERNEL = False  # the PyTorch path

    @staticmethod
    def check(o) -> None:
        refuse_schedule(o, "eq21")

    def __init__(self, cfgs: list, geo, dtype, device):
        import torch  # torch and the engine only where a run trains: analysis reads the schemas without them

        from .. import engine

        self.engine = engine
        self.lr = torch.tensor([c.optim.lr for c in cfgs], dtype=dtype, device=device)
        self.mu = torch.tensor([c.optim.momentum for c in cfgs], dtype=dtype, device=device)

    def start(self, state) -> None:
        import torch  # torch: only where a run trains

        state.opt = {"b_a": torch.zeros_like(state.a), "b_c": torch.zeros_like(state.c),
                     **{"b_" + k: torch.zeros_like(v) for k, v in state.params.items()}}

    def steps(self, state, data, eps, w, geo, n: int):
        e = self.engine

        def one():
            loss, g = e.gradients(state, data, eps, w, geo)
            b = state.opt
            for key, grad in (("a", g.a), ("c", g.c), ("V", g.V), ("A", g.A)):
                if grad is not None:  # torch: buf.mul_(momentum).add_(grad)
                    b["b_" + key] = b["b_" + key] * self.mu.view(-1, *([1] * (grad.dim() - 1))) + grad
            e.gd_update(state, e.Grads(b["b_V"], b["b_a"], b["b_c"], b.get("b_A")), self.lr, geo)
            return loss

        return e.run_steps(state, n, one)


class Gpt:
    """model=gpt: b ← μ·b + g (b = g at the first step), p ← p − lr·b."""
    def __init__(self, col):
        self.mu = col("momentum")

    def state(self, params: dict) -> dict:
        import torch  # torch: only where a run trains

        return {"b." + k: torch.zeros_like(v) for k, v in params.items()}

    def update(self, k: str, p, g, st: dict, lr, n: int, shape, decayed: bool):
        b = g.clone() if n == 1 else shape(st["b." + k], self.mu) * st["b." + k] + g
        return p - shape(p, lr) * b, {"b." + k: b}


class Oracle:
    @staticmethod
    def make(params: list, o):
        import torch  # torch: only where a run trains

        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum)


@option("optim")
@dataclass
class Sgd(Scheduled, OptimConfig):
    """Stochastic gradient descent: torch.optim.SGD's rule with momentum, no dampening or Nesterov, on the
    batch of each step (the fixed training set, or a fresh batch with data.online)."""
    name: str = "sgd"
    lr: float = field(default=0.1, metadata=rule(lo=0, lo_open=True))
    momentum: float = field(default=0.0, metadata=rule(lo=0, hi=1, hi_open=True))  # μ: b ← μ·b + g, θ ← θ − lr·b
    PER_RUN: ClassVar[tuple] = ("lr", "eps", "reduction", "momentum")
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}
