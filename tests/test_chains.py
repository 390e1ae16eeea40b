"""First-order Markov chains beyond the circle: lazy_walk, binary_chain, markov_matrix.

Each family's Π (each family's `transition`) is the law its sampler draws, its P_true is Π's row of the
last observed state, its opt_acc is the test set's Bayes-optimal accuracy, and the engine trains it as the
literal oracle does (binary_chain is K = 2, which the fused kernel must run too).
The last section: kth_order (an order-k chain, T per seed) and icl_markov (a chain per sequence), whose
P_true is the exact conditional (T's row of the last k states; the posterior predictive).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml

from rw_sweeps.core import data as data_mod
from rw_sweeps.core import config, fused, markov, model, oracle, training
from rw_sweeps.sweeps import run
from rw_sweeps.core.config import data_config
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.optimisers.gd import Gd

from .conftest import launch, summaries
from .test_engine import cfg

PI3 = [[0.8, 0.1, 0.1], [0.0, 0.6, 0.4], [0.3, 0.7, 0.0]]  # zeros: states of probability 0 never drawn
FAMILIES = {
    "lazy_walk": dict(name="lazy_walk", K=5, p=0.7, stay=0.4),
    "binary_chain": dict(name="binary_chain", K=2, p=0.2, q=0.3),
    "markov_matrix": dict(name="markov_matrix", K=3, Pi=PI3),
}


def test_each_family_has_its_pi():
    circle = markov.Pi(5, 0.7)
    assert np.array_equal(data_config(K=5, p=0.7).transition(), circle)  # random_walk: the circle's own Π
    lazy = data_config(**FAMILIES["lazy_walk"]).transition()
    assert np.allclose(lazy, 0.4 * np.eye(5) + 0.6 * circle, atol=0, rtol=0)
    assert lazy[0, 0] == 0.4 and math.isclose(lazy[0, 1], 0.42) and math.isclose(lazy[0, 4], 0.18)
    assert data_config(**FAMILIES["binary_chain"]).transition().tolist() == [[0.8, 0.2], [0.3, 0.7]]
    assert data_config(**FAMILIES["markov_matrix"]).transition().tolist() == PI3
    assert data_config(name="qa_majority", K=19, N=17).transition() is None


def assert_draws_follow_pi(d, train) -> np.ndarray:
    """The training set's transition counts within 5 standard errors of the family's Π, a zero of Π never
    drawn, and P_true Π's row of x_{N−1}; returns the sequences (n, N)."""
    P = d.transition()
    s = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
    counts = np.zeros((d.K, d.K))
    np.add.at(counts, (s[:, :-1].ravel(), s[:, 1:].ravel()), 1)
    rows = counts.sum(1, keepdims=True)
    se = np.sqrt(P * (1 - P) / rows)
    assert (np.abs(counts / rows - P) <= 5 * se + 1e-12).all(), (counts / rows, P)
    assert (counts[P == 0] == 0).all()  # a zero of Π is never drawn
    assert torch.equal(train.P_true, torch.from_numpy(P[train.tokens[:, -1].numpy()]))
    return s


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sampler_matches_pi(family):
    """Transition counts over 4000 sequences of 41 states (160 000 steps) within 5 standard errors of Π;
    P_true is Π's row of x_{N−1}; s_1 is uniform; the draw is a function of the seed alone."""
    d = data_config(N=41, n_train=4000, n_test=10, **FAMILIES[family])
    train, test = data_mod.make(d, 3)
    s = assert_draws_follow_pi(d, train)
    first = np.bincount(s[:, 0], minlength=d.K) / len(s)
    assert np.abs(first - 1 / d.K).max() < 5 * math.sqrt(1 / d.K / len(s))
    again = data_mod.make(d, 3)
    assert torch.equal(again[0].tokens, train.tokens) and torch.equal(again[1].y, test.y)
    assert not torch.equal(data_mod.make(d, 4)[0].tokens, train.tokens)


def test_make_batches_equals_make_for_every_family():
    for fam, kw in FAMILIES.items():
        cfgs = [cfg(seed=s, data=data_config(N=21, n_train=30, n_test=20, **kw)) for s in (0, 1)]
        tr, te = data_mod.make_batches(cfgs, workers=2)
        for r, c in enumerate(cfgs):
            a, b = data_mod.make(c.data, c.seed)
            assert torch.equal(tr.tokens[r], a.tokens) and torch.equal(te.P_true[r], b.P_true), fam


def _summary(c, tmp_path) -> dict:
    rec = training.train([c], [tmp_path], progress=False)[0]
    return training.summary(rec, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
@pytest.mark.parametrize("p", [0.5, 0.7, 0.15])
def test_random_walk_opt_acc_is_max_p(p, seed, tmp_path):
    c = cfg(seed=seed, data=data_config(K=5, N=21, p=p, n_train=20, n_test=30), optim=Gd(steps=1))
    assert _summary(c, tmp_path)["opt_acc"] == max(p, 1 - p) == c.opt_acc


def test_binary_chain_opt_acc_is_the_stationary_value(tmp_path):
    """p = 0.2, q = 0.3: the stationary law is (q, p)/(p + q) = (0.6, 0.4), so the Bayes accuracy tends to
    0.6·0.8 + 0.4·0.7 = 0.76 (|1 − p − q| = 0.5: s_{N−1} is stationary to 2⁻¹⁹ after N − 2 = 19 steps)."""
    c = cfg(data=data_config(name="binary_chain", K=2, N=21, p=0.2, q=0.3, n_train=20, n_test=20000),
            optim=Gd(steps=1))
    s = _summary(c, tmp_path)
    assert abs(s["opt_acc"] - 0.76) < 0.01, s["opt_acc"]
    _, test = data_mod.make(c.data, c.seed)  # exactly the test set's mean max_j P(y = j | context)
    assert s["opt_acc"] == test.P_true.max(1).values.mean().item()
    assert c.opt_acc is None  # no closed form: the summary measures it


def _engine_equals_oracle(data: dict, tmp_path, T: int = 20):
    """Train one run of `data` through training.train and literally (rw_sweeps.core.oracle), from the same dense
    Gaussian W: V, a, c and the test attention to 1e-8 after T steps, the accuracy exactly, and V moved.
    Returns the run's config, record and final V."""
    c = cfg(data=data_config(N=13, n_train=64, n_test=64, **data), model=ModelConfig(M=40),
            init=GaussianInit("gaussian", 0.02, "dense"), optim=Gd(lr=1.0, steps=T), eval_every=T,
            snapshot_steps=[0])
    rec = training.train([c], [tmp_path], progress=False)[0]
    assert rec.status == "done" and rec.steps == T
    *_, (_, _, _, theta) = oracle.train(c, T, trajectory=False)
    _, test = data_mod.make(c.data, c.seed)
    X, Xt = oracle.inputs(c, test.tokens)
    with torch.no_grad():
        f, S = oracle.forward(theta, X, Xt, c.model.ffn)
    last, first = rec.snapshots[-1], rec.snapshots[0]
    geo = model.geometry(c.model, c.data.N)
    a, cc = model.compact(theta["W"], c.model, c.data.K, c.data.N, geo)
    for name, got, ref in (("V", last["V"], theta["V"]), ("a", last["a"], a), ("c", last["c"], cc),
                           ("attention", last["attention"], S.mean(0))):
        got = torch.as_tensor(got, dtype=torch.float64)
        assert (got - ref).abs().max().item() <= 1e-8 * max(1.0, ref.abs().max().item()), name
    assert rec.history[-1]["test_acc"] == (f.argmax(1) == test.y).double().mean().item()
    assert (torch.tensor(last["V"]) - torch.tensor(first["V"])).abs().max().item() > 1e-2  # it really moved
    return c, rec, torch.tensor(last["V"], dtype=torch.float64)


def _cosine(V, PiT) -> float:
    return ((V * PiT).sum() / (V.norm() * PiT.norm())).item()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_engine_equals_the_oracle(family, tmp_path):
    """The training path (the fused kernel where built, K = 2 included) against the literal autograd model,
    after T steps from the same dense Gaussian W: V, a, c and the test attention to 1e-8, and the accuracy."""
    c, rec, V = _engine_equals_oracle(FAMILIES[family], tmp_path)
    assert fused.available(c) == (fused.library() is not None and fused.backend() != "torch")
    # cos(V, Πᵀ) with the family's Π
    assert math.isclose(rec.history[-1]["v_pi_cosine"], _cosine(V, torch.from_numpy(c.data.transition()).T),
                        rel_tol=1e-9)


@pytest.mark.e2e
def test_binary_chain_sweep_end_to_end(tmp_path):
    """`launch.py -m data=binary_chain data.p=0.2,0.8 data.q=0.3`: two real runs, each with its Π."""
    sweep = tmp_path / "sweep"
    r = launch("-m", "data=binary_chain", "data.p=0.2,0.8", "data.q=0.3", "data.N=21", "model.M=40",
               "data.n_train=200", "data.n_test=2000", "optim.steps=5", "wandb.mode=disabled",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"sweep {sweep}: 2 runs: 2 done, 0 skipped, 0 failed, 0 diverged" in r.stdout
    runs = summaries(sweep)
    assert sorted(s["p"] for s in runs.values()) == [0.2, 0.8]
    # stationary Bayes accuracy (q·max(1−p, p) + p·max(q, 1−q))/(p + q): 0.76 for p = 0.2, 0.8/1.1 for p = 0.8
    want = {0.2: 0.76, 0.8: 0.8 / 1.1}
    for name, s in runs.items():
        conf = yaml.safe_load((sweep / name / "config.yaml").read_text())["data"]
        assert (conf["name"], conf["K"], conf["q"]) == ("binary_chain", 2, 0.3) and s["data"] == "binary_chain"
        assert s["status"] == "done" and s["steps"] == 5 and abs(s["opt_acc"] - want[s["p"]]) < 0.03, s
        hist = [json.loads(ln) for ln in (sweep / name / "history.jsonl").read_text().splitlines()]
        assert hist[-1]["v_pi_cosine"] is not None


@pytest.mark.e2e
def test_markov_matrix_from_the_command_line(tmp_path):
    """Π given inline on the command line reaches the run as a list of rows."""
    out = tmp_path / "run"
    r = launch("data=markov_matrix", "data.K=2", "data.Pi=[[0.9,0.1],[0.2,0.8]]", "data.N=9", "model.M=20",
               "data.n_train=50", "data.n_test=50", "optim.steps=2", "wandb.mode=disabled",
               f"hydra.run.dir={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["Pi"] == [[0.9, 0.1], [0.2, 0.8]]
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "done" and 0.8 <= s["opt_acc"] <= 0.9


# ------------------------------------------------------------------ jump_walk and graph_walk
NEW_FAMILIES = {
    "jump_walk": dict(name="jump_walk", K=7, jumps=[0.3, 0.2, 0.25, 0.15, 0.0, 0.1]),
    "graph_walk_grid": dict(name="graph_walk", graph="grid", side=3, K=9),
    "graph_walk_random_regular": dict(name="graph_walk", graph="random_regular", K=10, degree=3),
}


def test_jump_walk_pi():
    P = data_config(**NEW_FAMILIES["jump_walk"]).transition()
    want = {1: 0.3, 6: 0.2, 2: 0.25, 5: 0.15, 3: 0.0, 4: 0.1}  # +1, −1, +2, −2, +3, −3 from node 0 (mod 7)
    assert [P[0, j] for j in range(7)] == [0.0] + [want[j] for j in range(1, 7)]
    assert np.array_equal(P[3], np.roll(P[0], 3)) and np.allclose(P.sum(1), 1, atol=1e-15, rtol=0)
    # K = 4: +2 and −2 land on the same node, and add; jumps of r ≥ K/2 wrap around (+3 ≡ −1, +4 ≡ 0 holds still)
    Q = data_config(name="jump_walk", K=4, jumps=[0.3, 0.2, 0.25, 0.15, 0.05, 0.0, 0.05, 0.0]).transition()
    assert Q[0].tolist() == pytest.approx([0.05, 0.3, 0.4, 0.2 + 0.05], abs=1e-15)
    assert np.allclose(data_config(name="jump_walk", K=5, jumps=[0.7, 0.3]).transition(), markov.Pi(5, 0.7), atol=1e-15, rtol=0)


def test_graph_walk_pi_of_each_graph():
    g = lambda graph, K, **kw: data_config(name="graph_walk", graph=graph, K=K, **kw).transition()  # noqa: E731
    assert np.array_equal(g("cycle", 6), markov.Pi(6, 0.5))  # the p = 0.5 circle, bit for bit
    path = g("path", 5)
    assert path[0].tolist() == [0, 1, 0, 0, 0] and path[4].tolist() == [0, 0, 0, 1, 0]
    assert path[2].tolist() == [0, 0.5, 0, 0.5, 0]
    complete = g("complete", 5)
    assert np.array_equal(complete, (np.ones((5, 5)) - np.eye(5)) / 4)
    grid = g("grid", 9, side=3)  # node 3·row + column
    assert grid[0].tolist() == [0, 0.5, 0, 0.5, 0, 0, 0, 0, 0]  # corner: right and down
    assert set(np.flatnonzero(grid[4])) == {1, 3, 5, 7} and (grid[4][[1, 3, 5, 7]] == 0.25).all()
    assert set(np.flatnonzero(grid[1])) == {0, 2, 4}
    torus = g("torus", 16, side=4)
    assert (np.count_nonzero(torus, 1) == 4).all() and set(np.flatnonzero(torus[0])) == {1, 3, 4, 12}
    cube = g("hypercube", 8, dim=3)
    assert set(np.flatnonzero(cube[0])) == {1, 2, 4} and set(np.flatnonzero(cube[5])) == {4, 7, 1}
    for seed in (0, 1, 2):
        P = data_config(**NEW_FAMILIES["graph_walk_random_regular"]).transition(seed)
        A = P > 0
        assert (A.sum(1) == 3).all() and (A == A.T).all() and not A.diagonal().any() and (P[A] == 1 / 3).all()
    r0, r1 = (data_config(**NEW_FAMILIES["graph_walk_random_regular"]).transition(s) for s in (0, 1))
    assert not np.array_equal(r0, r1)  # Π is per run: the graph is drawn from the seed
    assert np.array_equal(r0, data_config(**NEW_FAMILIES["graph_walk_random_regular"]).transition(0))
    for P in (path, complete, grid, torus, cube):
        assert np.allclose(P.sum(1), 1, atol=1e-15, rtol=0)


@pytest.mark.parametrize("family", sorted(NEW_FAMILIES))
def test_new_sampler_matches_pi(family):
    """As test_sampler_matches_pi, with the run's seed passed to Π (random_regular's graph is the seed's)."""
    d = data_config(N=41, n_train=4000, n_test=10, **NEW_FAMILIES[family])
    seed = 3
    P = d.transition(seed)
    train, test = data_mod.make(d, seed)
    s = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
    counts = np.zeros((d.K, d.K))
    np.add.at(counts, (s[:, :-1].ravel(), s[:, 1:].ravel()), 1)
    rows = counts.sum(1, keepdims=True)
    se = np.sqrt(P * (1 - P) / rows)
    assert (np.abs(counts / rows - P) <= 5 * se + 1e-12).all(), (counts / rows, P)
    assert (counts[P == 0] == 0).all()
    assert torch.equal(train.P_true, torch.from_numpy(P[train.tokens[:, -1].numpy()]))
    cfgs = [cfg(seed=sd, data=data_config(N=21, n_train=30, n_test=20, **NEW_FAMILIES[family])) for sd in (0, 1)]
    tr, te = data_mod.make_batches(cfgs, workers=2)
    for r, c in enumerate(cfgs):
        a, b = data_mod.make(c.data, c.seed)
        assert torch.equal(tr.tokens[r], a.tokens) and torch.equal(te.P_true[r], b.P_true)


def test_graph_walk_cycle_is_the_half_circle(tmp_path):
    """graph=cycle goes through the circle's own sampler: the same data, Π and opt_acc as random_walk p = 0.5."""
    kw = dict(K=6, N=13, n_train=40, n_test=300)
    g, w = (cfg(data=data_config(**kw, **extra), optim=Gd(steps=2))
            for extra in (dict(name="graph_walk", graph="cycle"), dict(p=0.5)))
    for a, b in zip(data_mod.make(g.data, g.seed), data_mod.make(w.data, w.seed)):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.y, b.y) and torch.equal(a.P_true, b.P_true)
    sg, sw = _summary(g, tmp_path / "g"), _summary(w, tmp_path / "w")
    assert sg["opt_acc"] == sw["opt_acc"] == 0.5
    assert sg["test_acc"] == sw["test_acc"] and sg["v_pi_cosine"] == sw["v_pi_cosine"]


@pytest.mark.parametrize("family", ["jump_walk", "graph_walk_random_regular"])
def test_new_family_engine_equals_the_oracle(family, tmp_path, monkeypatch):
    """The oracle test above on jump_walk and on the random 3-regular graph of seed 0 (cfg's seed)."""
    monkeypatch.setitem(FAMILIES, family, NEW_FAMILIES[family])
    test_engine_equals_the_oracle(family, tmp_path)


@pytest.mark.e2e
def test_graph_walk_sweep_end_to_end(tmp_path):
    """`launch.py -m data=graph_walk data.graph=cycle,complete data.K=6 optim.steps=3`: two real runs."""
    sweep = tmp_path / "sweep"
    r = launch("-m", "data=graph_walk", "data.graph=cycle,complete", "data.K=6", "optim.steps=3", "data.N=21",
               "model.M=40", "data.n_train=100", "data.n_test=500", "wandb.mode=disabled",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"sweep {sweep}: 2 runs: 2 done, 0 skipped, 0 failed, 0 diverged" in r.stdout
    graphs = {}
    for name, s in summaries(sweep).items():
        graphs[yaml.safe_load((sweep / name / "config.yaml").read_text())["data"]["graph"]] = s
        assert s["status"] == "done" and s["steps"] == 3 and s["trap"] is False
    assert graphs["cycle"]["opt_acc"] == 0.5  # 1/(K − 1) on the complete graph: every neighbour ties
    assert math.isclose(graphs["complete"]["opt_acc"], 0.2, rel_tol=0, abs_tol=1e-12)


# ------------------------------------------------------------------ the trap flag (Theorem 4.1 generalised)
PERM_5 = [[0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0]]  # (0 1 2)(3 4)
CYCLE_5 = [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [0, 1, 0, 0, 0]]  # 0→2→4→1→3→0


@pytest.mark.parametrize("data,trap", [
    (dict(K=4, N=9, p=1.0), True), (dict(K=4, N=9, p=0.0), True), (dict(K=4, N=13, p=1.0), True),
    (dict(K=4, N=10, p=1.0), False), (dict(K=4, N=9, p=0.5), False), (dict(K=4, N=9, p=0.9), False),
    (dict(name="markov_matrix", K=5, N=11, Pi=CYCLE_5), True),  # one 5-cycle, 5 | N − 1 = 10
    (dict(name="markov_matrix", K=5, N=6, Pi=CYCLE_5), True),
    (dict(name="markov_matrix", K=5, N=9, Pi=CYCLE_5), False),  # 5 ∤ 8
    # two cycles whose lengths 3 and 2 both divide N − 1 = 6: each sequence's histogram is uniform on its own
    # cycle, a function of the cycle the walk is in: zero init stays at the symmetric point, a trap
    (dict(name="markov_matrix", K=5, N=7, Pi=PERM_5), True),
    (dict(name="markov_matrix", K=5, N=10, Pi=PERM_5), False),  # 3 ∤ 9
    (dict(name="jump_walk", K=5, N=11, jumps=[0.0, 0.0, 1.0, 0.0]), True),  # +2 mod 5: one 5-cycle
    (dict(name="jump_walk", K=4, N=9, jumps=[0.0, 0.0, 1.0, 0.0]), True),  # +2 mod 4: (0 2)(1 3), 2 | 8
    (dict(name="jump_walk", K=4, N=10, jumps=[0.0, 0.0, 1.0, 0.0]), False),  # 2 ∤ 9
    (dict(name="graph_walk", graph="path", K=2, N=9), True),  # the walk on one edge: 0 1 0 1 …
    (dict(name="graph_walk", graph="cycle", K=4, N=9), False),
])
def test_trap_flag(data, trap, tmp_path):
    c = cfg(data=data_config(n_train=50, n_test=10, **data), model=ModelConfig(M=data["N"] + 1), optim=Gd(steps=1))
    s = _summary(c, tmp_path)
    assert s["trap"] is trap
    train, _ = data_mod.make(c.data, c.seed)  # directly: within each cycle, every histogram against the first
    h = torch.stack([torch.bincount(t, minlength=c.data.K) for t in train.tokens])
    cycle = [frozenset(t.tolist()) for t in train.tokens]  # a permutation's walk visits its whole cycle
    assert all(bool((h[[i for i, c in enumerate(cycle) if c == one]] == h[cycle.index(one)]).all())
               for one in set(cycle)) is trap


def test_trap_flags_per_run_and_the_phase_outline():
    tokens = torch.tensor([[[0, 1, 1], [1, 0, 1]], [[0, 1, 1], [1, 1, 1]]], dtype=torch.uint8)  # R = 2, n = 2
    assert training.trap_flags(tokens, 3) == [True, False]
    from analysis.phase import theory_fails
    import pandas as pd
    df = pd.DataFrame({"init": ["zero", "zero", "zero", "gaussian"], "data": ["markov_matrix"] * 4,
                       "p": [0.5] * 4, "K": [5] * 4, "N": [7] * 4, "trap": [True, False, None, True]})
    assert theory_fails(df).tolist() == [True, False, False, False]  # the flag; no flag and not the circle
    old = pd.DataFrame({"init": ["zero", "zero"], "data": ["random_walk"] * 2, "p": [1.0, 1.0], "K": [4, 4],
                        "N": [9, 10]})  # a folder from before the flag: the circle's formula
    assert theory_fails(old).tolist() == [True, False]


# ---------------------------------------------------------------- chains that are not first order
KTH = dict(name="kth_order", K=3, order=2, alpha=1.0)
ICL = dict(name="icl_markov", K=3, alpha=1.0)


def test_kth_order_sampler_matches_its_tensor():
    """Transition counts per context (9 contexts × 3 states) over 4000 sequences of 41 states within 5
    standard errors of T; s_1, s_2 uniform; P_true = T[x_{N−2}, x_{N−1}] in both sets (one T per run)."""
    d = data_config(N=41, n_train=4000, n_test=500, **KTH)
    T = markov.kth_tensor(3, 2, 1.0, 3)
    assert T.shape == (3, 3, 3) and np.allclose(T.sum(-1), 1, rtol=0, atol=1e-12) and (T > 0).all()
    train, test = data_mod.make(d, 3)
    s = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
    counts = np.zeros((3, 3, 3))
    np.add.at(counts, (s[:, :-2].ravel(), s[:, 1:-1].ravel(), s[:, 2:].ravel()), 1)
    rows = counts.sum(-1, keepdims=True)
    assert rows.min() > 1000
    se = np.sqrt(T * (1 - T) / rows)
    assert (np.abs(counts / rows - T) <= 5 * se).all(), (counts / rows, T)
    first = np.bincount(s[:, :2].ravel(), minlength=3) / s[:, :2].size
    assert np.abs(first - 1 / 3).max() < 5 * math.sqrt(2 / 9 / s[:, :2].size)
    for split in (train, test):  # the same T for the training and the test set
        tok = split.tokens.numpy()
        assert torch.equal(split.P_true, torch.from_numpy(T[tok[:, -2], tok[:, -1]]))
    # T is the seed's: the same again, another for another seed, on a stream that is neither the data's nor
    # the init's
    assert np.array_equal(markov.kth_tensor(3, 2, 1.0, 3), T)
    assert np.abs(markov.kth_tensor(3, 2, 1.0, 4) - T).max() > 0.1
    for seed in (0, 1, 3, 2**32 - 1, 123456789):
        assert markov.kth_seed(seed) not in (seed, model.init_seed(seed))
    assert not torch.equal(data_mod.make(d, 4)[0].tokens, train.tokens)


def test_kth_order_one_is_a_first_order_chain():
    """order = 1: T is a K×K Π; v_pi_cosine's Π is T, and none for order 2 or icl_markov."""
    d = data_config(N=21, n_train=3000, n_test=10, **{**KTH, "order": 1, "K": 4})
    T = markov.kth_tensor(4, 1, 1.0, 5)
    assert T.shape == (4, 4) and np.array_equal(d.first_order_pi(5), T)
    train, _ = data_mod.make(d, 5)
    s = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
    counts = np.zeros((4, 4))
    np.add.at(counts, (s[:, :-1].ravel(), s[:, 1:].ravel()), 1)
    rows = counts.sum(1, keepdims=True)
    assert (np.abs(counts / rows - T) <= 5 * np.sqrt(T * (1 - T) / rows)).all()
    assert data_config(N=21, **KTH).first_order_pi(5) is None
    assert data_config(N=21, **ICL).first_order_pi(5) is None
    assert np.array_equal(data_config(K=5, p=0.7).first_order_pi(0), markov.Pi(5, 0.7))


def _posterior_by_hand(tokens: np.ndarray, K: int, alpha: float) -> np.ndarray:
    """(n_{s,j} + alpha)/(n_s + K·alpha), s = x_{N−1}, counting s → j among x_1..x_{N−1}: a loop per sequence."""
    out = np.empty((len(tokens), K))
    for i, x in enumerate(tokens.tolist()):
        s = x[-1]
        n_s = [0] * K
        for a, b in zip(x[:-1], x[1:]):
            if a == s:
                n_s[b] += 1
        for j in range(K):
            out[i, j] = (n_s[j] + alpha) / (sum(n_s) + K * alpha)
    return out


def test_icl_markov_p_true_is_the_posterior_predictive():
    """P_true equals the posterior predictive from the tokens, exactly; it is calibrated: over all (sequence,
    j), the frequency of y = j among the pairs whose P_true[j] falls in a bin matches the bin's mean P_true
    within 5 standard errors; every sequence has its own chain (its rows differ from its neighbours')."""
    d = data_config(N=25, n_train=200, n_test=20000, **{**ICL, "alpha": 0.5})
    train, test = data_mod.make(d, 2)
    for split in (train, test):
        assert torch.equal(split.P_true, torch.from_numpy(_posterior_by_hand(split.tokens.numpy(), 3, 0.5)))
    P, Y = test.P_true.numpy().ravel(), torch.nn.functional.one_hot(test.y, 3).numpy().ravel()
    bins = np.digitize(P, np.linspace(0, 1, 11)[1:-1])
    checked = 0
    for b in range(10):
        m = bins == b
        if m.sum() < 500:
            continue
        checked += 1
        want = P[m].mean()
        assert abs(Y[m].mean() - want) <= 5 * math.sqrt(want * (1 - want) / m.sum()), (b, Y[m].mean(), want)
    assert checked >= 8
    # a fresh chain per sequence: the posterior given 24 tokens is far from any one fixed Π, so the spread of
    # P_true over sequences with the same last state is wide
    s = test.tokens[:, -1]
    assert test.P_true[s == 0, 0].std().item() > 0.2
    again = data_mod.make(d, 2)
    assert torch.equal(again[1].tokens, test.tokens) and not torch.equal(data_mod.make(d, 3)[1].tokens, test.tokens)


def test_icl_markov_opt_acc_grows_with_N(tmp_path):
    """Longer contexts, sharper posteriors: the Bayes accuracy (20 000 test sequences, K = 3, alpha = 1) is
    exactly 1/3 at N = 2 (no transition seen), then 0.477, 0.570, 0.609 at N = 5, 20, 100, below its N → ∞
    limit E[max_j Π_{s,j}] ≈ 0.62 (11/18 ≈ 0.611 for a row drawn independently of s's stationary weight)."""
    acc = {}
    for N in (2, 5, 20, 100):
        d = data_config(N=N, n_train=10, n_test=20000, **ICL)
        acc[N] = data_mod.make(d, 0)[1].P_true.max(1).values.mean().item()
    assert acc[2] == pytest.approx(1 / 3, abs=1e-15)
    assert 0.46 < acc[5] < 0.49 and 0.555 < acc[20] < 0.585 and 0.595 < acc[100] < 0.625, acc
    assert acc[2] < acc[5] < acc[20] < acc[100] <= 1
    c = cfg(data=data_config(N=20, n_train=10, n_test=20000, **ICL), model=ModelConfig(M=40), optim=Gd(steps=1))
    s = _summary(c, tmp_path)
    assert s["opt_acc"] == data_mod.make(c.data, c.seed)[1].P_true.max(1).values.mean().item() and c.opt_acc is None


def test_kth_order_opt_acc_is_the_tensor_s(tmp_path):
    """opt_acc = mean over the test set of max_j T[context, j]: ≤ 1, and near the mean of T's row maxima
    over uniform contexts (the chain's contexts are not exactly uniform)."""
    c = cfg(data=data_config(N=21, n_train=10, n_test=5000, **KTH), model=ModelConfig(M=40), optim=Gd(steps=1))
    s = _summary(c, tmp_path)
    _, test = data_mod.make(c.data, c.seed)
    T = markov.kth_tensor(3, 2, 1.0, c.seed)
    tok = test.tokens.numpy()
    assert s["opt_acc"] == T[tok[:, -2], tok[:, -1]].max(1).mean() <= 1
    assert abs(s["opt_acc"] - T.max(-1).mean()) < 0.1


CONTEXT_CASES = {"kth_order_1": {**KTH, "order": 1}, "kth_order_2": KTH, "icl_markov": ICL}


@pytest.mark.parametrize("case", sorted(CONTEXT_CASES))
def test_engine_equals_the_oracle_beyond_first_order(case, tmp_path):
    """As test_engine_equals_the_oracle: V, a, c and the test attention to 1e-8 after T steps, the accuracy
    exactly; v_pi_cosine against T for order 1, null where there is no single Π."""
    c, rec, V = _engine_equals_oracle(CONTEXT_CASES[case], tmp_path)
    cos = rec.history[-1]["v_pi_cosine"]
    if case == "kth_order_1":
        assert math.isclose(cos, _cosine(V, torch.from_numpy(markov.kth_tensor(3, 1, 1.0, c.seed)).T), rel_tol=1e-9)
    else:
        assert cos is None


@pytest.mark.e2e
def test_icl_markov_sweep_end_to_end(tmp_path):
    """`launch.py -m data=icl_markov data.N=9,17 optim.steps=3`: two runs, opt_acc measured, v_pi_cosine null."""
    sweep = tmp_path / "sweep"
    r = launch("-m", "data=icl_markov", "data.N=9,17", "optim.steps=3", "model.M=40", "data.n_train=200",
               "data.n_test=4000", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"sweep {sweep}: 2 runs: 2 done, 0 skipped, 0 failed, 0 diverged" in r.stdout
    runs = summaries(sweep)
    by_N = {s["N"]: s for s in runs.values()}
    assert sorted(by_N) == [9, 17] and all(s["status"] == "done" and s["steps"] == 3 for s in by_N.values())
    assert 1 / 3 < by_N[9]["opt_acc"] < by_N[17]["opt_acc"] < 0.62, by_N
    for name in runs:
        hist = [json.loads(ln) for ln in (sweep / name / "history.jsonl").read_text().splitlines()]
        assert hist[-1]["v_pi_cosine"] is None


def test_make_batches_and_prefetch_equal_make_beyond_first_order():
    """Stacked (2 workers) and prefetched draws are make's, run by run; runs of another order train apart
    (shape_key), so a batch's runs all have a Π or none has."""
    cfgs = [cfg(seed=s, data=data_config(N=21, n_train=30, n_test=20, **kw)) for kw in (KTH, {**KTH, "order": 1})
            for s in (0, 1)]
    for batch in (cfgs, [cfg(seed=s, data=data_config(N=21, n_train=30, n_test=20, **ICL)) for s in (0, 1)]):
        data_mod.prefetch(batch[1:])
        tr, te = data_mod.make_batches(batch, workers=2)
        for r, c in enumerate(batch):
            a, b = data_mod.make(c.data, c.seed)
            assert torch.equal(tr.tokens[r], a.tokens) and torch.equal(te.P_true[r], b.P_true), c.data
    assert config.shape_key(cfgs[0]) != config.shape_key(cfgs[2])


def test_parent_positions_are_the_last_k_for_an_order_k_chain(tmp_path):
    # "parent" is position N−1 in every first-order family; an order-k chain reads N−k … N−1, and
    # parents_attention is the final mean attention on them (from the last snapshot, taken at the last step)
    from rw_sweeps.core.training import parent_positions

    kth = cfg(data=data_config(name="kth_order", K=3, N=13, order=3, n_train=64, n_test=64), optim=Gd(steps=3))
    walk = cfg(data=data_config(K=4, N=13, n_train=64, n_test=64), optim=Gd(steps=3))
    assert parent_positions(kth) == [10, 11, 12] and parent_positions(walk) == [12]
    s_kth, s_walk = (run.run_batch([c], [tmp_path / n], progress=False)[0] for c, n in ((kth, "k"), (walk, "w")))
    snaps = [json.loads(line) for line in (tmp_path / "k" / "snapshots.jsonl").read_text().splitlines()]
    assert s_kth["parent_positions"] == [10, 11, 12]
    assert s_kth["parents_attention"] == pytest.approx(sum(snaps[-1]["attention"][9:12]), abs=1e-15)
    assert s_walk["parents_attention"] == pytest.approx(s_walk["parent_attention"], abs=1e-12)


@pytest.mark.e2e
def test_markov_matrix_reads_its_pi_from_a_file_and_records_it(tmp_path):
    # text (commas or spaces) or .npy; the run's config.yaml holds the matrix itself
    (tmp_path / "pi.txt").write_text("0.9, 0.1\n0.2 0.8\n")
    np.save(tmp_path / "pi.npy", np.array([[0.9, 0.1], [0.2, 0.8]]))
    for name in ("pi.txt", "pi.npy"):
        out = tmp_path / ("run_" + name)
        r = launch("data=markov_matrix", "data.K=2", f"data.Pi_file={tmp_path / name}", "data.N=9", "model.M=20",
                   "data.n_train=32", "data.n_test=32", "optim.steps=2", "wandb.mode=disabled",
                   f"hydra.run.dir={out}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert yaml.safe_load((out / "config.yaml").read_text())["data"]["Pi"] == [[0.9, 0.1], [0.2, 0.8]]
    (tmp_path / "bad.txt").write_text("0.9 0.2\n0.2 0.8\n")
    for arg, message in ((f"data.Pi_file={tmp_path / 'bad.txt'}", "row 0 sums to 1.1"),
                         (f"data.Pi_file={tmp_path / 'missing.txt'}", "data.Pi_file=")):
        r = launch("data=markov_matrix", "data.K=2", arg, "wandb.mode=disabled", cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and message in lines[0], r.stderr


def test_a_runs_line_names_the_family_where_p_means_nothing():
    base = {"status": "done", "K": 6, "N": 97, "init": "zero", "seed": 0, "steps": 2, "test_acc": 0.5, "opt_acc": 0.5,
            "parent_attention": 1.0, "v_pi_cosine": 0.9, "test_kl": 0.1, "symmetry_break_step": 2, "p": 0.5}
    assert run.run_line({**base, "data": "random_walk"}).startswith("done: p=0.5 K=6")
    assert run.run_line({**base, "data": "graph_walk"}).startswith("done: data=graph_walk K=6")
    assert run.run_line({**base, "data": "icl_markov", "status": "diverged", "error": "x"}) == \
        "diverged: data=icl_markov init=zero seed=0: x"
