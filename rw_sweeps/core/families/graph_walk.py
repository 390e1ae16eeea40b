"""A simple random walk (uniform over the neighbours) on a named graph (`rw_sweeps.core.markov.GRAPHS`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import markov
from ..errors import ConfigError
from ..markov import graph
from ..registry import choice, option
from .base import DataConfig


@option("data")
@dataclass
class GraphWalk(DataConfig):
    name: str = "graph_walk"
    graph: str = "cycle"  # cycle | path | complete | grid | torus | hypercube | random_regular
    degree: int = 3  # random_regular only: d of the random d-regular graph on K nodes (drawn from the seed)
    side: int = 3  # grid/torus only: side × side nodes (data.K must be side²)
    dim: int = 3  # hypercube only: {0,1}^dim (data.K must be 2^dim)
    PER_RUN: ClassVar[tuple] = ("graph", "degree", "side", "dim")
    ECHO: ClassVar[tuple] = ("graph", "degree", "side", "dim")
    SEEDED: ClassVar[bool] = True  # random_regular's graph is drawn from the seed, and must be connected

    def validate(self, seed: int) -> None:
        """The graph's name, its size keys, K consistent with them, and a connected graph (built here, from
        the run's seed for random_regular, so a disconnected draw fails before any job starts)."""
        choice("data.graph", self.graph, markov.GRAPHS)
        g, K = self.graph, self.K
        if g in ("grid", "torus"):
            if self.side < (3 if g == "torus" else 2):
                raise ConfigError("data.side", self.side, f"must be >= {3 if g == 'torus' else 2} for data.graph={g}")
            if K != self.side ** 2:
                raise ConfigError("data.K", K, f"must be side² = {self.side ** 2} for data.graph={g} (data.side={self.side})")
        elif g == "hypercube":
            if self.dim < 1:
                raise ConfigError("data.dim", self.dim, "must be >= 1 for data.graph=hypercube")
            if K != 2 ** self.dim:
                raise ConfigError("data.K", K, f"must be 2^dim = {2 ** self.dim} for data.graph=hypercube (data.dim={self.dim})")
        elif K < (3 if g == "cycle" else 2):
            raise ConfigError("data.K", K, f"must be >= {3 if g == 'cycle' else 2} for data.graph={g}")
        if g == "random_regular":
            if not 0 <= self.degree < K or (K * self.degree) % 2:
                raise ConfigError("data.degree", self.degree, f"must be in [1, K−1] with K·degree even (K={K})")
        try:
            self.transition(seed)
        except ValueError as e:  # not connected (degree 0, or an unlucky random draw)
            key = "data.degree" if g == "random_regular" else "data.graph"
            raise ConfigError(key, self.degree if g == "random_regular" else g,
                              f"gives a graph that is not connected ({e}; seed={seed}); a random walk on it never "
                              "mixes") from None

    def transition(self, seed: int = 0) -> np.ndarray:
        return graph(self.graph, self.K, self.degree, self.side, self.dim, seed)

    def draw(self, n: int, gen, seed: int):
        if self.graph == "cycle":  # the p = 0.5 circle: its own sampler, the same data
            from ..data import random_walks  # torch: only where a run draws its data

            return random_walks(self.K, self.N, 0.5, n, gen)
        return super().draw(n, gen, seed)
