"""What every optimiser has and must provide (`OptimConfig`), and what each engine calls on an optimiser's
implementation for it (`ENGINE_METHODS`, checked when an optimiser registers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from omegaconf import MISSING

from ..registry import check_engines, implementation, rule

if TYPE_CHECKING:
    from ..config import RunConfig


@dataclass
class OptimConfig:
    """What every optimiser has: the loss it descends, ℓ = −log([f]_y + eps), and how long. An optimiser is a
    module of `rw_sweeps.core.optimisers` (its schema, its rules, and its implementation for each engine it
    serves, `ENGINES`: engine name → class); `implementation(engine)` gives it or refuses in one line."""
    name: str = MISSING
    lr: float = field(default=1.0, metadata=rule(lo=0, lo_open=True))  # η
    steps: int = field(default=50, metadata=rule(lo=1))  # T
    eps: float = field(default=0.1, metadata=rule(lo=0, lo_open=True))  # ε in ℓ(z) = −log(z + ε)
    # mean | sum of the per-sequence losses (§8.3, §8.10)
    reduction: str = field(default="mean", metadata=rule(choices=("mean", "sum")))
    PER_RUN: ClassVar[tuple] = ("lr", "eps", "reduction")
    ENGINES: ClassVar[dict] = {}  # engine (a model's `ENGINE`) → the class that trains with this optimiser there
    LINEARISED: ClassVar[bool] = False  # is its step eq. 2.3's GD step (what the escape theory linearises)?

    @classmethod
    def registered(cls) -> None:
        check_engines(cls, "optim", ENGINE_METHODS)

    def validate(self, c: "RunConfig") -> None:
        """The optimiser's rules beyond its fields' own (ConfigError, one line)."""

    def implementation(self, engine: str, model: str = "?"):
        return implementation(self, "optim", engine, model)

    def decays(self, role: str) -> bool:
        """On model=gpt: does a weight decay (where the optimiser has one) apply to a parameter of this role
        (`rw_sweeps.core.gpt.model.Param`)? The weight matrices and embeddings, not biases or LayerNorm gains
        (nanoGPT's groups)."""
        return role in ("matrix", "residual", "embed")

    def lr_factor(self, t: int) -> float:
        """The learning rate of the step from θ_t is lr·lr_factor(t): 1 without a schedule."""
        return 1.0


# What an engine calls on an optimiser's implementation for it (checked when an optimiser registers).
ENGINE_METHODS = {"eq21": ("start", "steps"), "gpt": ("state", "update"), "oracle": ("make",)}