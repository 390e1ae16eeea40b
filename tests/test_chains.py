"""First-order Markov chains beyond the circle (issue 12): lazy_walk, binary_chain, markov_matrix.

Each family's Π (rw_sweeps.markov.transition) is the law its sampler draws, its P_true is Π's row of the
last observed state, its opt_acc is the test set's Bayes-optimal accuracy, and the engine trains it as the
literal oracle does (binary_chain is K = 2, which the fused kernel must run too).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml

from rw_sweeps import data as data_mod
from rw_sweeps import fused, markov, model, oracle, training
from rw_sweeps.config import DataConfig, InitConfig, ModelConfig, OptimConfig

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
    assert np.array_equal(markov.of(DataConfig(K=5, p=0.7)), circle)  # random_walk: the circle's own Π
    lazy = markov.of(DataConfig(**FAMILIES["lazy_walk"]))
    assert np.allclose(lazy, 0.4 * np.eye(5) + 0.6 * circle, atol=0, rtol=0)
    assert lazy[0, 0] == 0.4 and math.isclose(lazy[0, 1], 0.42) and math.isclose(lazy[0, 4], 0.18)
    assert markov.of(DataConfig(**FAMILIES["binary_chain"])).tolist() == [[0.8, 0.2], [0.3, 0.7]]
    assert markov.of(DataConfig(**FAMILIES["markov_matrix"])).tolist() == PI3
    assert markov.of(DataConfig(name="qa_majority", K=19, N=17)) is None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sampler_matches_pi(family):
    """Transition counts over 4000 sequences of 41 states (160 000 steps) within 5 standard errors of Π;
    P_true is Π's row of x_{N−1}; s_1 is uniform; the draw is a function of the seed alone."""
    d = DataConfig(N=41, n_train=4000, n_test=10, **FAMILIES[family])
    P = markov.of(d)
    train, test = data_mod.make(d, 3)
    s = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
    counts = np.zeros((d.K, d.K))
    np.add.at(counts, (s[:, :-1].ravel(), s[:, 1:].ravel()), 1)
    rows = counts.sum(1, keepdims=True)
    se = np.sqrt(P * (1 - P) / rows)
    assert (np.abs(counts / rows - P) <= 5 * se + 1e-12).all(), (counts / rows, P)
    assert (counts[P == 0] == 0).all()  # a zero of Π is never drawn
    first = np.bincount(s[:, 0], minlength=d.K) / len(s)
    assert np.abs(first - 1 / d.K).max() < 5 * math.sqrt(1 / d.K / len(s))
    assert torch.equal(train.P_true, torch.from_numpy(P[train.tokens[:, -1].numpy()]))
    again = data_mod.make(d, 3)
    assert torch.equal(again[0].tokens, train.tokens) and torch.equal(again[1].y, test.y)
    assert not torch.equal(data_mod.make(d, 4)[0].tokens, train.tokens)


def test_make_batches_equals_make_for_every_family():
    for fam, kw in FAMILIES.items():
        cfgs = [cfg(seed=s, data=DataConfig(N=21, n_train=30, n_test=20, **kw)) for s in (0, 1)]
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
    c = cfg(seed=seed, data=DataConfig(K=5, N=21, p=p, n_train=20, n_test=30), optim=OptimConfig(steps=1))
    assert _summary(c, tmp_path)["opt_acc"] == max(p, 1 - p) == c.opt_acc


def test_binary_chain_opt_acc_is_the_stationary_value(tmp_path):
    """p = 0.2, q = 0.3: the stationary law is (q, p)/(p + q) = (0.6, 0.4), so the Bayes accuracy tends to
    0.6·0.8 + 0.4·0.7 = 0.76 (|1 − p − q| = 0.5: s_{N−1} is stationary to 2⁻¹⁹ after N − 2 = 19 steps)."""
    c = cfg(data=DataConfig(name="binary_chain", K=2, N=21, p=0.2, q=0.3, n_train=20, n_test=20000),
            optim=OptimConfig(steps=1))
    s = _summary(c, tmp_path)
    assert abs(s["opt_acc"] - 0.76) < 0.01, s["opt_acc"]
    _, test = data_mod.make(c.data, c.seed)  # exactly the test set's mean max_j P(y = j | context)
    assert s["opt_acc"] == test.P_true.max(1).values.mean().item()
    assert c.opt_acc is None  # no closed form: the summary measures it


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_engine_equals_the_oracle(family, tmp_path):
    """The training path (the fused kernel where built, K = 2 included) against the literal autograd model,
    after T steps from the same dense Gaussian W: V, a, c and the test attention to 1e-8, and the accuracy."""
    T = 20
    c = cfg(data=DataConfig(N=13, n_train=64, n_test=64, **FAMILIES[family]), model=ModelConfig(M=40),
            init=InitConfig("gaussian", 0.02, "dense"), optim=OptimConfig(lr=1.0, steps=T), eval_every=T,
            snapshot_steps=[0])
    assert fused.available(c) == (fused.library() is not None and fused.backend() != "torch")
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
    # cos(V, Πᵀ) with the family's Π
    PiT = torch.from_numpy(markov.of(c.data)).T
    V = torch.tensor(last["V"], dtype=torch.float64)
    assert math.isclose(rec.history[-1]["v_pi_cosine"], ((V * PiT).sum() / (V.norm() * PiT.norm())).item(),
                        rel_tol=1e-9)


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
