"""The chains' mathematics in plain numpy: Π of the walk on the circle (§1, App. B), of jumps and of named
graphs, kth_order's transition tensor and icl_markov's posterior predictive. The data families
(`rw_sweeps.core.families`) build their Π from these; `analysis` draws the same Π without the training code."""
from __future__ import annotations

import functools

import numpy as np

# A start that is not a law: s_1 of sequence i is node i mod K, every node starting equally many sequences
# (a walk family's data.start=balanced; `rw_sweeps.core.data.balance` draws it)
BALANCED = "balanced"


def Pi(K: int, p: float) -> np.ndarray:
    """π_{i,i+1} = p (clockwise), π_{i,i−1} = 1 − p, indices mod K. Row i is the law of the next node given
    node i; `+=` so that K = 2, where i+1 ≡ i−1, still sums to 1."""
    i = np.arange(K)
    P = np.zeros((K, K))
    np.add.at(P, (i, (i + 1) % K), p)
    np.add.at(P, (i, (i - 1) % K), 1 - p)
    return P


def jump(K: int, jumps) -> np.ndarray:
    """jump_walk's Π: jumps = [P(+1), P(−1), P(+2), P(−2), …, P(+r), P(−r)], steps taken mod K. `+=` so that
    steps landing on the same node add (±r for r = K/2, or any r ≥ K/2, which wraps around; a step by a
    multiple of K holds still)."""
    i = np.arange(K)
    P = np.zeros((K, K))
    for k, prob in enumerate(jumps):
        step = (k // 2 + 1) * (1 if k % 2 == 0 else -1)
        np.add.at(P, (i, (i + step) % K), prob)
    return P


GRAPHS = ("cycle", "path", "complete", "grid", "torus", "hypercube", "random_regular")


@functools.lru_cache(maxsize=256)
def _graph_pi(graph: str, K: int, degree: int, side: int, dim: int, seed: int) -> np.ndarray:
    import networkx as nx  # here, not at the top: only graph_walk needs it

    if graph == "random_regular":  # a fixed function of the run seed: Π is per run, not per config group
        G = nx.random_regular_graph(degree, K, seed=seed)
    else:
        G = {"cycle": lambda: nx.cycle_graph(K), "path": lambda: nx.path_graph(K),
             "complete": lambda: nx.complete_graph(K), "grid": lambda: nx.grid_2d_graph(side, side),
             "torus": lambda: nx.grid_2d_graph(side, side, periodic=True),
             "hypercube": lambda: nx.hypercube_graph(dim)}[graph]()
    if not nx.is_connected(G):
        raise ValueError(f"the {graph} graph on {G.number_of_nodes()} nodes is not connected")
    # nodes in sorted order: 0 … K−1, grid/torus (row, column) row-major, hypercube's bits as a binary number
    A = nx.to_numpy_array(G, nodelist=sorted(G), dtype=np.float64)
    P = A / A.sum(1, keepdims=True)
    P.flags.writeable = False
    return P


def graph(graph: str, K: int, degree: int = 3, side: int = 3, dim: int = 3, seed: int = 0) -> np.ndarray:
    """graph_walk's Π: the simple random walk (uniform over the neighbours) on a named graph; the random
    d-regular graph is networkx.random_regular_graph(degree, K, seed=seed), seed the run's seed. ValueError
    if the graph is not connected (the graph_walk family's validation turns it into a ConfigError before any job starts)."""
    return _graph_pi(graph, K, degree, side, dim, seed if graph == "random_regular" else 0).copy()


# ------------------------------------------------------------------------ chains that are not first order
# kth_order's transition tensor has its own stream: s ↦ (a·s + b) mod 2³² with model.INIT_STREAM's odd a and
# another odd b, so it is never the data's seed s (a·s + b − s is odd) nor the init's (the two differ by b − b′ ≠ 0).
KTH_STREAM = (0x9E3779B1, 0x3C6EF373)
MAX_KTH_ENTRIES = 2**24  # K^order contexts × K entries (128 MiB of float64): the kth_order family's bound


def kth_seed(seed: int) -> int:
    a, b = KTH_STREAM
    return (a * seed + b) % 2**32


def kth_tensor(K: int, order: int, alpha: float, seed: int) -> np.ndarray:
    """kth_order's T, shape (K,)*order + (K,): T[s_{t−k}, …, s_{t−1}, :] ~ Dirichlet(alpha·1_K) i.i.d. per
    context, a function of the run's seed alone (the same for its training and test sets)."""
    rng = np.random.default_rng(kth_seed(seed))
    return rng.dirichlet(np.full(K, float(alpha)), size=K**order).reshape((K,) * order + (K,))


def posterior_predictive(tokens: np.ndarray, K: int, alpha: float) -> np.ndarray:
    """icl_markov's Bayes optimum (rows ~ Dirichlet(alpha), one chain per sequence): for tokens (n, L),
    P(y = j | x) = (n_{s,j} + alpha) / (n_s + K·alpha), s = x_L, n_{s,j} the s→j transitions among x_1..x_L."""
    n = len(tokens)
    s = tokens[:, -1]
    from_s = tokens[:, :-1] == s[:, None]  # transitions t → t+1 that leave x_L's state
    rows = np.broadcast_to(np.arange(n)[:, None], from_s.shape)
    counts = np.bincount((rows * K + tokens[:, 1:])[from_s], minlength=n * K).reshape(n, K).astype(np.float64)
    return (counts + alpha) / (counts.sum(1, keepdims=True) + K * alpha)


LONG_RUN_T = 4096


@functools.lru_cache(maxsize=256)
def _long_run(Pi_bytes: bytes, K: int) -> np.ndarray:
    P = np.frombuffer(Pi_bytes, np.float64).reshape(K, K)
    u = np.full(K, 1.0 / K)
    total = np.zeros(K)
    for _ in range(LONG_RUN_T):
        total += u
        u = u @ P
    out = total / LONG_RUN_T
    out.flags.writeable = False
    return out


def long_run_law(Pi) -> np.ndarray:
    """(1/T) Σ_{t<T} u Πᵗ from the uniform u (T = LONG_RUN_T): the stationary law of an ergodic chain (to
    O(1/T) for a periodic one), and the long-run share of each state from a uniform start for any chain."""
    P = np.ascontiguousarray(Pi, np.float64)
    return _long_run(P.tobytes(), len(P))
