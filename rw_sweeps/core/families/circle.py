"""§1's walk on a circle of K nodes, and two circles that step otherwise: holding still, or jumping ±k."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, List

import numpy as np

from ..errors import ConfigError
from ..markov import BALANCED, Pi, jump
from ..registry import choice, option
from .base import DataConfig

# data.start of the walks: uniform: s_1 ~ Unif([K]) | balanced: s_1 of sequence i is node i mod K, every node
# starting the same number of training sequences (data.n_train, or data.batch when online, a multiple of K)
STARTS = ("uniform", BALANCED)


def _circle(d: DataConfig) -> None:
    if d.K < 3:  # for K = 2 the ±1 steps land on the same node
        raise ConfigError("data.K", d.K, "must be >= 3 (a circle of K nodes)")
    choice("data.start", d.start, STARTS)
    if d.start == BALANCED:
        # the training set's label frequencies are what V learns at step 1 (π̂ below): a balanced start
        # makes them exactly equal only when every node starts equally many training sequences
        key, n = ("data.batch", d.batch) if d.online else ("data.n_train", d.n_train)
        if n % d.K:
            near = " or ".join(str(m) for m in (n - n % d.K, n - n % d.K + d.K) if m > 0)  # never 0: no set
            raise ConfigError(key, n, f"must be a multiple of data.K ({d.K}) with data.start=balanced "
                              f"(every node starts {key}/K sequences), e.g. {near}")


@option("data")
@dataclass
class RandomWalk(DataConfig):
    """Walks on a circle of K nodes, clockwise (+1) with probability p: Π = p·(shift +1) + (1 − p)·(shift −1)."""
    name: str = "random_walk"
    p: float = 0.5  # probability of a clockwise (+1) step
    start: str = "uniform"  # the law of s_1: uniform | balanced (node i mod K for sequence i; n_train a multiple of K)
    PER_RUN: ClassVar[tuple] = ("p",)
    ECHO: ClassVar[tuple] = ("p",)  # start: the law of s_1, a detail of the draw

    def validate(self, seed: int) -> None:
        self.in_unit("p", self.p)
        _circle(self)

    def transition(self, seed: int = 0) -> np.ndarray:
        return Pi(self.K, self.p)

    def is_trap(self) -> bool:
        """Theorem 4.1: a deterministic walk (p ∈ {0, 1}) with K | N − 1 visits every node equally often."""
        return self.p in (0.0, 1.0) and (self.N - 1) % self.K == 0

    @property
    def opt_acc(self) -> float:
        """OPT = max(p, 1 − p) (§1): the next node is the likelier neighbour."""
        return max(self.p, 1 - self.p)

    def draw(self, n: int, gen, seed: int):
        from ..data import random_walks  # torch: only where a run draws its data

        return random_walks(self.K, self.N, self.p, n, gen, self.start == BALANCED)

    def draw_into(self, gen, seed: int, tokens, y, P_true) -> None:
        from ..data import (
            walks_into,  # the SWAR fast path, straight into the stacked batch
        )

        walks_into(self.K, self.N, self.p, gen, tokens, y, P_true, self.start == BALANCED)

    def initial_law(self, seed: int):
        return BALANCED if self.start == BALANCED else None


@option("data")
@dataclass
class LazyWalk(DataConfig):
    """The circle that holds still with probability stay: Π = stay·I + (1 − stay)·Π_circle(p)."""
    name: str = "lazy_walk"
    p: float = 0.5  # probability of a clockwise step, given a step
    stay: float = 0.5  # holding probability
    start: str = "uniform"  # the law of s_1: uniform | balanced (node i mod K for sequence i; n_train a multiple of K)
    PER_RUN: ClassVar[tuple] = ("p", "stay")
    ECHO: ClassVar[tuple] = ("p", "stay")

    def validate(self, seed: int) -> None:
        self.in_unit("p", self.p)
        self.in_unit("stay", self.stay)
        _circle(self)

    def initial_law(self, seed: int):
        return BALANCED if self.start == BALANCED else None

    def transition(self, seed: int = 0) -> np.ndarray:
        return self.stay * np.eye(self.K) + (1 - self.stay) * Pi(self.K, self.p)


@option("data")
@dataclass
class JumpWalk(DataConfig):
    """The circle with steps ±1 … ±r: jumps = [P(+1), P(−1), P(+2), P(−2), …, P(+r), P(−r)], summing to 1.
    Steps are taken mod K, and steps landing on the same node add (any r is allowed)."""
    name: str = "jump_walk"
    jumps: List[float] = field(default_factory=lambda: [0.4, 0.3, 0.2, 0.1])  # [P(+1), P(−1), P(+2), P(−2), …]
    start: str = "uniform"  # the law of s_1: uniform | balanced (node i mod K for sequence i; n_train a multiple of K)
    PER_RUN: ClassVar[tuple] = ("jumps",)
    ECHO: ClassVar[tuple] = ("jumps",)

    def validate(self, seed: int) -> None:
        _circle(self)
        J = self.jumps
        if not J or len(J) % 2:
            raise ConfigError("data.jumps", J, "must be an even-length list [P(+1), P(−1), P(+2), P(−2), …]")
        for k, x in enumerate(J):
            if not (math.isfinite(x) and x >= 0):
                raise ConfigError("data.jumps", J, f"entry {k} (P({'+-'[k % 2]}{k // 2 + 1})) is {x}; entries "
                                  "must be in [0, 1]")
        if abs(math.fsum(J) - 1) > 1e-9:
            raise ConfigError("data.jumps", J, f"sums to {math.fsum(J):.12g}; the probabilities must sum to 1 "
                              "(to 1e-9)")

    def transition(self, seed: int = 0) -> np.ndarray:
        return jump(self.K, self.jumps)

    def initial_law(self, seed: int):
        return BALANCED if self.start == BALANCED else None
