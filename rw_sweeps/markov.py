"""Π, the transition matrix of the walk on the circle (§1, App. B) and of the other first-order chain families
(`transition`): the one definition, in plain numpy so that `analysis` (which reads result files and never
imports the training code) draws the same Π."""
from __future__ import annotations

import numpy as np


def Pi(K: int, p: float) -> np.ndarray:
    """π_{i,i+1} = p (clockwise), π_{i,i−1} = 1 − p, indices mod K. Row i is the law of the next node given
    node i; `+=` so that K = 2, where i+1 ≡ i−1, still sums to 1."""
    i = np.arange(K)
    P = np.zeros((K, K))
    np.add.at(P, (i, (i + 1) % K), p)
    np.add.at(P, (i, (i - 1) % K), 1 - p)
    return P


def transition(name: str, K: int, p: float = 0.5, q: float = 0.5, stay: float = 0.0, Pi_rows=None) -> np.ndarray | None:
    """Π of a first-order chain family (`data.name` and its keys; a DataConfig's fields), None for a task
    that is not a first-order chain (the QA tasks). Row i is the law of the next state given state i."""
    if name == "random_walk":
        return Pi(K, p)
    if name == "lazy_walk":  # the circle that holds still with probability `stay`
        return stay * np.eye(K) + (1 - stay) * Pi(K, p)
    if name == "binary_chain":  # Makkuva et al.: p = P(0→1), q = P(1→0)
        return np.array([[1 - p, p], [q, 1 - q]])
    if name == "markov_matrix":
        return np.array(Pi_rows, dtype=np.float64).reshape(K, K)
    return None


def of(d) -> np.ndarray | None:
    """`transition` of a DataConfig-like object (anything with name, K, p and, where used, q, stay, Pi)."""
    return transition(d.name, d.K, d.p, getattr(d, "q", 0.5), getattr(d, "stay", 0.0), getattr(d, "Pi", None))
