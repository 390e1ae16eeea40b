"""model=transformer: eq. 2.1, f(X) = V X S(X̃ᵀ W x̃_N), X̃ = [X; P].

Its forward is defined once, here, readably (`forward`: the softmax `attention`, then the `readout`); the
compact engine's hand-written backward and the C kernel are implementations of it that the option declares
(`IMPLEMENTATIONS`), and `tests/test_model_registry.py` holds each to this forward."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from ..errors import ConfigError
from ..registry import choice, option
from .base import NORMALIZE, ModelBase, check_implementations, resolve_normalize

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..inits.base import InitConfig


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
    IMPLEMENTATIONS: ClassVar[tuple] = ("engine", "kernel")
    # settings of its own keys, beside the defaults, that the registry test holds every declared
    # implementation to the reference forward at (`tests/test_model_registry.py`)
    HELD: ClassVar[tuple] = ({"normalize": "whole"}, {"normalize": "positional"}, {"gram": "numeric"})

    @classmethod
    def registered(cls) -> None:
        check_implementations(cls)

    # ------------------------------------------------------------------------------ the forward (reference)
    def forward(self, params: dict, X, z):
        """f(X) (…, n, K) and S (…, n, N) from the one-hot tokens X (…, n, K, N; x_N's token part is 0) and
        the attention logits z = X̃ᵀ W x̃_N (…, n, N), by plain autograd-able tensor operations: what the
        compact engine and the C kernel compute, and what the runs of an option without them train on."""
        S = self.attention(z)
        return self.readout(params, X, S), S

    def attention(self, z):
        """S(z): the softmax over all N columns, the query's included (§2)."""
        import torch  # torch: only where a run trains (the schemas are read without it)

        return torch.softmax(z, dim=-1)

    def readout(self, params: dict, X, S):
        """f = V X S: the value of the S-weighted token."""
        return (X @ S[..., None])[..., 0] @ params["V"].transpose(-1, -2)

    def geometry(self, N: int):
        """What the compact implementations need of its embeddings (`rw_sweeps.core.model.Geometry`)."""
        from .. import model  # torch: only where a run trains

        return model.embedding(self, N)

    # ------------------------------------------------------------------------------ its keys
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
