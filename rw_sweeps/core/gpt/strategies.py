"""What model=gpt's predictions are measured against, at the positions its objective reads.

Position t (0-based) of a sequence s_0 … s_{N−1} predicts s_{t+1} from s_0 … s_t: target=last reads
t = N − 2 only, target=all every t = 0 … N − 2. At each, three in-context strategies (Edelman et al.):

- uniform: 1/K;
- unigram: (n_k + α)/(t + 1 + K·α), n_k the occurrences of k in s_0 … s_t;
- bigram: (n_{s_t→k} + α)/(n_{s_t→·} + K·α), the transitions from s_t among s_0 … s_t: the posterior
  predictive of a chain with Dirichlet(α) rows, so icl_markov's Bayes optimum;

with α = the family's `smoothing` (its Dirichlet α, else 1). The unigram baseline (`unigram_loss`) predicts the
family's long-run law where it has one (`DataConfig.stationary`), else the in-context unigram; the Bayes
predictor is the exact conditional law (`P_true`, `DataConfig.laws`).
"""
from __future__ import annotations

import numpy as np


def read_positions(N: int, target: str) -> np.ndarray:
    """The positions t the objective reads (see above)."""
    return np.arange(N - 1) if target == "all" else np.array([N - 2])


def in_context(seq: np.ndarray, K: int, alpha: float, target: str) -> tuple[np.ndarray, np.ndarray]:
    """The unigram and bigram strategies (n, P, K) for sequences seq (n, N) at the positions read."""
    n, N = seq.shape
    at = read_positions(N, target)
    onehot = np.eye(K)[seq]  # (n, N, K)
    counts = np.cumsum(onehot, 1)[:, at]  # occurrences in s_0 … s_t
    unigram = (counts + alpha) / (at[None, :, None] + 1 + K * alpha)
    # transitions a → b completed by time t: cumulative (K·K) counts, read at the row of s_t
    pair = seq[:, :-1] * K + seq[:, 1:]  # (n, N − 1): the transition s_j → s_{j+1}
    trans = np.zeros((n, N, K * K))
    np.put_along_axis(trans[:, 1:], pair[..., None], 1.0, axis=2)
    trans = np.cumsum(trans, 1)[:, at].reshape(n, len(at), K, K)  # transitions ending at or before t
    row = np.take_along_axis(trans, seq[:, at][:, :, None, None], axis=2)[:, :, 0]  # from s_t
    bigram = (row + alpha) / (row.sum(-1, keepdims=True) + K * alpha)
    return unigram, bigram


def laws(data, seq: np.ndarray, seed: int, P_last: np.ndarray) -> np.ndarray:
    """The Bayes predictor (n, P, K) at the positions read: P_last (the sampler's law of s_{N−1}) for
    target=last, the family's `laws` for target=all."""
    if data.target == "last":
        return P_last[:, None, :]
    return data.laws(seq, seed)
