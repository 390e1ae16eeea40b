"""A Bayesian network over positions (the paper's other open direction; Nichani et al.'s setting in context).

Each position i = 1 … N − 1 has parents among earlier positions (`dag`, or drawn from the seed with
`in_degree` parents each), and y = s_N has the parents `parent` (one position by default, drawn from the
seed among 1 … N − 2: not the last token, so the question becomes "does the attention find a parent that is
not x_{N−1}?"). A position with parents draws from one shared table T[context of its parents] (K^d rows,
Dirichlet(alpha) each), a position without parents uniformly. T is drawn from the run's seed, the same for
its training and test sets, or with `in_context=true` afresh for every sequence; then the Bayes predictor of
a position is the posterior predictive of T's row given the (parents, child) pairs seen before it in the
sequence, as icl_markov's is for a chain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

import numpy as np

from ..errors import ConfigError
from ..registry import option
from .base import DataConfig
from .kth_order import check_alpha

STREAM = 0xB4E5  # the DAG's and T's numpy stream, mixed with the run's seed (never the data's torch stream)
MAX_TABLE = 1 << 16  # K^in_degree rows at most


@option("data")
@dataclass
class BayesNet(DataConfig):
    name: str = "bayes_net"
    K: int = 3
    N: int = 17
    in_degree: int = 1  # d: parents of every position that has any (and of y)
    # the parents (1-based positions) of positions 1 … N − 1, each list empty (uniform) or of in_degree earlier
    # positions; null: drawn from the seed (positions ≤ d have none, the others d distinct earlier positions)
    dag: Optional[List[List[int]]] = None
    parent: Optional[List[int]] = None  # y's parents (in_degree positions ≤ N − 1); null: drawn from the seed, ≤ N − 2
    in_context: bool = False  # true: T drawn afresh per sequence (the Bayes predictor reads the sequence's pairs)
    alpha: float = 1.0  # Dirichlet(alpha·1_K) concentration of T's rows
    PER_RUN: ClassVar[tuple] = ("alpha",)
    ECHO: ClassVar[tuple] = ("in_degree", "in_context", "alpha")  # the DAG: the summary's parent_positions
    SEEDED: ClassVar[bool] = True  # the drawn DAG depends on the seed

    def validate(self, seed: int) -> None:
        check_alpha(self.alpha)
        if self.K < 2:
            raise ConfigError("data.K", self.K, "must be >= 2 for data=bayes_net")
        if not 1 <= self.in_degree <= self.N - 2:
            raise ConfigError("data.in_degree", self.in_degree, f"must be in [1, data.N − 2] = [1, {self.N - 2}]")
        if self.K ** self.in_degree > MAX_TABLE:
            raise ConfigError("data.in_degree", self.in_degree, f"makes T too large: K^in_degree > {MAX_TABLE}")
        if self.dag is not None:
            if len(self.dag) != self.N - 1:
                raise ConfigError("data.dag", self.dag, f"must list the parents of each of the {self.N - 1} positions 1 … N − 1")
            for i, pa in enumerate(self.dag, start=1):
                if pa and (len(pa) != self.in_degree or len(set(pa)) != len(pa) or not all(1 <= j < i for j in pa)):
                    raise ConfigError("data.dag", self.dag, f"position {i}: its parents must be none or "
                                      f"{self.in_degree} distinct earlier positions")
        if self.parent is not None and (len(self.parent) != self.in_degree or len(set(self.parent)) != len(self.parent)
                                        or not all(1 <= j <= self.N - 1 for j in self.parent)):
            raise ConfigError("data.parent", self.parent, f"must be {self.in_degree} distinct positions in 1 … N − 1")

    def _rng(self, seed: int) -> np.random.Generator:
        return np.random.default_rng([STREAM, seed])

    def graph(self, seed: int) -> list[list[int]]:
        """The parents (1-based) of positions 1 … N: the DAG's, then y's."""
        rng = self._rng(seed)
        d = self.in_degree
        dag = self.dag if self.dag is not None else [
            [] if i <= d else sorted(rng.choice(i - 1, size=d, replace=False) + 1) for i in range(1, self.N)]
        par = self.parent if self.parent is not None else sorted(rng.choice(self.N - 2, size=d, replace=False) + 1)
        return [list(map(int, p)) for p in dag] + [list(map(int, par))]

    def table(self, seed: int) -> np.ndarray:
        """T (K^d, K), the run's fixed conditionals (in_context=false)."""
        rng = np.random.default_rng([STREAM, seed, 1])  # its own stream: the DAG's draws never shift it
        return rng.dirichlet(np.full(self.K, float(self.alpha)), size=self.K ** self.in_degree)

    def parents(self, seed: int) -> list[int]:
        return self.graph(seed)[-1]

    def parents_of(self, seed: int) -> list[list[int]]:
        return self.graph(seed)

    def _contexts(self, s: np.ndarray, pa: list[int]) -> np.ndarray:
        ctx = np.zeros(len(s), np.int64)
        for j in pa:
            ctx = ctx * self.K + s[:, j - 1]
        return ctx

    def draw(self, n: int, gen, seed: int):
        import torch  # torch: only where a run trains

        from ..data import (  # torch: only where a run draws its data
            Split,
            cumulative_rows,
        )

        graph, K, N = self.graph(seed), self.K, self.N
        u = torch.rand(n, N, generator=gen, dtype=torch.float64).numpy()
        if self.in_context:
            sub = np.random.default_rng(int(torch.randint(2**62, (1,), generator=gen)))
            T = sub.dirichlet(np.full(K, float(self.alpha)), size=(n, K ** self.in_degree))  # (n, C, K)
        else:
            T = np.broadcast_to(self.table(seed), (n, K ** self.in_degree, K))
        F = cumulative_rows(T)
        rows = np.arange(n)
        s = np.empty((n, N), np.int64)
        for i, pa in enumerate(graph, start=1):
            if not pa:
                s[:, i - 1] = np.minimum((u[:, i - 1] * K).astype(np.int64), K - 1)
            else:
                s[:, i - 1] = (u[:, i - 1, None] >= F[rows, self._contexts(s, pa)]).sum(1)
        law = self._law(s, graph, N, seed)
        tokens, y = s[:, :-1].copy(), s[:, -1].copy()
        return Split(torch.from_numpy(tokens), torch.from_numpy(y), torch.from_numpy(law))

    def _law(self, s: np.ndarray, graph: list, i: int, seed: int) -> np.ndarray:
        """The Bayes predictor of position i (1-based) given s_1 … s_{i−1}: uniform for a root; T's row of its
        parents' values; in context, the posterior predictive of that row from the earlier (parents, child)
        pairs."""
        n, K = len(s), self.K
        pa = graph[i - 1]
        if not pa:
            return np.full((n, K), 1.0 / K)
        ctx = self._contexts(s, pa)
        if not self.in_context:
            return self.table(seed)[ctx]
        counts = np.zeros((n, K))
        for j in range(1, i):  # earlier positions with parents: their (context, value) pairs
            if graph[j - 1]:
                same = self._contexts(s, graph[j - 1]) == ctx
                counts[np.arange(n), s[:, j - 1]] += same
        return (counts + self.alpha) / (counts.sum(1, keepdims=True) + K * self.alpha)

    def laws(self, seq, seed: int):
        graph = self.graph(seed)
        return np.stack([self._law(seq, graph, t + 2, seed) for t in range(self.N - 1)], 1)
