"""optim=gd: full-batch gradient descent, eq. 2.3: θ ← θ − η ∇L."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..registry import option
from .base import OptimConfig


class Eq21:
    """The compact engine's GD step: the compiled multi-step kernel where it applies (`fused.train_steps`,
    which falls back to `engine.train_step` elsewhere). GD keeps no state of its own."""
    KERNEL = True  # its steps run in the compiled kernel (the batch's tokens are then bytes)

    def __init__(self, cfgs: list, geo, dtype, device):
        import torch  # torch and the engine only where a run trains: analysis reads the schemas without them

        self.lr = torch.tensor([c.optim.lr for c in cfgs], dtype=dtype, device=device)

    def start(self, state) -> None:
        """GD has no optimiser state."""

    def steps(self, state, data, eps, w, geo, n: int):
        from .. import fused  # torch: only where a run trains

        return fused.train_steps(state, data, self.lr, eps, w, geo, n)


class Gpt:
    """model=gpt: p ← p − lr·g."""
    def __init__(self, col):
        pass

    def state(self, params: dict) -> dict:
        return {}

    def update(self, k: str, p, g, st: dict, lr, n: int, shape, decayed: bool):
        return p - shape(p, lr) * g, {}


class Oracle:
    @staticmethod
    def make(params: list, o):
        import torch  # torch: only where a run trains

        return torch.optim.SGD(params, lr=o.lr)


@option("optim")
@dataclass
class Gd(OptimConfig):
    """Full-batch gradient descent (eq. 2.3) on ℓ = −log([f]_y + eps)."""
    name: str = "gd"
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}
    LINEARISED: ClassVar[bool] = True
