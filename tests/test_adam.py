"""optim=adam: the compact Adam of `rw_sweeps.core.adam`, through the training loop, against torch.optim.Adam on
the literal dense θ (`oracle.train`); a batch against its runs alone; checkpoints that carry the moments."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from rw_sweeps.core import adam, config, model, oracle, results, training
from rw_sweeps.sweeps import run
from rw_sweeps.core import data as data_mod
from rw_sweeps.core.config import ConfigError, RunConfig, data_config, from_dict, validate
from rw_sweeps.core.models import FfnModelConfig, ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.inits.zero import ZeroInit
from rw_sweeps.core.optimisers.adam import Adam

from .test_config import checked

T = 25
DENSE = GaussianInit("gaussian", 0.05, draw="dense")  # the oracle starts from the very same W


def cfg(**kw) -> RunConfig:
    base = dict(data=data_config(K=5, N=21, p=0.7, n_train=100, n_test=50), model=ModelConfig(M=64),
                optim=Adam(name="adam", lr=0.003, steps=T), snapshot_steps=[0, 10, T],
                wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    base.update(kw)
    return validate(RunConfig(**base))


def opt(**kw) -> Adam:
    return Adam(**{"lr": 0.003, "steps": T, **kw})


CASES = {  # normalize=auto: none for zero init, whole for Gaussian
    "zero-none-mean": {},
    "zero-whole-sum": dict(model=ModelConfig(M=64, normalize="whole"), optim=opt(lr=0.02, reduction="sum")),
    "gaussian-whole-mean": dict(init=DENSE, optim=opt(lr=0.02)),
    "gaussian-none-sum": dict(init=DENSE, model=ModelConfig(M=64, normalize="none"), optim=opt(reduction="sum")),
    "gaussian-positional": dict(init=DENSE, model=ModelConfig(M=64, normalize="positional"), optim=opt(lr=0.02)),
    # β₁, β₂, ε_A of their own; M + 1, a scale and the numeric Gram: a compact draw lifted to a dense W
    "hyper-M+1-numeric": dict(init=GaussianInit("gaussian", 0.05), optim=opt(lr=0.02, beta1=0.5, beta2=0.9, adam_eps=1e-3),
                              model=ModelConfig(M=64, pos_denom="M+1", pos_scale=0.5, gram="numeric")),
    "float32": dict(precision="float32", init=DENSE, optim=opt(lr=0.02)),
    "ffn-gaussian": dict(model=FfnModelConfig(name="transformer_ffn", M=64, m=7), init=GaussianInit("gaussian", 0.1, draw="dense"),
                         optim=opt(lr=0.02)),
    "ffn-before": dict(model=FfnModelConfig(name="transformer_ffn", M=64, m=7, ffn="before"),
                       init=GaussianInit("gaussian", 0.1, draw="dense"), optim=opt(lr=0.02)),
}


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _oracle_probe(c: RunConfig, theta: dict) -> tuple[dict, float, float]:
    """The dense θ's compact view (V, A, a = (W x̂_N)[:K], c = P (W x̂_N)[K:]) and its test accuracy and loss."""
    K, N = c.data.K, c.data.N
    geo = model.geometry(c.model, N)
    P = model.positions(c.model, N)
    u = theta["W"] @ torch.cat([torch.zeros(K, dtype=torch.float64), P[-1] / geo.nu_q])
    _, te = data_mod.make(c.data, c.seed)
    Xt = oracle.embed(te.tokens, P, K, c.model.normalize)
    X = Xt.new_zeros(te.tokens.shape[0], K, N)
    X[:, :, :-1] = torch.nn.functional.one_hot(te.tokens, K).transpose(1, 2).double()
    with torch.no_grad():
        f, _ = oracle.forward(theta, X, Xt, c.model.ffn)
    F = f[torch.arange(len(te.y)), te.y]
    acc = (f.argmax(1) == te.y).double().mean().item()
    compact = {"V": theta["V"], "A": theta.get("A"), "a": u[:K], "c": P @ u[K:]}
    return compact, acc, (-torch.log(F + c.optim.eps)).mean().item()


@pytest.mark.parametrize("case", sorted(CASES))
def test_adam_matches_torch_optim_adam_on_the_dense_model(case, tmp_path):
    c = cfg(**CASES[case])
    s = run.run_batch([c], [tmp_path])[0]
    assert s["status"] == "done" and s["steps"] == T
    snaps = {x["step"]: x for x in _lines(tmp_path / "snapshots.jsonl")}
    hist = {x["step"]: x for x in _lines(tmp_path / "history.jsonl")}
    ref = oracle.train(c, T)
    f64 = c.precision == "float64"
    tol = (lambda v: 1e-8) if f64 else (lambda v: 1e-5 * max(1.0, v.abs().max().item()))  # float32: of the scale
    for t in (10, T):
        want, acc, loss = _oracle_probe(c, {k: v.double() for k, v in ref[t - 1][3].items()})
        for k, v in want.items():
            if v is not None:
                diff = (torch.tensor(snaps[t][k], dtype=torch.float64) - v).abs().max().item()
                assert diff < tol(v), (t, k, diff)
        assert abs(hist[t]["test_acc"] - acc) <= (0 if f64 else 1e-6), (t, hist[t], acc)  # float32 stores 0.48 as 0.4799…
        assert abs(hist[t]["test_loss"] - loss) < (1e-8 if f64 else 1e-5), (t, hist[t], loss)
    # and the runs really moved: the attention left its start and V is far from V(0)
    moved = torch.tensor(snaps[T]["attention"]) - torch.tensor(snaps[0]["attention"])
    assert moved.abs().max() > 1e-3
    assert (torch.tensor(snaps[T]["V"]) - torch.tensor(snaps[0]["V"])).abs().max() > 0.01


@pytest.mark.parametrize("N,M,pos_denom,G", [(97, 1000, "M", 501), (100, 1000, "M", 6), (21, 64, "M", 33),
                                              (21, 64, "M+1", 32), (97, 4000, "M", 2001)])
def test_phi_equals_the_sum_over_every_entry(N, M, pos_denom, G, monkeypatch):
    """φ(s) = Σ_j x̂_j² / (s|x̂_j| + ε_A) over the M entries of x̂_N, to rounding, however it is evaluated:
    grouped by |x̂_j| (G groups), each point split between a direct sum and the series (at s on both sides
    of every split's ρ = 1/4, and across 20 decades), or all directly (a GPU's path), in several passes."""
    monkeypatch.setattr(adam, "POINTS", 700)
    c = validate(RunConfig(data=data_config(N=N), model=ModelConfig(M=M, normalize="whole", pos_denom=pos_denom),
                           optim=opt()))
    geo = model.geometry(c.model, N)
    hp = adam.hyper([c, c], geo, torch.float64, "cpu")
    hp.eps = torch.tensor([1e-8, 1e-3], dtype=torch.float64)
    assert len(hp.r) == G
    edges = torch.cat([e / (rho * hp.r_split) for e in hp.eps for rho in (0.2499, 0.25, 0.2501)])
    s = torch.cat([torch.zeros(1), edges, torch.logspace(-14, 6, 1000 - len(edges) - 1, dtype=torch.float64)])
    s = torch.stack([s, s.flip(0)])
    x = model.positions(c.model, N)[-1].abs() / geo.nu_q
    want = (x * x / (s[..., None] * x + hp.eps[:, None, None])).sum(-1)
    direct = dataclasses.replace(hp, splits=hp.splits[:0])
    for got in (adam.phi(s, hp), adam.phi(s, direct)):
        assert ((got - want).abs() / want).max() < 1e-13
    assert (adam.phi(torch.full((2, 3), math.inf, dtype=torch.float64), hp) == 0).all()  # no 0·∞


def test_a_batch_of_adam_runs_equals_each_run_alone(tmp_path):
    runs = [dict(seed=0, init=ZeroInit(), optim=opt(lr=0.01)),
            dict(seed=1, init=GaussianInit("gaussian", 0.05), optim=opt(lr=0.003, beta1=0.8, beta2=0.99, adam_eps=1e-6)),
            dict(seed=2, init=GaussianInit("gaussian", 0.02), optim=opt(lr=0.02, beta1=0.0, reduction="sum"))]
    cs = [cfg(model=ModelConfig(M=64, normalize="whole"), **r) for r in runs]  # one shape: normalize fixed
    assert len({config.shape_key(c) for c in cs}) == 1
    together = run.run_batch(cs, [tmp_path / f"b{i}" for i in range(3)])
    alone = [run.run_batch([c], [tmp_path / f"a{i}"])[0] for i, c in enumerate(cs)]
    for i, (x, y) in enumerate(zip(together, alone)):
        for k in ("test_acc", "test_loss", "test_kl", "parent_attention", "train_loss"):
            assert abs(x[k] - y[k]) < 1e-12, (i, k, x[k], y[k])
        hb, ha = _lines(tmp_path / f"b{i}" / "history.jsonl"), _lines(tmp_path / f"a{i}" / "history.jsonl")
        assert max(abs(r["test_loss"] - q["test_loss"]) for r, q in zip(hb, ha)) < 1e-12
    assert len({x["test_loss"] for x in together}) == 3  # three different runs, not one run thrice


class _Killed(Exception):
    pass


def test_a_checkpointed_adam_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    """Killed right after its step-10 checkpoint, the batch resumes from it (moments included) and ends
    exactly as the uninterrupted batch; the same checkpoint with its moments zeroed does not."""
    cs = [cfg(init=GaussianInit("gaussian", 0.05), checkpoint_every=10, seed=s, eval_every=2) for s in (0, 1)]
    whole = training.train(cs, [tmp_path / "w0", tmp_path / "w1"], progress=False)
    dirs = [tmp_path / "k0", tmp_path / "k1"]
    save = results.save_checkpoint

    def save_then_die(run_dir, blob):
        save(run_dir, blob)
        if run_dir == dirs[-1]:
            raise _Killed

    monkeypatch.setattr(results, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        training.train(cs, dirs, progress=False)
    monkeypatch.setattr(results, "save_checkpoint", save)
    blobs = [results.load_checkpoint(c.to_dict(), d) for c, d in zip(cs, dirs)]
    assert [b["state"]["step"] for b in blobs] == [10, 10]
    m_u = blobs[0]["state"]["opt"]["m_u"]
    assert m_u.shape == (5 + 64,) and m_u.abs().max() > 0
    resumed = training.train(cs, dirs, progress=False, resumed=blobs)
    for x, y in zip(resumed, whole):
        assert x.history == y.history and x.snapshots == y.snapshots and (x.status, x.steps) == (y.status, y.steps)
    for b in blobs:
        b["state"]["opt"] = {k: torch.zeros_like(v) for k, v in b["state"]["opt"].items()}
    forgetful = training.train(cs, [tmp_path / "f0", tmp_path / "f1"], progress=False, resumed=blobs)
    assert forgetful[0].history[-1]["test_loss"] != whole[0].history[-1]["test_loss"]


def test_an_adam_run_that_blows_up_diverges_alone(tmp_path):
    """An absurd lr overflows a run within a few steps (the dense oracle's too): it is `diverged` at that
    step, as under GD, its history stops there, and its neighbour in the batch is untouched."""
    cs = [cfg(model=ModelConfig(M=64, normalize="none"), optim=opt(lr=lr)) for lr in (0.003, 1e307)]
    sane, wild = run.run_batch(cs, [tmp_path / "a", tmp_path / "b"])
    alone = run.run_batch([cs[0]], [tmp_path / "c"])[0]
    assert sane["status"] == "done" and abs(sane["test_loss"] - alone["test_loss"]) < 1e-12
    assert wild["status"] == "diverged" and 0 < wild["steps"] < 5, wild
    assert [row["step"] for row in _lines(tmp_path / "b" / "history.jsonl")] == list(range(wild["steps"] + 1))


@pytest.mark.parametrize("override,message", [
    ("optim.beta1=1", "invalid config: optim.beta1=1.0: must be in [0, 1)"),
    ("optim.adam_eps=0", "invalid config: optim.adam_eps=0.0: must be > 0"),
])
def test_bad_adam_values_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError) as err:
        checked("optim=adam", override)
    assert str(err.value) == message
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=r"^" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)") + "$"):
        from_dict({"optim": {"name": "adam", key.split(".")[1]: float(value)}})
