"""The model options of eq. 2.1: what every model option has (`ModelBase`: its training loop, its engine),
the transformer of eq. 2.1 and its FFN variant (App. F.1). model=gpt's schema is `rw_sweeps.core.gpt.schema`."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from omegaconf import MISSING

from .errors import ConfigError
from .registry import choice, option

if TYPE_CHECKING:
    from .config import RunConfig
    from .inits.base import InitConfig

NORMALIZE = ("none", "whole", "positional", "token")
# bools (and what OmegaConf makes of a bool given to a str key) read as before model.normalize was a string
NORMALIZE_ALIASES = {True: "whole", False: "none", "True": "whole", "False": "none", "true": "whole",
                     "false": "none"}

def resolve_normalize(model, init):
    """model.normalize=auto → whole with a Gaussian init, none otherwise (the paper's protocol); a copy."""
    where = NORMALIZE_ALIASES.get(model.normalize, model.normalize)
    if where == "auto":
        where = init.AUTO_NORMALIZE
    return model if where == model.normalize else dataclasses.replace(model, normalize=where)


@dataclass
class ModelBase:
    """What every model option has: its name, and the training loop that trains it (`TRAINER`, a module of
    `rw_sweeps.core` with `train`, `summary`, `prefetch` and `run_bytes`: `rw_sweeps.core.trainer`)."""
    name: str = MISSING
    PER_RUN: ClassVar[tuple] = ()
    TRAINER: ClassVar[str] = ""
    ENGINE: ClassVar[str] = ""  # the engine its trainer is (what an optimiser or init implements for it)
    # why the escape theory (`rw_sweeps.core.theory`, the linearised GD step of eq. 2.1) does not describe
    # this model, or None where it does
    ESCAPE_THEORY: ClassVar[Optional[str]] = "the escape theory linearises eq. 2.1's GD step (model=transformer)"
    KERNEL: ClassVar[bool] = False  # does the compiled kernel (`rw_sweeps.core.fused`) train it?
    # what `precision=auto` (the default) trains it in: float64 for eq. 2.1, whose exactness (Theorem 4.1's
    # symmetric point, the tests' 1e-8 agreement with literal autograd) the paper's claims rest on
    PRECISION: ClassVar[str] = "float64"

    def resolved(self, init: "InitConfig") -> "ModelBase":
        """The model with what depends on the init resolved (model.normalize=auto); a copy where it changes."""
        return self

    def validate(self, c: "RunConfig") -> None:
        """The model's own rules, given the whole run (ConfigError, one line)."""

    def recorded(self, c: "RunConfig") -> tuple[int, int]:
        """Numbers in one history row and in one snapshot row of a run of this model, as its trainer records
        them: `rw_sweeps.core.contract.written` bounds a run's files with them, so that a run whose files its
        readers would refuse is refused before it trains."""
        raise NotImplementedError(f"model={self.name} does not say what its records hold (recorded)")


@option("model")
@dataclass
class ModelConfig(ModelBase):
    """eq. 2.1: f(X) = V X S(X̃ᵀ W x̃_N), X̃ = [X; P]."""
    name: str = "transformer"
    M: int = 1000  # positional-embedding dimension
    # where x̃_i is scaled to unit length inside the attention only (§4, §8.5; the value path keeps one-hot
    # x_i): auto (the paper's protocol: whole with init=gaussian, none with init=zero) | none | whole (x̃_i)
    # | positional (p_i only, x̃_i = [x_i; p_i/‖p_i‖]) | token (x_i only: the identity on one-hot tokens, so
    # the same as none; kept so that a reading search can say so). true/false are read as whole/none.
    normalize: str = "auto"
    pos: str = "sine"  # [p_i]_j = pos_scale · sin(π i j / D), j = 1..M (§2.1)
    pos_denom: str = "M"  # D = M (spec's choice) | "M+1" (DST-I basis)
    pos_scale: float = 1.0
    gram: str = "exact"  # exact: p_iᵀp_j = ‖p‖²·1[i=j] | numeric: P Pᵀ as rounded (fragility studies, §8.9)
    PER_RUN: ClassVar[tuple] = ()
    TRAINER: ClassVar[str] = "rw_sweeps.core.training"
    ENGINE: ClassVar[str] = "eq21"
    ESCAPE_THEORY: ClassVar[Optional[str]] = None
    KERNEL: ClassVar[bool] = True

    def resolved(self, init: "InitConfig") -> "ModelConfig":
        return resolve_normalize(self, init)

    def validate(self, c: "RunConfig") -> None:
        d = c.data
        choice("model.normalize", self.normalize, NORMALIZE)
        if self.is_ffn:
            choice("model.ffn", self.ffn, ("after", "before"))
        choice("model.pos", self.pos, ("sine",))
        choice("model.pos_denom", self.pos_denom, ("M", "M+1"))
        choice("model.gram", self.gram, ("exact", "numeric"))
        if not math.isfinite(self.pos_scale) or not self.pos_scale > 0:
            raise ConfigError("model.pos_scale", self.pos_scale, "must be a finite number > 0")
        if self.M < d.N:
            raise ConfigError("model.M", self.M, f"must be >= data.N ({d.N}): the N positional embeddings must be orthogonal")
        if self.pos_denom == "M" and self.M == d.N:
            raise ConfigError("model.M", self.M, f"must be > data.N ({d.N}) with model.pos_denom=M (p_M = 0)")
        if self.is_ffn and self.m < 1:
            raise ConfigError("model.m", self.m, "must be an integer >= 1")
        if d.target != "last":
            raise ConfigError("data.target", d.target, f"model={self.name} predicts x_N only; allowed: last "
                              "(model=gpt trains on every position)")
        if d.online:
            raise ConfigError("data.online", d.online, f"model={self.name} trains full-batch on the fixed training "
                              "set; allowed: false (model=gpt draws fresh batches)")

    def recorded(self, c: "RunConfig") -> tuple[int, int]:
        """A history row: its step and metrics. A snapshot row: V (K×K; m×K with the FFN) and A (K×m), a (K),
        c and the attention (a number per position each), h_example and h_var (one per row of V each)."""
        K, N = c.data.K, c.data.N
        rows = self.m if self.is_ffn else K
        return 16, rows * K + (K * rows if self.is_ffn else 0) + K + 2 * N + 2 * rows + 8

    @property
    def is_ffn(self) -> bool:
        """The F.1 variant, f = A·ReLU(V·X·S)."""
        return False

    @property
    def m(self) -> Optional[int]:
        """The FFN width (None: no FFN)."""
        return None

    @property
    def ffn(self) -> str:
        return "after"


@option("model")
@dataclass
class FfnModelConfig(ModelConfig):
    """App. F.1: f(X) = A ReLU(V X S(X̃ᵀ W x̃_N)), A ∈ R^{K×m}, V ∈ R^{m×K}: the transformer plus an FFN."""
    name: str = "transformer_ffn"
    m: int = 19  # FFN width
    # where the FFN sits: after the attention, f = A·ReLU(V·X·S) | before it, per token,
    # f = Σ_i S_i·A·ReLU(V x_i) = A·ReLU(V)·X·S (x_N's token part is 0, so the query adds nothing)
    ffn: str = "after"
    KERNEL: ClassVar[bool] = False  # the kernel is eq. 2.1's; the FFN trains on the PyTorch path
    ESCAPE_THEORY: ClassVar[Optional[str]] = (
        "zero init is a fixed point where ReLU'(0) = 0, so the linearised step is the identity and the escape is "
        "second order in sigma, which this theory does not see")

    @property
    def is_ffn(self) -> bool:
        return True
