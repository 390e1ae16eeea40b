"""The engine against the paper: the literal autograd oracle, Lemma C.1, Theorem 4.1, §5 and §6."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rw_sweeps.core import data as data_mod
from rw_sweeps.core import engine, model, oracle, training
from rw_sweeps.sweeps import run
from rw_sweeps.core.config import RunConfig, data_config, validate
from rw_sweeps.core.models import FfnModelConfig, ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.inits.zero import ZeroInit
from rw_sweeps.core.optimisers.gd import Gd


def cfg(**kw) -> RunConfig:
    base = dict(data=data_config(K=5, N=21, p=0.7, n_train=100, n_test=50), model=ModelConfig(M=64),
                optim=Gd(lr=0.5, steps=50), wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    base.update(kw)
    return validate(RunConfig(**base))


def trajectory(c: RunConfig, steps: int, on: str = "train"):
    """(V, mean attention on `on`) after each step, from the engine."""
    dtype = getattr(torch, c.precision)
    geo = model.geometry(c.model, c.data.N)
    tr, te = data_mod.make(c.data, c.seed)
    B = training.stack_data([tr], dtype, "cpu")
    st = training.initial_state([c], geo, dtype)
    one = lambda x: torch.tensor([x], dtype=dtype)  # noqa: E731
    w = one(1 / c.data.n_train if c.optim.reduction == "mean" else 1.0)
    out = []
    for _ in range(steps):
        engine.train_step(st, B, one(c.optim.lr), one(c.optim.eps), w, geo)
        out.append((st.params["V"][0].clone(), engine.evaluate(st, B, one(c.optim.eps), geo).attention[0]))
    return out, st


ORACLE_CASES = {
    "zero": {},
    "zero-sum": dict(optim=Gd(lr=0.005, steps=50, reduction="sum")),
    "gaussian": dict(init=GaussianInit("gaussian", 0.01)),
    "gaussian-normalized": dict(init=GaussianInit("gaussian", 0.05), model=ModelConfig(M=64, normalize=True)),
    "zero-normalized": dict(model=ModelConfig(M=64, normalize=True), optim=Gd(lr=5.0, steps=50)),
    "M+1-scaled": dict(model=ModelConfig(M=64, pos_denom="M+1", pos_scale=0.5), init=GaussianInit("gaussian", 0.02)),
    "ffn-gaussian": dict(model=FfnModelConfig(name="transformer_ffn", M=64, m=7), init=GaussianInit("gaussian", 0.1)),
    "ffn-gaussian-normalized": dict(model=FfnModelConfig(name="transformer_ffn", M=64, m=7, normalize=True),
                                    init=GaussianInit("gaussian", 0.1), optim=Gd(lr=2.0, steps=50)),
    "float32": dict(precision="float32"),
}


@pytest.mark.parametrize("case", sorted(ORACLE_CASES))
def test_engine_matches_the_literal_oracle(case):
    c = cfg(**ORACLE_CASES[case])
    ref = oracle.train(c, 50)
    ours, _ = trajectory(c, 50)
    tol = 1e-8 if c.precision == "float64" else 2e-4
    dV = max((V - r[1]).abs().max().item() for (V, _), r in zip(ours, ref))
    dS = max((S - r[2]).abs().max().item() for (_, S), r in zip(ours, ref))
    assert dV < tol and dS < tol, (dV, dS)
    # and the run really moved: attention left uniform and V grew (a frozen model would also "match")
    assert ours[-1][0].abs().max() > 10 * tol and (ours[-1][1] - ours[0][1]).abs().max() > 1e-4


def test_the_ffn_from_zero_init_is_a_fixed_point(tmp_path):
    """F.1 from A = V = W = 0: f ≡ 0, and every gradient carries a factor A or ReLU'(0) = 0, so nothing ever
    moves: the loss stays −log ε and the attention uniform, in the engine as in the oracle."""
    c = cfg(model=FfnModelConfig(name="transformer_ffn", M=64, m=7), optim=Gd(lr=5.0, steps=20))
    ref = oracle.train(c, 20)
    assert all(float(r[3]["A"].abs().max()) == 0 and float(r[3]["V"].abs().max()) == 0 for r in ref)
    ours, st = trajectory(c, 20)
    assert float(st.params["A"].abs().max()) == 0 and float(st.params["V"].abs().max()) == 0
    assert float(st.a.abs().max()) == 0 and float(st.c.abs().max()) == 0
    s = run.run_batch([c], [tmp_path])[0]
    assert s["train_loss"] == pytest.approx(-math.log(c.optim.eps), abs=1e-12) and s["attention_spread"] == 0.0


def test_engine_matches_the_oracle_on_the_symmetric_point_until_the_oracle_breaks():
    # p = 1 from zero init: the dense oracle's rounding breaks Thm 4.1's fixed point around step 12 in
    # float64; up to step 8 both sit on it.
    c = cfg(data=data_config(K=5, N=21, p=1.0, n_train=100, n_test=50), optim=Gd(lr=1.0, steps=8))
    ref = oracle.train(c, 8)
    ours, _ = trajectory(c, 8)
    assert max((V - r[1]).abs().max().item() for (V, _), r in zip(ours, ref)) < 1e-8


def test_lemma_C1_first_step_from_zero_init():
    # Finite-sample Lemma C.1: S = 1_N/N at θ = 0 and ℓ'(0) = −1/ε, so
    # V(1) = η/(ε N n) Σ_b e_{y_b} (Σ_{i<N} x_bi)ᵀ exactly, and W(1) = 0.
    c = cfg(data=data_config(K=6, N=25, p=0.6, n_train=300, n_test=10), optim=Gd(lr=0.7, eps=0.2, steps=1))
    hist, st = trajectory(c, 1)
    V1 = hist[0][0]
    tr, _ = data_mod.make(c.data, c.seed)
    K, N, n = 6, 25, 300
    counts = torch.nn.functional.one_hot(tr.tokens, K).sum(1).double()  # Σ_i x_bi
    expected = 0.7 / (0.2 * N * n) * torch.nn.functional.one_hot(tr.y, K).double().T @ counts
    assert torch.allclose(V1, expected, rtol=0, atol=1e-15)
    assert st.a.abs().max() == 0 and st.c.abs().max() == 0  # ∇W ∝ V(0) = 0


def test_lemma_C1_population_form():
    # With many sequences V(1) → η/(ε N K) Σ_{i=1}^{N−1} (Πᵀ)^{N−i} (Lemma C.1 as stated in the paper).
    K, N, p, n, lr, eps = 5, 9, 0.7, 40000, 1.0, 0.1
    c = cfg(data=data_config(K=K, N=N, p=p, n_train=n, n_test=10), model=ModelConfig(M=16), optim=Gd(lr=lr, eps=eps, steps=1))
    V1 = trajectory(c, 1)[0][0][0]
    PiT = data_mod.Pi(K, p).T
    pop = lr / (eps * N * K) * sum(torch.linalg.matrix_power(PiT, N - i) for i in range(1, N))
    assert (V1 - pop).abs().max() < 0.05 * pop.abs().max()
    # Lemmas C.2/C.3: circulant, largest entry where Πᵀ has p
    assert torch.argmax(pop[:, 0]) == 1 and torch.argmax(V1[:, 0]) == 1


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_theorem_4_1_symmetric_point_is_exact(precision, tmp_path):
    # p = 1, N = rK + 1, zero init: attention stays exactly uniform over the N − 1 real tokens, every
    # column of V stays equal, and accuracy sits at chance for all 50 steps.
    c = cfg(data=data_config(K=6, N=97, p=1.0, n_train=300, n_test=300), model=ModelConfig(M=200),
            optim=Gd(lr=1.0, steps=50), precision=precision)
    hist, st = trajectory(c, 50)
    for V, S in hist:
        assert (S[:-1] == S[0]).all()  # bit-identical, not approximately
        assert (V == V[:, :1]).all()
    assert (st.c[0, :-1] == st.c[0, 0]).all() and (st.a[0] == st.a[0, 0]).all()
    s = run.run_batch([c], [tmp_path])[0]
    assert s["attention_spread"] == 0.0 and s["symmetry_break_step"] is None
    assert s["test_acc"] < 0.3  # ≈ 1/K: every score ties, so the prediction is one fixed label


def test_section_5_p_half_learns_the_optimum(tmp_path):
    c = validate(RunConfig(wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))  # the paper's §5 defaults
    s = run.run_batch([c], [tmp_path])[0]
    assert abs(s["test_acc"] - 0.5) < 0.05 and s["opt_acc"] == 0.5
    assert s["parent_attention"] > 0.99
    assert s["v_pi_cosine"] > 0.95
    assert s["symmetry_break_step"] is not None and s["symmetry_break_step"] <= 3


def test_section_6_qa_tasks(tmp_path):
    base = dict(init=GaussianInit("gaussian", 0.01), model=ModelConfig(M=1000, normalize=True),
                optim=Gd(lr=0.1, steps=100), wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    t1 = validate(RunConfig(data=data_config(name="qa_majority", K=19, N=17), **base))
    t2 = validate(RunConfig(data=data_config(name="qa_preference", K=19, N=19), **base))
    s1, s2 = run.run_batch([t1], [tmp_path / "1"])[0], run.run_batch([t2], [tmp_path / "2"])[0]
    assert s1["test_acc"] >= 0.95 and s1["opt_acc"] == 1.0
    assert s2["test_acc"] <= 0.6


def test_a_batch_equals_its_runs_alone(tmp_path):
    cs = [cfg(data=data_config(K=5, N=21, p=p, n_train=100, n_test=50), seed=s, init=i,
              model=ModelConfig(M=1000, normalize="none"))  # one shape: normalize=auto would differ by init
          for p, s, i in [(0.5, 0, ZeroInit()), (0.9, 1, GaussianInit("gaussian", 0.02)), (0.2, 2, ZeroInit())]]
    together = run.run_batch(cs, [tmp_path / f"b{i}" for i in range(3)])
    alone = [run.run_batch([c], [tmp_path / f"a{i}"])[0] for i, c in enumerate(cs)]
    for x, y in zip(together, alone):
        for k in ("test_acc", "test_kl", "parent_attention", "v_pi_cosine", "train_loss"):
            assert abs(x[k] - y[k]) < 1e-12, k


def test_same_seed_same_summary(tmp_path):
    c = cfg(init=GaussianInit("gaussian", 0.01))
    a, b = run.run_batch([c], [tmp_path / "a"])[0], run.run_batch([c], [tmp_path / "b"])[0]
    drop = lambda s: {k: v for k, v in s.items() if k not in ("wall_s", "run_id")}  # noqa: E731
    assert drop(a) == drop(b)
    assert (tmp_path / "a" / "history.jsonl").read_text() == (tmp_path / "b" / "history.jsonl").read_text()
    other = run.run_batch([dataclasses.replace(c, seed=1)], [tmp_path / "c"])[0]
    assert other["test_kl"] != a["test_kl"]


def test_snapshots_keep_the_part_of_W_the_model_sees(tmp_path):
    # a = (W x̂_N)[:K] and c_j = p_jᵀ(W x̂_N)[K:]: the dense oracle's W reproduces them exactly
    import json

    c = cfg(init=GaussianInit("gaussian", 0.01), model=ModelConfig(M=1000, normalize="none"), snapshot_steps=[0, 5])
    run.run_batch([c], [tmp_path])
    snaps = {s["step"]: s for s in map(json.loads, (tmp_path / "snapshots.jsonl").read_text().splitlines())}
    W = oracle.train(c, 5)[-1][3]["W"]
    P = model.positions(c.model, c.data.N)
    u = W[:, c.data.K:] @ P[-1]
    assert torch.allclose(torch.tensor(snaps[5]["a"], dtype=torch.float64), u[:c.data.K], atol=1e-10)
    assert torch.allclose(torch.tensor(snaps[5]["c"], dtype=torch.float64), P @ u[c.data.K:], atol=1e-8)
    assert sorted(snaps) == [0, 5, 50]


@pytest.mark.parametrize("init", [[], ["init.name=gaussian", "init.sigma=0.1"]])
def test_the_oracle_cli_is_the_one_run_baseline_for_every_init(init, tmp_path, capsys):
    """`python -m rw_sweeps.core.oracle key=value …` (the benchmarks' one-run-per-process baseline) trains the
    run the engine trains: the same test accuracy, from zero init and from the dense Gaussian draw it asks for
    (it had set init.draw for every init, and zero init has no such key: every baseline run failed)."""
    import json

    from rw_sweeps.core import oracle, trainer
    from rw_sweeps.core.config import from_dict

    argv = ["data.K=3", "data.N=7", "model.M=12", "data.n_train=16", "data.n_test=16", "optim.steps=3",
            "precision=float64", *init]
    oracle.main(argv)
    said = json.loads(capsys.readouterr().out.splitlines()[0])
    dotted = dict(a.split("=") for a in argv)
    d: dict = {}
    for k, v in dotted.items():
        node = d
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v if not v.replace(".", "").isdigit() else (float(v) if "." in v else int(v))
    if init:
        d["init"]["draw"] = "dense"
    cfg = from_dict(d)
    rec = trainer.of(cfg).train([cfg], [tmp_path / "run"], progress=False)[0]
    assert said["test_acc"] == pytest.approx(rec.history[-1]["test_acc"], abs=1e-12)


def test_scale_free_metrics_of_a_run_whose_parameters_overflow_are_null_not_zero():
    """cos(V, Πᵀ) divides by ‖V‖ and pred_dist by ‖f‖: where the norm overflows (a step of lr = 1e200), the
    quotient reads 0 and 1 whatever the direction. Such a run's values are NaN (null); the others are exact."""
    V = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[1e200, 2e200], [3e200, 4e200]]], dtype=torch.float64)
    PiT = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64).expand(2, 2, 2)
    cos = engine.v_pi_cosine(V, PiT)
    assert cos[0].item() == pytest.approx(10 * 0.5 / (30 ** 0.5 * 1.0), rel=1e-15) and torch.isnan(cos[1])
    assert engine.overflowed({"V": V}).tolist() == [False, True]
    assert engine.overflowed({"V": V[:1], "A": torch.full((1, 3, 2), 1e300, dtype=torch.float64)}).tolist() == [True]
