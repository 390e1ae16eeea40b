"""Edelman et al.: a fresh first-order chain per sequence, rows ~ Dirichlet(alpha), the first token uniform;
the optimum is the posterior predictive given the in-context transition counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from ..gpt.strategies import in_context
from ..registry import option
from .base import DataConfig
from .kth_order import check_alpha


@option("data")
@dataclass
class IclMarkov(DataConfig):
    name: str = "icl_markov"
    K: int = 3
    alpha: float = 1.0  # Dirichlet(alpha·1_K) concentration of each sequence's Π rows
    PER_RUN: ClassVar[tuple] = ("alpha",)
    ECHO: ClassVar[tuple] = ("alpha",)

    def validate(self, seed: int) -> None:
        check_alpha(self.alpha)
        if self.K < 2:
            raise ConfigError("data.K", self.K, "must be >= 2 for data=icl_markov")

    @property
    def smoothing(self) -> float:
        return self.alpha

    def laws(self, seq, seed: int):
        """The posterior predictive at every position: the in-context bigram strategy with α."""
        return in_context(seq, self.K, self.alpha, "all")[1]

    def draw(self, n: int, gen, seed: int):
        from ..data import icl_markov  # torch: only where a run draws its data

        return icl_markov(self.K, self.N, self.alpha, n, gen)
