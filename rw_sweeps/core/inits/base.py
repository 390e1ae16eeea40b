"""What every init has and must provide (`InitConfig`), and what each engine calls on an init's
implementation for it (`INIT_METHODS`: engine → its contract, a Protocol whose methods' names, signatures and
binding are checked when an init registers)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from omegaconf import MISSING

from ..registry import check_engines, implementation

if TYPE_CHECKING:
    from ..config import RunConfig


@dataclass
class InitConfig:
    """What every init has: its name, its scale and its σ axis. An init is a module of `rw_sweeps.core.inits`
    (its schema, its rules, and its implementation for each engine it serves, `ENGINES`: engine name →
    class); `implementation(engine)` gives it or refuses in one line. RunConfig's default is init=zero."""
    name: str = MISSING
    ENGINES: ClassVar[dict] = {}  # engine (a model's `ENGINE`) → the class that draws this init's θ(0) there
    # what model.normalize=auto resolves to with this init (the paper's protocol: whole with a Gaussian init)
    AUTO_NORMALIZE: ClassVar[str] = "none"

    @classmethod
    def registered(cls) -> None:
        name = cls.__dataclass_fields__["name"].default
        for method in ("scale", "unit"):
            if getattr(cls, method) is getattr(InitConfig, method):
                raise TypeError(f"init={name}: declares no {method}()")
        check_engines(cls, "init", INIT_METHODS)

    def validate(self, c: "RunConfig") -> None:
        """The init's rules beyond its fields' own (ConfigError, one line)."""

    def implementation(self, engine: str, model: str = "?"):
        return implementation(self, "init", engine, model)

    def scale(self) -> float:
        """The init's scale, what a run's summary records as `sigma`: σ, GPT-2's std, 0 for zero init."""
        raise NotImplementedError

    def unit(self) -> "InitConfig":
        """The init at unit scale: the draw of which every point of its σ axis is `scale()` times (the escape
        theory's δ_0; zero init is σ = 0 of init=gaussian's)."""
        raise NotImplementedError


class Eq21Init(Protocol):
    """An init on the compact engine of eq. 2.1 (`rw_sweeps.core.training`), called on the class."""

    @staticmethod
    def initial(cfg, geo, dtype):
        """One run's parameters V (and A) and the compact (a, c) of its W: (θ, engine state)."""

    @staticmethod
    def draw_bytes(cfg) -> int:
        """The peak memory of that draw, which the check before a run counts (`resources`)."""


class GptInit(Protocol):
    """An init of `model=gpt` (`rw_sweeps.core.gpt.model.init_params`), called on the class."""

    @staticmethod
    def weight(cfg, p, gen):
        """One weight matrix or embedding `p` (a `gpt.model.Param`), float64, from the run's init stream."""


class OracleInit(Protocol):
    """The literal dense θ the exactness tests train (`rw_sweeps.core.oracle.initial`), called on the class."""

    @staticmethod
    def dense(cfg, dtype) -> dict:
        """θ(0) of the dense model, by parameter name."""


# What an engine calls on an init's implementation for it (checked when an init registers).
INIT_METHODS = {"eq21": Eq21Init, "gpt": GptInit, "oracle": OracleInit}