"""Π, the transition matrix of the walk on the circle (§1, App. B): the one definition, in plain numpy so
that `analysis` (which reads result files and never imports the training code) draws the same Π."""
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
