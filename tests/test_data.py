"""§1 and §6 data: walk statistics match Π, QA sequences and labels are the paper's."""
from __future__ import annotations

import threading

import torch

from rw_sweeps.core import data
from rw_sweeps.core.config import data_config


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
    a = data.make(data_config(p=0.5), 3)
    b = data.make(data_config(p=0.5), 3)
    c = data.make(data_config(p=0.5), 4)
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


def _sha(split) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in (split.tokens, split.y, split.P_true):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# sha256 (first 16 hex digits) of tokens, y, P_true of (train, test), computed with the original all-torch
# implementation before the data path was optimised: the stream a seed gives may never change.
FROZEN = [
    (dict(p=0.5), 0, ("54b1bae7cd483aff", "e0752dd0493138aa")),
    (dict(p=0.5), 1, ("443f0f834091fd10", "66138b2caf36695c")),
    (dict(p=0.5), 12345, ("a4974f812412ab96", "2d0b38c8d6ea3d87")),
    (dict(p=0.3, K=7, N=31, n_train=50, n_test=20), 12345, ("abbedfc700ee66e5", "5a8d0111b1ad290b")),
    (dict(p=1.0), 1, ("3150fb1b58f57d81", "4d72941d87b88d72")),
    (dict(p=0.0, K=20, N=101, n_train=64, n_test=64), 0, ("0a3b430d50dcecb2", "111e1787c55eefb8")),
    (dict(name="qa_majority", K=19, N=17, n_train=100, n_test=50), 1, ("5c1f16c820b6b1b1", "e47f117df164ce5c")),
    (dict(name="qa_preference", K=19, N=19, n_train=100, n_test=50), 0, ("33774be89e261c60", "3687bf5536f8f6b6")),
]


def test_a_seed_gives_the_frozen_data():
    for kw, seed, want in FROZEN:
        assert tuple(_sha(s) for s in data.make(data_config(**kw), seed)) == want, (kw, seed)


def _reference_walks(K, N, p, n, gen):
    """The original implementation, verbatim: the fast path must reproduce it bit for bit."""
    s1 = torch.randint(K, (n, 1), generator=gen)
    clockwise = torch.rand(n, N - 1, generator=gen) < p
    steps = torch.zeros(n, N, dtype=torch.int64)
    steps[:, 1:] = clockwise
    walked = 2 * torch.cumsum(steps, 1) - torch.arange(N) + (s1 + K * N)
    s = (torch.arange(K * N + N + K) % K)[walked]
    tokens, y = s[:, :-1].contiguous(), s[:, -1].contiguous()
    return tokens, y, data.Pi(K, p)[tokens[:, -1]]


def test_fast_walks_equal_the_reference_on_odd_shapes():
    # N − 1 not a multiple of 8, one word, the largest fast N (256), the fallback above it, K = 3, p at
    # float32 rounding edges (0.7 rounds up in float32, 0.1 down)
    for K, N, p, n in [(3, 2, 0.5, 7), (3, 9, 0.7, 5), (4, 10, 0.1, 33), (5, 256, 0.6, 9), (5, 257, 0.6, 9),
                       (31, 120, 0.95, 40), (6, 97, 0.7, 1000)]:
        for seed in (0, 7):
            got = data.random_walks(K, N, p, n, torch.Generator().manual_seed(seed))
            want = _reference_walks(K, N, p, n, torch.Generator().manual_seed(seed))
            for a, b in zip((got.tokens, got.y, got.P_true), want):
                assert a.dtype == b.dtype and torch.equal(a, b), (K, N, p, n, seed)


def _runs(specs):
    from rw_sweeps.core.config import RunConfig

    return [RunConfig(seed=seed, data=data_config(**kw)) for seed, kw in specs]


def test_make_batches_equals_per_run_make_for_any_worker_count():
    shape = dict(K=5, N=41, n_train=60, n_test=25)
    cfgs = _runs([(s, dict(p=p, **shape)) for s, p in [(3, 0.5), (0, 0.9), (12345, 0.05), (3, 0.3), (7, 1.0),
                                                        (2**32 - 1, 0.0), (11, 0.7)]])
    singles = [data.make(c.data, c.seed) for c in cfgs]
    for workers in (1, 3):
        for idx in (range(len(cfgs)), [4, 1, 6]):  # the whole list and another chunk composition
            sub = [cfgs[i] for i in idx]
            train, test = data.make_batches(sub, workers=workers)
            assert train.tokens.shape == (len(sub), 60, 40) and test.P_true.shape == (len(sub), 25, 5)
            assert train.tokens.dtype == torch.int64 and train.y.dtype == torch.int64
            assert train.P_true.dtype == torch.float64
            for r, i in enumerate(idx):
                for got, want in ((train, singles[i][0]), (test, singles[i][1])):
                    assert torch.equal(got.tokens[r], want.tokens) and torch.equal(got.y[r], want.y)
                    assert torch.equal(got.P_true[r], want.P_true)
    f32 = data.make_batches(cfgs, workers=2, dtype=torch.float32)[1]
    assert torch.equal(f32.P_true, torch.stack([s[1].P_true for s in singles]).float())


def test_make_batches_qa_and_mixed_shapes_refused(monkeypatch):
    cfgs = _runs([(s, dict(name="qa_majority", K=19, N=17, n_train=30, n_test=10)) for s in (0, 5)])
    monkeypatch.setenv("RW_SWEEPS_DATA_WORKERS", "2")
    assert data.data_workers() == 2
    train, test = data.make_batches(cfgs)
    for r, c in enumerate(cfgs):
        tr, te = data.make(c.data, c.seed)
        assert torch.equal(train.tokens[r], tr.tokens) and torch.equal(test.P_true[r], te.P_true)
    import pytest

    with pytest.raises(ValueError, match="share"):
        data.make_batches(_runs([(0, dict(n_train=10)), (1, dict(n_train=11))]))


def test_prefetched_and_byte_tokens_are_the_same_data():
    """A chunk drawn ahead (`prefetch`, while the chunk before trains) and then taken by a re-split part of
    it, or drawn with byte tokens for the fused kernel: the data a seed gives, bit for bit."""
    shape = dict(K=6, N=33, n_train=40, n_test=20)
    cfgs = _runs([(s, dict(p=p, **shape)) for s, p in [(1, 0.5), (2, 0.2), (3, 0.9), (4, 1.0)]])
    want = data.make_batches(cfgs, workers=1)
    data.prefetch(cfgs)
    first, second = data.make_batches(cfgs[:3]), data.make_batches(cfgs[3:])  # re-split, both from the prefetch
    assert not data._prefetched  # every prefetched run was taken
    for got, sl in ((first, slice(0, 3)), (second, slice(3, 4))):
        for g, w in zip(got, want):
            assert torch.equal(g.tokens, w.tokens[sl]) and torch.equal(g.y, w.y[sl]) and torch.equal(g.P_true, w.P_true[sl])
    u8 = data.make_batches(cfgs, token_dtype=torch.uint8)
    assert u8[0].tokens.dtype == torch.uint8 and torch.equal(u8[0].tokens.long(), want[0].tokens)


# ---------------------------------------------------------------------------------------------
# data.start=balanced: every node starts equally many training sequences

WALKS = [dict(name="random_walk", p=1.0), dict(name="random_walk", p=0.5, N=300),  # the fast path, the reference
         dict(name="lazy_walk", p=0.3, stay=0.4), dict(name="jump_walk", jumps=[0.5, 0.2, 0.2, 0.1])]


def test_a_balanced_start_starts_every_node_equally_often_with_the_uniform_starts_steps():
    """With data.start=balanced sequence i starts at node i mod K, so a training set of n = rK sequences has
    every node as s_1 exactly r times, and then walks by Π. On the circle (random_walk) everything after s_1
    is the uniform start's draw, translated: its ±1 steps are drawn apart from the nodes, so the steps
    s_{k+1} − s_k are the same, draw for draw."""
    import numpy as np

    for kw in WALKS:
        for seed in (0, 3):
            K, n = 6, 42
            cfg = dict(K=K, n_train=n, n_test=25, **{"N": 25, **kw})
            uni_tr, uni_te = data.make(data_config(**cfg), seed)
            bal_tr, bal_te = data.make(data_config(**cfg, start="balanced"), seed)
            assert np.bincount(bal_tr.tokens[:, 0].numpy(), minlength=K).tolist() == [n // K] * K
            assert bal_te.tokens[:, 0].tolist() == [i % K for i in range(25)]  # n_test = 25: counts 5,4,4,4,4,4
            P = data_config(**cfg).transition(seed)
            for uni, bal in ((uni_tr, bal_tr), (uni_te, bal_te)):
                walk = lambda s: torch.cat([s.tokens, s.y[:, None]], 1).numpy()  # noqa: E731
                if kw["name"] == "random_walk":
                    assert (np.diff(walk(bal)) % K == np.diff(walk(uni)) % K).all()
                assert (P[walk(bal)[:, :-1], walk(bal)[:, 1:]] > 0).all()  # every step one of Π's
                assert not torch.equal(bal.tokens, uni.tokens)
                assert torch.equal(bal.P_true, torch.from_numpy(P[bal.tokens[:, -1].numpy()]))


def test_a_balanced_start_is_the_same_data_through_every_path():
    """make (one run), make_batches (the stacked chunk) and draw_many (online batches) give a balanced run the
    same sequences."""
    from rw_sweeps.core.config import RunConfig

    for kw in WALKS:
        cfgs = [RunConfig(seed=s, data=data_config(**{"K": 6, "N": 25, "n_train": 36, "n_test": 12, "start": "balanced", **kw}))
                for s in (1, 2)]
        train, test = data.make_batches(cfgs, workers=2)
        for r, c in enumerate(cfgs):
            tr, te = data.make(c.data, c.seed)
            assert torch.equal(train.tokens[r], tr.tokens) and torch.equal(test.y[r], te.y)
        d = cfgs[0].data
        many = d.draw_many([c.data for c in cfgs], 12, [torch.Generator().manual_seed(9) for _ in cfgs], [1, 2])
        for s in many:
            assert s.tokens[:, 0].tolist() == [i % 6 for i in range(12)]


def test_a_balanced_start_refuses_a_training_set_that_is_not_a_multiple_of_K_in_one_line():
    import pytest

    from rw_sweeps.core.config import RunConfig, validate
    from rw_sweeps.core.errors import ConfigError

    for kw in WALKS:
        with pytest.raises(ConfigError, match=r"^invalid config: data\.n_train=1000: must be a multiple of "
                                              r"data\.K \(6\) with data\.start=balanced .* e\.g\. 996 or 1002$"):
            validate(RunConfig(data=data_config(start="balanced", **kw)))
        with pytest.raises(ConfigError, match=r"^invalid config: data\.start='sorted': must be one of uniform, balanced$"):
            validate(RunConfig(data=data_config(start="sorted", **kw)))
        validate(RunConfig(data=data_config(start="balanced", n_train=996, **kw)))
        with pytest.raises(ConfigError, match=r"data\.n_train=3: must be a multiple of data\.K \(6\) .* e\.g\. 6$"):
            validate(RunConfig(data=data_config(start="balanced", n_train=3, **kw)))


def test_a_seeds_walks_do_not_depend_on_torchs_default_dtype():
    """The draws are torch.rand's float32 numbers whatever dtype a notebook made the default (a float64
    default once changed every walk drawn with a fresh buffer). Each draw in a thread of its own: its own
    buffers (they are kept per thread and shape), made under that default."""
    c = data_config(K=7, N=23, p=0.3, n_train=37, n_test=29)

    def drawn(default) -> list:
        out, before = [], torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            t = threading.Thread(target=lambda: out.extend(s.tokens.clone() for s in data.make(c, 5)))
            t.start()
            t.join()
        finally:
            torch.set_default_dtype(before)
        return out

    wide, narrow = drawn(torch.float64), drawn(torch.float32)
    assert len(wide) == len(narrow) == 2 and all(torch.equal(a, b) for a, b in zip(wide, narrow))
