"""init=gpt2: GPT-2's initialisation, model=gpt's (the eq. 2.1 engine and the oracle have no residual
projections to scale: they are refused it)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..registry import option, rule
from .base import InitConfig


class Gpt:
    """N(0, std²) per weight matrix and embedding, N(0, std²/(2·n_layer)) for the residual projections."""
    @staticmethod
    def weight(cfg, p, gen):
        import torch  # torch: only where a run trains

        std = cfg.init.std
        if p.role == "residual":
            std = std / math.sqrt(2 * cfg.model.n_layer)
        return std * torch.randn(p.shape, generator=gen, dtype=torch.float64)


@option("init")
@dataclass
class Gpt2Init(InitConfig):
    """GPT-2's initialisation (model=gpt): every weight matrix and embedding N(0, std²), the residual
    projections (attention output, MLP output) N(0, std²/(2·n_layer)), biases 0, LayerNorm gains 1."""
    name: str = "gpt2"
    std: float = field(default=0.02, metadata=rule(lo=0))  # the weights' standard deviation
    ENGINES: ClassVar[dict] = {"gpt": Gpt}

    def scale(self) -> float:
        return self.std

    def unit(self) -> InitConfig:
        return dataclasses.replace(self, std=1.0)
