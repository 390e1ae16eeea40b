"""A birth–death chain on the path 0 … K−1: up with probability p, down with 1 − p, held at the ends (the
step that would leave the path stays put). Each state's likelier successor has probability max(p, 1 − p),
so OPT = max(p, 1 − p), as on the circle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ..registry import option
from .base import DataConfig


@option("data")
@dataclass
class BirthDeath(DataConfig):
    name: str = "birth_death"
    p: float = 0.5  # probability of a step up (i → i + 1)
    PER_RUN: ClassVar[tuple] = ("p",)
    ECHO: ClassVar[tuple] = ("p",)

    def validate(self, seed: int) -> None:
        self.in_unit("p", self.p)
        if self.K < 2:
            raise ConfigError("data.K", self.K, "must be >= 2 for data=birth_death (a path of K states)")

    def transition(self, seed: int = 0) -> np.ndarray:
        K, p = self.K, self.p
        Pi = np.zeros((K, K))
        up, down = np.arange(K - 1), np.arange(1, K)
        Pi[up, up + 1] = p
        Pi[down, down - 1] = 1 - p
        Pi[0, 0] += 1 - p  # held at the ends
        Pi[K - 1, K - 1] += p
        return Pi

    @property
    def opt_acc(self) -> float:
        return max(self.p, 1 - self.p)
