"""What every optimiser has and must provide (`OptimConfig`), and what each engine calls on an optimiser's
implementation for it (`ENGINE_METHODS`: engine → its contract, a Protocol whose methods' names, signatures
and binding are checked when an optimiser registers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

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
    # the keys above whose default an optimiser may set itself (its step size), keeping their meaning, type and
    # rule; any other key of this class an optimiser declares again (its own ε as `eps`, which would replace
    # the loss's) is refused when it registers (`registry.check_shadowing`)
    OPTION_DEFAULTS: ClassVar[tuple] = ("lr",)
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


class Eq21Rule(Protocol):
    """An optimiser on the compact engine of eq. 2.1 (`rw_sweeps.core.training`): built once for a batch of
    runs, then started and stepped."""

    def __init__(self, cfgs: list, geo, dtype, device):
        """The rule for these runs' configs (their per-run keys as tensors on `device`)."""

    def start(self, state) -> None:
        """The optimiser's own state in `state.opt` (which checkpoints carry)."""

    def steps(self, state, data, eps, w, geo, n: int):
        """n steps of every run: (the loss of each, which runs went non-finite)."""


class GptRule(Protocol):
    """An optimiser of `model=gpt` (`rw_sweeps.core.gpt.optim`): its update, parameter by parameter."""

    def __init__(self, col):
        """The rule, reading each per-run key as a column (`col(key)`)."""

    def state(self, params: dict) -> dict:
        """Its state for these parameters (by name)."""

    def update(self, k: str, p, g, st: dict, lr, n: int, shape, decayed: bool):
        """Parameter `k`'s step n from p with gradient g: (the new p, the state entries it changed)."""


class OracleRule(Protocol):
    """The literal torch.optim optimizer the exactness tests train the dense model with (`rw_sweeps.core.oracle`)."""

    @staticmethod
    def make(params: list, o):
        """A torch.optim optimizer over these tensors, with the optimiser config `o`'s values."""


# What an engine calls on an optimiser's implementation for it (checked when an optimiser registers).
ENGINE_METHODS = {"eq21": Eq21Rule, "gpt": GptRule, "oracle": OracleRule}