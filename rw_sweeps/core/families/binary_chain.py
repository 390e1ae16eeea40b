"""Makkuva et al.'s two-state chain: p = P(0→1), q = P(1→0)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ..registry import option
from .base import DataConfig


@option("data")
@dataclass
class BinaryChain(DataConfig):
    name: str = "binary_chain"
    K: int = 2  # two states, by definition
    p: float = 0.2  # P(0→1)
    q: float = 0.3  # P(1→0)
    start: str = "uniform"  # the law of s_1: uniform | stationary (π = (q, p)/(p + q), Makkuva et al.'s)
    PER_RUN: ClassVar[tuple] = ("p", "q")
    ECHO: ClassVar[tuple] = ("p", "q")  # start: the law of s_1, a detail of the draw

    def validate(self, seed: int) -> None:
        self.in_unit("p", self.p)
        self.in_unit("q", self.q)
        if self.start not in ("uniform", "stationary"):
            raise ConfigError("data.start", self.start, "must be one of uniform, stationary")
        if self.start == "stationary" and self.p + self.q == 0:
            raise ConfigError("data.start", self.start, "needs p + q > 0 (with p = q = 0 every law is stationary)")
        if self.K != 2:
            raise ConfigError("data.K", self.K, "must be 2 for data=binary_chain")

    def initial_law(self, seed: int):
        return None if self.start == "uniform" else np.array([self.q, self.p]) / (self.p + self.q)

    def transition(self, seed: int = 0) -> np.ndarray:
        return np.array([[1 - self.p, self.p], [self.q, 1 - self.q]])
