"""Data of §1 (random walks on a circle) and §6 (the two question-answering tasks).

Labels are 0-based: node i of the paper is label i − 1. A sequence is the N − 1 observed tokens
s_1..s_{N−1} (the one-hot x_i = e_{s_i}) and the target y = s_N.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import markov

from .config import DataConfig

VOCAB = ["apple", "orange", "Based", "on", "the", "which", "type", "of", "fruit", "list", "appears", "most",
         "frequently", "sentence", "I", "prefer", "an", "to", "do"]  # §6, in the paper's order
_W = {w: i for i, w in enumerate(VOCAB)}
_QUESTION_1 = "which type of fruit appears most frequently".split()
_QUESTION_2 = "which type of fruit do I prefer".split()


@dataclass
class Split:
    tokens: torch.Tensor  # (n, N−1) int64 node ids s_1..s_{N−1}
    y: torch.Tensor  # (n,) int64 target s_N
    P_true: torch.Tensor  # (n, K) float64: the true distribution of y given the sequence


def Pi(K: int, p: float, dtype=torch.float64) -> torch.Tensor:
    """Transition matrix Π (`rw_sweeps.markov.Pi`) as a tensor."""
    return torch.from_numpy(markov.Pi(K, p)).to(dtype)


def random_walks(K: int, N: int, p: float, n: int, gen: torch.Generator) -> Split:
    """n walks of N nodes: s_1 ~ Unif([K]), then ±1 steps drawn at once and summed (no loop over positions)."""
    s1 = torch.randint(K, (n, 1), generator=gen)
    clockwise = torch.rand(n, N - 1, generator=gen) < p  # float32 draws, so data do not depend on precision
    # s_i = s_1 + (#clockwise − #counter-clockwise steps so far) mod K; the offset keeps it non-negative and
    # the lookup table replaces a slow integer remainder.
    steps = torch.zeros(n, N, dtype=torch.int64)
    steps[:, 1:] = clockwise
    walked = 2 * torch.cumsum(steps, 1) - torch.arange(N) + (s1 + K * N)
    s = (torch.arange(K * N + N + K) % K)[walked]
    tokens, y = s[:, :-1].contiguous(), s[:, -1].contiguous()
    # P(y | x_{N−1}) = Πᵀ x_{N−1}: row s_{N−1} of Π (Markov property, §1).
    return Split(tokens, y, Pi(K, p)[tokens[:, -1]])


def qa_majority(n: int, gen: torch.Generator) -> Split:
    """Task 1: 'Based on the list <5 fruits> which type of fruit appears most frequently' → majority fruit."""
    fruits = torch.randint(2, (n, 5), generator=gen)  # 0 = apple, 1 = orange, each list w.p. 1/32
    head = torch.tensor([_W[w] for w in ["Based", "on", "the", "list"]]).expand(n, 4)
    tail = torch.tensor([_W[w] for w in _QUESTION_1]).expand(n, len(_QUESTION_1))
    tokens = torch.cat([head, fruits, tail], 1).contiguous()
    y = (fruits.sum(1) >= 3).long()  # majority of 5: no ties
    return Split(tokens, y, torch.nn.functional.one_hot(y, len(VOCAB)).double())


def qa_preference(n: int, gen: torch.Generator) -> Split:
    """Task 2: 'Based on the sentence I prefer an <a> to an <b> which type of fruit do I prefer' → a."""
    first = torch.randint(2, (n,), generator=gen)
    words = ["Based", "on", "the", "sentence", "I", "prefer", "an", None, "to", "an", None] + _QUESTION_2
    tokens = torch.tensor([[_W[w] if w else 0 for w in words]]).repeat(n, 1)
    tokens[:, 7], tokens[:, 10] = first, 1 - first
    return Split(tokens, first.clone(), torch.nn.functional.one_hot(first, len(VOCAB)).double())


def make(cfg: DataConfig, seed: int) -> tuple[Split, Split]:
    """The fixed training and test sets of one run: train first, then test, from one generator."""
    gen = torch.Generator().manual_seed(seed)
    if cfg.name == "random_walk":
        draw = lambda n: random_walks(cfg.K, cfg.N, cfg.p, n, gen)  # noqa: E731
    else:
        draw = lambda n: {"qa_majority": qa_majority, "qa_preference": qa_preference}[cfg.name](n, gen)  # noqa: E731
    return draw(cfg.n_train), draw(cfg.n_test)
