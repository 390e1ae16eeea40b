"""Gaussian init: the compact draw (init.draw=compact, the default) against the literal dense one."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rw_sweeps.core import model, oracle, training
from rw_sweeps.core.config import ConfigError, data_config, validate
from rw_sweeps.core.models import FfnModelConfig, ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit

from .test_engine import cfg, trajectory


def _state(c, dtype=torch.float64):
    geo = model.geometry(c.model, c.data.N)
    return training.initial_state([c], geo, dtype), geo


def test_compact_draw_has_the_dense_draws_law():
    # over 400 seeds: a_k ~ N(0, σ²κ), c_j ~ N(0, σ²κ‖p‖²) i.i.d. Fixed seeds, so the test is deterministic;
    # the bounds are ~5 standard errors wide and fail for a variance off by 20 % or a mean off by 0.25 sd.
    for mo in (ModelConfig(M=64, normalize="none"), ModelConfig(M=64, normalize=True), ModelConfig(M=64, pos_denom="M+1", pos_scale=0.5, normalize="none"),
               ModelConfig(M=64, gram="numeric", normalize="none")):
        sigma = 0.03
        cs = [cfg(init=GaussianInit("gaussian", sigma), model=mo, seed=s) for s in range(400)]
        geo = model.geometry(mo, cs[0].data.N)
        st = training.initial_state(cs, geo, torch.float64)
        for x, var in ((st.a, sigma**2 * geo.kappa), (st.c, sigma**2 * geo.kappa * geo.pp)):
            z = x / math.sqrt(var)  # standardised: N(0, 1) entries if the law is right
            n = z.numel()
            assert abs(z.mean().item()) < 5 / math.sqrt(n), mo
            assert abs((z**2).mean().item() - 1) < 5 * math.sqrt(2 / n), mo
            assert abs((z**4).mean().item() - 3) < 0.6, mo  # Gaussian tails, not just the right variance
        # independence across positions and between a and c: sample correlations stay small
        corr = torch.corrcoef(torch.cat([st.a, st.c], 1).T)
        off = corr - torch.diag(torch.diag(corr))
        assert off.abs().max() < 0.25, mo
        # the dense draw of the same runs reduces to (a, c) with the same law (checked loosely: fewer seeds)
        dense = training.initial_state([dataclasses.replace(c, init=GaussianInit("gaussian", sigma, "dense"))
                                        for c in cs[:100]], geo, torch.float64)
        ratio = (dense.c**2).mean() / (sigma**2 * geo.kappa * geo.pp)
        assert 0.8 < ratio < 1.2, mo


def test_v_and_a_are_the_same_under_both_draws_and_the_state_differs():
    for mo in (ModelConfig(M=64, normalize="none"), FfnModelConfig(name="transformer_ffn", M=64, m=7, normalize="none")):
        c = cfg(init=GaussianInit("gaussian", 0.02), model=mo, seed=3)
        comp, _ = _state(c)
        dense, _ = _state(dataclasses.replace(c, init=GaussianInit("gaussian", 0.02, "dense")))
        assert comp.params.keys() == dense.params.keys()
        for k in comp.params:
            assert torch.equal(comp.params[k], dense.params[k]), k
        assert not torch.equal(comp.a, dense.a) and not torch.equal(comp.c, dense.c)


def test_compact_draw_does_not_depend_on_the_data_sizes():
    c = cfg(init=GaussianInit("gaussian", 0.02), seed=5)
    other = dataclasses.replace(c, data=data_config(K=5, N=21, p=0.2, n_train=7, n_test=300))
    x, _ = _state(c)
    y, _ = _state(other)
    assert torch.equal(x.a, y.a) and torch.equal(x.c, y.c) and torch.equal(x.params["V"], y.params["V"])


def test_dense_W_reduces_to_the_compact_state():
    for mo in (ModelConfig(M=64, normalize="none"), ModelConfig(M=64, normalize=True), ModelConfig(M=64, gram="numeric", normalize="none")):
        c = cfg(init=GaussianInit("gaussian", 0.05), model=mo, seed=2)
        st, geo = _state(c)
        W = model.dense_W(st.a[0], st.c[0], mo, c.data.K, c.data.N, geo)
        a, cc = model.compact(W, mo, c.data.K, c.data.N, geo)
        assert torch.allclose(a, st.a[0], rtol=0, atol=1e-15) and torch.allclose(cc, st.c[0], rtol=0, atol=1e-13)


ORACLE = {
    "gaussian": dict(init=GaussianInit("gaussian", 0.01)),
    "gaussian-normalized": dict(init=GaussianInit("gaussian", 0.05), model=ModelConfig(M=64, normalize=True)),
    "M+1-scaled": dict(model=ModelConfig(M=64, pos_denom="M+1", pos_scale=0.5), init=GaussianInit("gaussian", 0.02)),
    "ffn-gaussian": dict(model=FfnModelConfig(name="transformer_ffn", M=64, m=7), init=GaussianInit("gaussian", 0.1)),
    "float32": dict(precision="float32", init=GaussianInit("gaussian", 0.01)),
}


@pytest.mark.parametrize("draw", ["compact", "dense"])
@pytest.mark.parametrize("case", sorted(ORACLE))
def test_engine_matches_the_oracle_under_both_draws(case, draw):
    kw = dict(ORACLE[case])
    kw["init"] = dataclasses.replace(kw["init"], draw=draw)
    c = cfg(**kw)
    ref = oracle.train(c, 30)
    ours, _ = trajectory(c, 30)
    tol = 1e-8 if c.precision == "float64" else 2e-4
    dV = max((V - r[1]).abs().max().item() for (V, _), r in zip(ours, ref))
    dS = max((S - r[2]).abs().max().item() for (_, S), r in zip(ours, ref))
    assert dV < tol and dS < tol, (dV, dS)
    assert ours[-1][0].abs().max() > 10 * tol and (ours[-1][1] - ours[0][1]).abs().max() > 1e-4
    # and the oracle really started from this draw: its W(0) reduces to the engine's (a, c)
    geo = model.geometry(c.model, c.data.N)
    st = training.initial_state([c], geo, torch.float64)
    a, cc = model.compact(oracle.initial(c, torch.float64)["W"], c.model, c.data.K, c.data.N, geo)
    assert torch.allclose(a, st.a[0], atol=1e-14) and torch.allclose(cc, st.c[0], atol=1e-12)


def test_init_draw_is_validated():
    with pytest.raises(ConfigError) as e:
        validate(dataclasses.replace(cfg(), init=GaussianInit("gaussian", 0.01, "sparse")))
    msg = str(e.value)
    assert "init.draw" in msg and "sparse" in msg and "compact" in msg and "dense" in msg
    assert GaussianInit().draw == "compact" and cfg().init.name == "zero"  # the default draw; zero init has none


def test_the_init_stream_is_not_the_data_stream():
    """torch seeds MT19937 from 32 bits: seed + 2³² would replay the data's draws as the initial weights."""
    import torch

    from rw_sweeps.core import model
    for seed in (0, 1, 7, 2**31, 2**32 - 1):
        assert model.init_seed(seed) != seed and 0 <= model.init_seed(seed) < 2**32
        data = torch.rand(8, generator=torch.Generator().manual_seed(seed))
        init = torch.rand(8, generator=model.init_generator(seed))
        assert not torch.equal(data, init)
    assert len({model.init_seed(s) for s in range(10_000)}) == 10_000  # one init stream per seed


def test_only_the_dense_draw_is_charged_for_the_dense_W():
    """The memory check before a run starts counts the (K+M)² W only where it is drawn (init.draw=dense)."""
    import dataclasses

    from rw_sweeps.core.config import RunConfig
    from rw_sweeps.core.inits.gaussian import GaussianInit
    from rw_sweeps.core.resources import run_bytes

    base = RunConfig()
    big = dataclasses.replace(base, model=dataclasses.replace(base.model, M=30000))
    gauss = {draw: dataclasses.replace(big, init=GaussianInit(sigma=0.01, draw=draw))
             for draw in ("compact", "dense")}
    zero = run_bytes(big)[0]
    assert run_bytes(gauss["compact"])[0] == zero
    assert run_bytes(gauss["dense"]) [0] - zero >= (6 + 30000) ** 2 * 8 and run_bytes(gauss["dense"])[1] == "model.M"
