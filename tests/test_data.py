"""§1 and §6 data: walk statistics match Π, QA sequences and labels are the paper's."""
from __future__ import annotations

import torch

from rw_sweeps import data
from rw_sweeps.config import DataConfig


def test_Pi_is_the_circle_transition_matrix():
    P = data.Pi(5, 0.7)
    for i in range(5):
        assert P[i, (i + 1) % 5] == 0.7 and abs(P[i, (i - 1) % 5] - 0.3) < 1e-15
    assert torch.allclose(P.sum(1), torch.ones(5, dtype=P.dtype))
    # App. B: Π = p Π0ᵀ + (1 − p) Π0 with [Π0]_{i+1,i} = 1
    Pi0 = torch.zeros(5, 5, dtype=torch.float64)
    Pi0[(torch.arange(5) + 1) % 5, torch.arange(5)] = 1
    assert torch.allclose(P, 0.7 * Pi0.T + 0.3 * Pi0)


def test_walk_statistics_match_Pi():
    K, N, p, n = 7, 31, 0.3, 20000
    s = data.random_walks(K, N, p, n, torch.Generator().manual_seed(1))
    walk = torch.cat([s.tokens, s.y[:, None]], 1)
    counts = torch.zeros(K, K, dtype=torch.float64)
    counts.index_put_((walk[:, :-1].flatten(), walk[:, 1:].flatten()), torch.ones(n * (N - 1), dtype=torch.float64), accumulate=True)
    emp = counts / counts.sum(1, keepdim=True)
    assert (emp - data.Pi(K, p)).abs().max() < 0.01  # 85k transitions per row: 3σ ≈ 0.005
    start = torch.bincount(walk[:, 0], minlength=K) / n
    assert (start - 1 / K).abs().max() < 0.015
    # every step is ±1 mod K, and y follows x_{N−1} as Π says: P_true = row s_{N−1} of Π
    d = (walk[:, 1:] - walk[:, :-1]) % K
    assert set(d.unique().tolist()) == {1, K - 1}
    assert torch.equal(s.P_true, data.Pi(K, p)[s.tokens[:, -1]])
    assert abs((s.y == (s.tokens[:, -1] + 1) % K).double().mean() - p) < 0.01


def test_deterministic_walks_visit_every_node_r_times():
    K, r = 6, 16  # N = rK + 1 as in Thm 4.1: x̄ = 1/K for every sequence
    s = data.random_walks(K, r * K + 1, 1.0, 50, torch.Generator().manual_seed(0))
    assert all(torch.bincount(row, minlength=K).tolist() == [r] * K for row in s.tokens)
    assert torch.equal(s.y, s.tokens[:, 0])  # s_N = s_1


def test_seed_fixes_data_and_precision_does_not_matter():
    a = data.make(DataConfig(p=0.5), 3)
    b = data.make(DataConfig(p=0.5), 3)
    c = data.make(DataConfig(p=0.5), 4)
    assert torch.equal(a[0].tokens, b[0].tokens) and torch.equal(a[1].y, b[1].y)
    assert not torch.equal(a[0].tokens, c[0].tokens)
    assert a[0].tokens.shape == (1000, 96) and a[1].tokens.shape == (1000, 96)


def words(tokens):
    return [data.VOCAB[i] for i in tokens.tolist()]


def test_qa_majority_sentences_and_labels():
    s = data.qa_majority(500, torch.Generator().manual_seed(0))
    assert s.tokens.shape == (500, 16)
    for row, y in zip(s.tokens[:50], s.y[:50]):
        w = words(row)
        assert w[:4] == ["Based", "on", "the", "list"]
        assert w[9:] == "which type of fruit appears most frequently".split()
        fruits = w[4:9]
        assert set(fruits) <= {"apple", "orange"}
        assert data.VOCAB[y] == max(("apple", "orange"), key=fruits.count)
    lists = {tuple(r[4:9].tolist()) for r in s.tokens}
    assert len(lists) == 32  # all 2^5 lists occur


def test_qa_preference_sentences_and_labels():
    s = data.qa_preference(200, torch.Generator().manual_seed(0))
    assert s.tokens.shape == (200, 18)
    for row, y in zip(s.tokens, s.y):
        w = words(row)
        a, b = w[7], w[10]
        assert " ".join(w) == f"Based on the sentence I prefer an {a} to an {b} which type of fruit do I prefer"
        assert {a, b} == {"apple", "orange"} and data.VOCAB[y] == a
    assert 0.35 < s.y.double().mean() < 0.65
    # both questions have the same bag of words: the uniform average x̄ cannot tell them apart (§6)
    counts = torch.stack([torch.bincount(r, minlength=19) for r in s.tokens])
    assert (counts == counts[0]).all()
