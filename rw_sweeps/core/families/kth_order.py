"""An order-k chain on K states: T[s_{t−k}, …, s_{t−1}, :] ~ Dirichlet(alpha) per context, drawn from the
run's seed (the same T for its training and test sets); the first k tokens uniform. For k ≥ 2 the one-layer
model cannot represent it: that failure is the point."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from ..errors import ConfigError
from ..markov import MAX_KTH_ENTRIES, kth_tensor
from ..registry import option
from .base import DataConfig


def check_alpha(alpha: float) -> None:
    if not math.isfinite(alpha) or not alpha > 0:
        raise ConfigError("data.alpha", alpha, "must be a finite number > 0 (the Dirichlet concentration)")


@option("data")
@dataclass
class KthOrder(DataConfig):
    name: str = "kth_order"
    K: int = 3
    order: int = 2  # k: the next state's law depends on the last k states
    alpha: float = 1.0  # Dirichlet(alpha·1_K) concentration of T's rows
    PER_RUN: ClassVar[tuple] = ("alpha",)
    ECHO: ClassVar[tuple] = ("order", "alpha")

    def validate(self, seed: int) -> None:
        check_alpha(self.alpha)
        if self.K < 2:
            raise ConfigError("data.K", self.K, "must be >= 2 for data=kth_order")
        if not 1 <= self.order <= self.N - 1:  # y's k states are all observed
            raise ConfigError("data.order", self.order, f"must be in [1, data.N − 1] = [1, {self.N - 1}]")
        if self.K ** (self.order + 1) > MAX_KTH_ENTRIES:
            raise ConfigError("data.order", self.order, f"makes T too large: K^(order+1) = {self.K}^{self.order + 1} "
                              f"entries > {MAX_KTH_ENTRIES} (2^24); lower data.order or data.K")

    def first_order_pi(self, seed: int) -> Optional[np.ndarray]:
        """With order 1, T itself is Π (what v_pi_cosine compares V with); none for order ≥ 2."""
        return kth_tensor(self.K, 1, self.alpha, seed) if self.order == 1 else None

    @property
    def context(self) -> int:
        return self.order

    @property
    def smoothing(self) -> float:
        return self.alpha

    def laws(self, seq, seed: int):
        """T's row of the last k states at every position (uniform while fewer than k are observed: the first
        k states are drawn uniformly)."""
        from ..data import kth_law  # torch: only where a run draws its data

        T, _ = kth_law(self.K, self.order, float(self.alpha), seed)
        n, N = seq.shape
        out = np.full((n, N - 1, self.K), 1.0 / self.K)
        ctx = np.zeros(n, np.int64)
        for t in range(N - 1):  # position t predicts s_{t+1}; its context s_{t−k+1} … s_t
            ctx = (ctx * self.K + seq[:, t]) % (self.K ** self.order)
            if t + 1 >= self.order:
                out[:, t] = T[ctx]
        return out

    def draw(self, n: int, gen, seed: int):
        from ..data import (
            kth_order,  # T is fixed per run: drawn from the run's seed on its own stream
        )

        return kth_order(self.K, self.N, self.order, self.alpha, seed, n, gen)
