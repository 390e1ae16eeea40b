"""The fused C kernel (rw_sweeps/core/fused.py) against the PyTorch engine it replaces, and its fallback.

Tolerances: float64 to 1e-12 of each tensor's scale (max |x|, at least 1): without unit-normalisation
c_j moves by lr·κ·‖p‖² = 2.5e5 times its gradient and reaches |c| ~ 1e3, where one rounding of D_j is
already ~1e-12 absolute. float32: within 1e-4 of the scale of torch's float32 trajectory, and as accurate
as it — at most 2× as far from the float64 trajectory — since after 50 such steps torch's own float32 is
~2e-5 of the scale away from float64. Thm 4.1's symmetric point is held exactly, in both precisions.
Small shapes (K=6, N=25 or 97, n≈200) keep the file fast; the first run compiles the kernel (~10–30 s,
then cached under ~/.cache/rw_sweeps).
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rw_sweeps.core import data as data_mod
from rw_sweeps.core import engine, fused, model
from rw_sweeps.core.config import RunConfig, data_config, option_config, validate
from rw_sweeps.core.models import FfnModelConfig

ROOT = Path(__file__).resolve().parents[1]
T = 50


def _cfg(seed, p=0.5, init="zero", sigma=0.0, lr=1.0, normalize="none", K=6, N=25, n=200, precision="float64",
         name="transformer", gram="exact"):
    c = RunConfig(seed=seed, precision=precision, data=data_config(K=K, N=N, p=p, n_train=n, n_test=n),
                  init=option_config("init", init, **({"sigma": sigma} if init == "gaussian" else {})),
                  model=option_config("model", name, normalize=normalize, gram=gram,
                                      **({"m": 7} if name == "transformer_ffn" else {})))
    c.optim.lr = lr
    return c


def _batch(cfgs):
    """Train/test Batches, initial State, lr, eps, w and Geometry of runs of one shape (as training.train does)."""
    c0 = cfgs[0]
    dtype, K, N = getattr(torch, c0.precision), c0.data.K, c0.data.N
    geo = model.geometry(c0.model, N)
    splits = [data_mod.make(c.data, c.seed) for c in cfgs]

    def stack(ss):
        return engine.Batch(torch.stack([s.tokens for s in ss]), torch.stack([s.y for s in ss]),
                            torch.stack([s.P_true for s in ss]).to(dtype))

    params, ac = [], []
    for c in cfgs:
        if c.init.name == "zero":
            p = {"V": torch.zeros(K, K, dtype=dtype)}
            if c.model.name == "transformer_ffn":
                p = {"A": torch.zeros(K, c.model.m, dtype=dtype), "V": torch.zeros(c.model.m, K, dtype=dtype)}
            params.append(p)
            ac.append((torch.zeros(K, dtype=dtype), torch.zeros(N, dtype=dtype)))
        else:
            p = model.init_dense(c.model, K, c.init.sigma, model.init_generator(c.seed), dtype)
            W = p.pop("W")
            params.append(p)
            ac.append(model.compact(W, c.model, K, N, geo))
    state = engine.init_state(params, ac)
    lr = torch.tensor([c.optim.lr for c in cfgs], dtype=dtype)
    eps = torch.tensor([c.optim.eps for c in cfgs], dtype=dtype)
    w = torch.tensor([1.0 / c.data.n_train for c in cfgs], dtype=dtype)
    return stack([s[0] for s in splits]), stack([s[1] for s in splits]), state, lr, eps, w, geo


def _clone(s: engine.State) -> engine.State:
    return engine.State({k: v.clone() for k, v in s.params.items()}, s.a.clone(), s.c.clone(), s.step)


def _close(name, ref, got, rtol):
    """|got − ref| ≤ rtol·max(1, max |ref|), with NaNs in the same places."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, name
    nan = torch.isnan(ref)
    assert torch.equal(nan, torch.isnan(got)), f"{name}: NaN pattern differs"
    r, g = ref[~nan], got[~nan]
    if r.numel() == 0:
        return
    scale = max(1.0, r.abs().max().item())
    err = (r - g).abs().max().item()
    assert err <= rtol * scale, f"{name}: max |Δ| = {err:.3e} > {rtol:.0e} × {scale:.3g}"


def _same_pred(name, state, data, eps, geo):
    """At one state, each sample's argmax is torch's wherever the kernel says it is sure (`Probe.pred_unsure`)."""
    got, ref = fused.evaluate(state, data, eps, geo), engine.evaluate(state, data, eps, geo)
    sure = ~got.pred_unsure
    assert torch.equal(got.pred.long()[sure], ref.pred[sure]), f"{name}: pred"


PROBE_FIELDS = ("loss", "acc", "kl", "pred_dist", "attention", "spread", "h_example", "h_var")


F32 = 1e-4  # float32 tolerance against torch's float32 (see the module docstring)


def _as_accurate(name, exact, ref, got, floor):
    """float32: the kernel's distance to the float64 result is at most twice torch's float32 distance."""
    e_ref = (ref.double() - exact).abs().nan_to_num(0).max().item()
    e_got = (got.double() - exact).abs().nan_to_num(0).max().item()
    assert e_got <= 2 * e_ref + floor, f"{name}: kernel f32 {e_got:.2e} from f64, torch f32 {e_ref:.2e}"


def _compare(cfgs, rtol, steps=T):
    """Train the same runs with engine.train_step and with the kernel; compare trajectory, state, probes.
    In float32 also against the float64 trajectory of the same runs (accuracy, not just agreement)."""
    train, test, state, lr, eps, w, geo = _batch(cfgs)
    ref, got = _clone(state), _clone(state)
    for name in PROBE_FIELDS:  # evaluation at the initial point
        _close(f"eval@0 {name}", getattr(engine.evaluate(ref, test, eps, geo), name),
               getattr(fused.evaluate(got, test, eps, geo), name), rtol)
    _same_pred("eval@0", got, test, eps, geo)
    loss_ref = torch.stack([engine.train_step(ref, train, lr, eps, w, geo) for _ in range(steps)], 1)
    loss_got = fused.train_step(got, train, lr, eps, w, geo, steps=steps)
    _close("train loss", loss_ref, loss_got, rtol)
    _close("V", ref.params["V"], got.params["V"], rtol)
    _close("a", ref.a, got.a, rtol)
    _close("c", ref.c, got.c, rtol)
    assert got.step == ref.step == steps
    for data_set, tag in ((test, "test"), (train, "train")):
        p_ref, p_got = engine.evaluate(ref, data_set, eps, geo), fused.evaluate(got, data_set, eps, geo)
        for name in PROBE_FIELDS:
            _close(f"eval {tag} {name}", getattr(p_ref, name), getattr(p_got, name), rtol)
        _same_pred(f"eval {tag}", got, data_set, eps, geo)
        # a history row's evaluation (full=False): every field it sets, against torch too
        p_row = fused.evaluate(got, data_set, eps, geo, full=False)
        for name in ("loss", "acc", "kl", "pred_dist", "spread"):
            _close(f"eval {tag} {name} (full=False)", getattr(p_ref, name), getattr(p_row, name), rtol)
        _close(f"eval {tag} parent, query (full=False)", p_ref.attention[:, -2:], p_row.attention[:, -2:], rtol)
    if state.a.dtype == torch.float32:  # the same f32 initial point, trained in float64
        ex = engine.State({"V": state.params["V"].double()}, state.a.double(), state.c.double())
        tr64 = engine.Batch(train.tokens, train.y, train.P_true.double())
        l64 = torch.stack([engine.train_step(ex, tr64, lr.double(), eps.double(), w.double(), geo)
                           for _ in range(steps)], 1)
        scale = lambda x: 1e-6 * max(1.0, x.abs().nan_to_num(0).max().item())  # noqa: E731
        for name, e, r, g in (("loss", l64, loss_ref, loss_got), ("V", ex.params["V"], ref.params["V"], got.params["V"]),
                              ("a", ex.a, ref.a, got.a), ("c", ex.c, ref.c, got.c)):
            _as_accurate(name, e, r, g, scale(e))
    return ref, got


@pytest.fixture(scope="module")
def kernel():
    """The compiled kernel (native ISA), or skip: the fallback tests below run everywhere."""
    os.environ.pop("RW_SWEEPS_BACKEND", None)
    if not fused.available(K=6):
        pytest.skip(f"no compiled kernel here: {fused.last_error()}")
    return fused.info()


# every (p, init, lr) of the brief: p ∈ {0.3, 0.5, 0.7} × {zero, N(0, 0.01²), N(0, 0.05²)} × lr ∈ {1, 0.3}
GRID = [dict(p=p, init=i, sigma=s, lr=lr) for p, (i, s), lr in
        itertools.product((0.3, 0.5, 0.7), (("zero", 0.0), ("gaussian", 0.01), ("gaussian", 0.05)), (1.0, 0.3))]


@pytest.mark.parametrize("normalize", ["none", "whole", "positional"])
@pytest.mark.parametrize("precision,rtol", [("float64", 1e-12), ("float32", F32)])
def test_kernel_matches_torch(kernel, normalize, precision, rtol):
    """All 18 runs of the grid in one batch (each its own seed), 50 steps: state, losses and every metric,
    under each reading of model.normalize (positional: the logits' token and positional parts have their
    own scales, ν_tok = 1 and ν_pos = ‖p‖)."""
    cfgs = [_cfg(seed, normalize=normalize, precision=precision, **kw) for seed, kw in enumerate(GRID)]
    geo = model.geometry(cfgs[0].model, cfgs[0].data.N)
    assert (geo.nu_pos != geo.nu_tok) == (normalize == "positional")
    assert fused.available(cfgs[0])
    ref, _ = _compare(cfgs, rtol)
    assert (ref.c - ref.c[:, :1]).abs().max() > 1e-3  # the positions really moved apart


@pytest.mark.parametrize("precision,rtol", [("float64", 1e-12), ("float32", F32)])
def test_kernel_matches_torch_ragged_shapes(kernel, precision, rtol):
    """§5's N = 97 (several position tiles), n not a multiple of the SIMD width, one run, and K = 19 (the QA
    vocabulary, beyond the AVX-512 path's K ≤ 8: the plain C path of the same library), there also with the
    positional normalisation."""
    _compare([_cfg(s, p=0.5, N=97, n=203, precision=precision) for s in range(3)], rtol)
    _compare([_cfg(7, p=0.7, init="gaussian", sigma=0.01, N=97, n=37, precision=precision)], rtol)
    _compare([_cfg(s, p=0.6, K=19, N=30, n=61, precision=precision) for s in range(2)], rtol)
    _compare([_cfg(s, p=0.6, K=19, N=30, n=61, init="gaussian", sigma=0.05, normalize="positional",
                   precision=precision) for s in range(2)], rtol)


@pytest.fixture(scope="module")
def generic_cache(tmp_path_factory):
    """A cache of this module's own for the portable build: compiled once (~8 s of CPU), by its first test."""
    return tmp_path_factory.mktemp("generic-build")


def test_portable_build_matches_torch(kernel, monkeypatch, generic_cache):
    """The build for CPUs without AVX-512 (plain C) gives the same results."""
    monkeypatch.setenv("RW_SWEEPS_FUSED_ISA", "generic")
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(generic_cache))
    fused.reset()
    try:
        assert fused.available(K=6) and not fused.info()["avx512"]
        cfgs = [_cfg(seed, **kw) for seed, kw in enumerate(GRID[::3])]
        _compare(cfgs, 1e-12)
        _compare([_cfg(seed, normalize="positional", **kw) for seed, kw in enumerate(GRID[1::3])], 1e-12)
        _compare([_cfg(s, p=0.5, N=97, n=203, precision="float32") for s in range(2)], F32)
        _symmetric_point("float64", N=25)
    finally:
        monkeypatch.undo()
        fused.reset()


def _symmetric_point(precision, N):
    """Thm 4.1: p = 1, zero init, N = rK + 1 → uniform attention for ever, bit for bit."""
    cfgs = [_cfg(s, p=1.0, N=N, precision=precision) for s in range(3)]
    train, test, state, lr, eps, w, geo = _batch(cfgs)
    L = N - 1
    for chunk in range(5):
        fused.train_step(state, train, lr, eps, w, geo, steps=T // 5)
        probe = fused.evaluate(state, test, eps, geo)
        assert (probe.spread == 0.0).all(), f"spread {probe.spread.tolist()} after {state.step} steps"
        assert torch.equal(state.c[:, :L], state.c[:, :1].expand(-1, L)), "c_j not identical"
        assert torch.equal(probe.attention[:, :L], probe.attention[:, :1].expand(-1, L))
        assert torch.equal(state.a, state.a[:, :1].expand_as(state.a))
    assert state.step == T and state.c[:, 0].abs().min() > 0  # it did move, symmetrically


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("N", [25, 97])
def test_symmetric_point_exact(kernel, precision, N):
    _symmetric_point(precision, N)


def test_one_step_api_and_divergence(kernel, monkeypatch):
    """steps=None behaves as engine.train_step (loss (R,)); train_steps reports the first non-finite step
    exactly as training.train's check would (loss before the step, parameters after it)."""
    cfgs = [_cfg(s, p=0.5) for s in range(3)]
    train, test, state, lr, eps, w, geo = _batch(cfgs)
    a, b = _clone(state), _clone(state)
    l1 = fused.train_step(a, train, lr, eps, w, geo)
    l2 = fused.train_step(b, train, lr, eps, w, geo, steps=1)
    assert l1.shape == (3,) and l2.shape == (3, 1) and torch.equal(l1, l2[:, 0]) and a.step == b.step == 1
    assert torch.equal(a.params["V"], b.params["V"]) and torch.equal(a.c, b.c)
    # run 1 diverges: a negative ε makes F + ε cross 0
    eps2 = eps.clone()
    eps2[1] = -0.5
    k_state, t_state = _clone(state), _clone(state)
    loss_k, bad_k = fused.train_steps(k_state, train, lr, eps2, w, geo, 10)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    loss_t, bad_t = fused.train_steps(t_state, train, lr, eps2, w, geo, 10)
    assert bad_t.tolist()[0] == -1 and bad_t.tolist()[2] == -1 and bad_t[1] >= 0
    assert torch.equal(bad_k, bad_t)
    _close("loss", loss_t[[0, 2]], loss_k[[0, 2]], 1e-12)


def test_unsupported_models_fall_back(kernel):
    """FFN (F.1) and gram=numeric are not in the kernel: available() is False and the calls are the
    torch path, bit for bit."""
    for kw in (dict(name="transformer_ffn"), dict(gram="numeric")):
        cfgs = [_cfg(s, p=0.5, init="gaussian", sigma=0.01, **kw) for s in range(2)]
        assert not fused.available(cfgs[0])
        train, test, state, lr, eps, w, geo = _batch(cfgs)
        a, b = _clone(state), _clone(state)
        for _ in range(3):
            assert torch.equal(engine.train_step(a, train, lr, eps, w, geo), fused.train_step(b, train, lr, eps, w, geo))
        for k in a.params:
            assert torch.equal(a.params[k], b.params[k])
        pa, pb = engine.evaluate(a, test, eps, geo), fused.evaluate(b, test, eps, geo)
        assert all(torch.equal(getattr(pa, f), getattr(pb, f)) for f in PROBE_FIELDS)
    assert not fused.available(K=128) and not fused.available(cfg=validate(RunConfig(model=FfnModelConfig())))
    assert fused.available(K=127)


def test_backend_env(kernel, monkeypatch):
    cfgs = [_cfg(s, p=0.5) for s in range(2)]
    train, test, state, lr, eps, w, geo = _batch(cfgs)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    assert not fused.available(cfgs[0])
    a, b = _clone(state), _clone(state)
    assert torch.equal(engine.train_step(a, train, lr, eps, w, geo), fused.train_step(b, train, lr, eps, w, geo))
    assert torch.equal(a.c, b.c)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    assert fused.available(cfgs[0])
    ffn = [_cfg(s, name="transformer_ffn") for s in range(2)]
    tr2, _, st2, lr2, eps2, w2, geo2 = _batch(ffn)
    with pytest.raises(RuntimeError, match="fused kernel cannot run"):
        fused.train_step(st2, tr2, lr2, eps2, w2, geo2)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "cuda")
    with pytest.raises(ValueError):
        fused.available(cfgs[0])


def test_fallback_without_compiler(monkeypatch, tmp_path):
    """No compiler (or any failed build): available() is False and the engine's calls still run, on torch."""
    monkeypatch.setattr(fused, "CC", str(tmp_path / "no-such-gcc"))
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RW_SWEEPS_BACKEND", raising=False)
    fused.reset()
    try:
        assert fused.library() is None and not fused.available(K=6)
        assert "no-such-gcc" in fused.last_error()
        cfgs = [_cfg(s, p=0.5) for s in range(2)]
        train, test, state, lr, eps, w, geo = _batch(cfgs)
        a, b = _clone(state), _clone(state)
        la = torch.stack([engine.train_step(a, train, lr, eps, w, geo) for _ in range(3)], 1)
        lb = fused.train_step(b, train, lr, eps, w, geo, steps=3)
        assert torch.equal(la, lb) and torch.equal(a.params["V"], b.params["V"]) and b.step == 3
        pa, pb = engine.evaluate(a, test, eps, geo), fused.evaluate(b, test, eps, geo)
        assert all(torch.equal(getattr(pa, f), getattr(pb, f)) for f in PROBE_FIELDS)
        monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
        with pytest.raises(RuntimeError, match="no compiled kernel"):
            fused.train_step(b, train, lr, eps, w, geo)
    finally:
        monkeypatch.undo()
        fused.reset()


def _openmp_refusing_cc(tmp_path, how: str):
    """A compiler whose OpenMP link fails (`how`: `status`, as a linker missing libgomp says it, or `signal`, killed
    mid-link); it logs every call."""
    log, cc = tmp_path / "cc.log", tmp_path / "cc"
    fail = 'echo "ld: cannot find -lgomp" >&2; exit 1' if how == "status" else "kill -TERM $$"
    cc.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\ncase \"$*\" in *-shared*-fopenmp*) {fail};; esac\n"
                  f"exec gcc \"$@\"\n")
    cc.chmod(0o755)
    return cc, log


@pytest.mark.parametrize("how", ["status", "signal"])
def test_a_refused_build_is_remembered_and_an_interrupted_one_is_not(monkeypatch, tmp_path, how):
    """A compiler that refuses the OpenMP build (clang without libomp, say): the first process tries it, falls back
    to the pthreads build and leaves the refusal in the cache, trusted whatever the umask; a later process compiles
    nothing (it used to recompile both attempts in every process). A build killed by a signal (scancel, a hangup)
    says nothing about the next: it is tried again."""
    from rw_sweeps.core.gpt import layernorm

    cc, log = _openmp_refusing_cc(tmp_path, how)
    monkeypatch.setattr(fused, "CC", str(cc))
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RW_SWEEPS_FUSED_ISA", "generic")
    builds = lambda: [c for c in log.read_text().splitlines() if " -c " in f" {c} "]  # noqa: E731
    old = os.umask(0o002)  # a group-writable default, as on many desktops
    try:
        layernorm.KERNEL.reset()
        assert layernorm.KERNEL.library() is not None
        first = builds()
        assert len(first) == 4 and sum("-fopenmp" in c for c in first) == 2, first  # 2 dtypes × (OpenMP, pthreads)
        markers = list((tmp_path / "cache").glob("layernorm-*.failed"))
        layernorm.KERNEL.reset()  # as a new process
        assert layernorm.KERNEL.library() is not None
        if how == "status":
            assert len(markers) == 1 and "cannot find -lgomp" in markers[0].read_text()
            assert builds() == first and "failed before, not tried again" in layernorm.KERNEL.last_error()
        else:
            assert markers == [] and len(builds()) == 6  # the OpenMP build tried again, the pthreads one cached
    finally:
        os.umask(old)
        monkeypatch.undo()
        layernorm.KERNEL.reset()


@pytest.mark.e2e
def test_concurrent_first_use(kernel, tmp_path):
    """Processes compiling at once into one empty cache (SLURM array jobs) all load a complete library,
    and leave one file behind."""
    code = ("import sys; from rw_sweeps.core import fused; i = fused.info(); "
            "sys.exit(0 if i['available'] else 1)")
    env = {**os.environ, "RW_SWEEPS_CACHE": str(tmp_path), "RW_SWEEPS_FUSED_ISA": "generic",
           "PYTHONPATH": str(ROOT)}
    env.pop("RW_SWEEPS_BACKEND", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT) for _ in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    left = sorted(q.name for q in tmp_path.iterdir())
    assert len(left) == 1 and left[0].startswith("fused-") and left[0].endswith(".so"), left


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("state", ["uniform alpha", "few candidates", "every position", "non-finite"])
def test_a_history_evaluation_equals_the_full_one(state, precision):
    """evaluate(full=False), what a history row needs, takes a shortcut for the attention spread (no pass at
    all for a uniform α, the positions that can win, or inside the histogram pass) and skips the per-position
    attention: every field it gives equals the full evaluation bit for bit, and the full one equals torch."""
    if not fused.available(K=6, precision=precision):
        pytest.skip("no compiled kernel here")
    cfgs = [_cfg(s, p=p, N=97, precision=precision) for s, p in zip(range(6), (0.5, 0.2, 0.9, 1.0, 0.5, 0.7))]
    tr, te, st, lr, eps, w, geo = _batch(cfgs)
    dtype = getattr(torch, precision)
    gen = torch.Generator().manual_seed(0)
    if state == "few candidates":
        fused.train_steps(st, tr, lr, eps, w, geo, 3)  # p = 0.5 from zero init: c apart, a a little apart
    elif state == "every position":  # α far apart, β all but equal: every position can win
        st.a = (3 * torch.randn(st.a.shape, generator=gen)).to(dtype)
        st.c = (1e-6 * torch.randn(st.c.shape, generator=gen)).to(dtype)
    elif state == "non-finite":
        st.a = torch.randn(st.a.shape, generator=gen).to(dtype)
        st.a[1, 2], st.c[2, 5] = float("nan"), float("inf")
    whole, part = fused.evaluate(st, te, eps, geo), fused.evaluate(st, te, eps, geo, full=False)
    same = lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # noqa: E731
    for k in ("loss", "acc", "kl", "pred_dist", "spread"):
        same(getattr(whole, k), getattr(part, k))
    same(whole.attention[:, -2:], part.attention[:, -2:])
    same(whole.pred, part.pred), same(whole.pred_unsure, part.pred_unsure)
    # once=True (the training set's final loss) reads P unblocked: the loss and everything not made of P are
    # the same bits; kl and pred_dist within the kernel's rounding
    once = fused.evaluate(st, te, eps, geo, full=False, once=True)
    for k in ("loss", "acc", "spread", "pred", "pred_unsure"):
        same(getattr(once, k), getattr(part, k))
    same(once.attention[:, -2:], part.attention[:, -2:])
    close = 1e-13 if precision == "float64" else 1e-5
    for k in ("kl", "pred_dist"):
        torch.testing.assert_close(getattr(once, k), getattr(part, k), rtol=close, atol=close, equal_nan=True)
    if state != "non-finite":
        ref = engine.evaluate(st, te, eps, geo)
        tol = 1e-12 if precision == "float64" else 1e-5
        for k in ("loss", "acc", "kl", "pred_dist", "spread"):
            assert torch.allclose(getattr(whole, k), getattr(ref, k), rtol=tol, atol=tol), k


def test_the_kernel_arguments_travel_in_structs_checked_against_the_library(kernel):
    """The ctypes.Structures mirror fused.c's argument structs field by field: a loaded library reports the
    same names, offsets and size, and a struct with two fields swapped (same type, same size) is refused."""
    import ctypes

    lib = fused.library()
    for args, which in ((fused.TrainArgs, "train"), (fused.EvalArgs, "eval")):
        fused._check_layout(lib, args, which)
        fields = list(args._fields_)
        i, j = [k for k, (name, _) in enumerate(fields) if name in ("V", "a")] or [0, 1]
        fields[i], fields[j] = fields[j], fields[i]
        swapped = type("Swapped", (ctypes.Structure,), {"_fields_": fields})
        with pytest.raises(RuntimeError, match="layout"):
            fused._check_layout(lib, swapped, which)
    assert f"#define RW_ABI {fused.ABI} " in fused.SOURCE.read_text() and lib.rw_abi() == fused.ABI


@pytest.mark.parametrize("case", ["subnormal attention (float64)", "subnormal V (float32)"])
@pytest.mark.parametrize("isa", ["native", "generic"])
def test_the_kernel_leaves_an_argmax_in_the_subnormal_range_to_torch(case, isa, monkeypatch, generic_cache):
    """Below the normal range rounding is absolute, not relative to |V|: a token-logit spread of ~718 puts a
    sequence's α (and its Z) among the subnormals, where glibc's exp and torch's differ by one step, and a
    subnormal V rounds its products to that grid. Both give f an exact tie in torch that the kernel's own
    rounding breaks; the kernel must not be sure of either (found by an attack on `_argmax_tolerance`)."""
    if isa == "generic":
        monkeypatch.setenv("RW_SWEEPS_FUSED_ISA", "generic")
        monkeypatch.setenv("RW_SWEEPS_CACHE", str(generic_cache))
        fused.reset()
    try:
        if not fused.available(K=3):
            pytest.skip(f"no compiled kernel here: {fused.last_error()}")
        if case.startswith("subnormal attention"):
            dt, x = torch.float64, -717.656759
            a = torch.tensor([[0.0, x, x + 1e-9]], dtype=dt)
            alpha = torch.exp(torch.tensor([x, x + 1e-9], dtype=dt))
            V = torch.zeros(1, 3, 3, dtype=dt)
            V[0, 0, 1], V[0, 1, 2] = 1.0, (alpha[0] / alpha[1]).item()  # f_0 = f_1 in torch's rounding
            tokens = [1, 2]
        else:
            dt, U = torch.float32, torch.tensor(1e-45, dtype=torch.float32)
            a = torch.tensor([[0.0, -0.00301, -50.0]], dtype=dt)
            V = torch.zeros(1, 3, 3, dtype=dt)
            V[0, 0, 0], V[0, 1, 1] = 5961 * U, 5980 * U  # ~8e-42
            tokens = [0, 1]
        state = engine.State({"V": V}, a, torch.tensor([[0.0, 0.0, -1000.0]], dtype=dt))
        n = 16
        batch = engine.Batch(torch.tensor(tokens).expand(1, n, 2).contiguous(), torch.zeros(1, n, dtype=torch.int64),
                             torch.full((1, n, 3), 1 / 3, dtype=dt))
        geo = model.Geometry(1.0, 1.0, 1.0, 1.0, None, 1.0)
        eps = torch.full((1,), 1e-12, dtype=dt)
        got, ref = fused.evaluate(state, batch, eps, geo), engine.evaluate(state, batch, eps, geo)
        assert got.pred_unsure.item() or torch.equal(got.pred.long(), ref.pred)
        assert got.pred_unsure.item()  # the tie is torch's; the kernel leaves it to torch
    finally:
        monkeypatch.undo()
        fused.reset()


@pytest.mark.parametrize("R,n,L,K", [(3, 5, 7, 4), (40, 200, 96, 6), (2, 3, 300, 127), (1, 1, 1, 1), (0, 4, 5, 3),
                                     (2, 0, 5, 3), (5, 9, 1, 2)])
def test_the_kernels_histograms_are_engines_bit_for_bit(kernel, R, n, L, K, monkeypatch):
    """fused.symmetric_h counts each sequence's tokens in C: the same integers as engine's bincount, so the same
    X·S at the symmetric point, bit for bit, in both precisions, from bytes or int64 tokens; a token ≥ K is
    refused before the kernel reads memory by it."""
    g = torch.Generator().manual_seed(R * 1000 + L)
    tokens = torch.randint(0, K, (R, n, L), generator=g)
    for tok in (tokens, tokens.to(torch.uint8)):
        batch = engine.Batch(tok, torch.zeros(R, n, dtype=torch.long), torch.zeros(R, n, K))
        for dtype in (torch.float64, torch.float32):
            want = engine.symmetric_h(batch, K, dtype)
            with monkeypatch.context() as m:  # the kernel's own count, not engine's behind it
                m.setattr(engine, "symmetric_h", None)
                got = fused.symmetric_h(batch, K, dtype)
            assert got.dtype == want.dtype == dtype and got.shape == (R, n, K)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            if R and n:
                assert got.sum(2).mul(L).round().eq(L).all()  # every token counted once
    if R and n:
        bad = tokens.clone()
        bad[-1, -1, -1] = K
        with pytest.raises(ValueError, match="token ids must lie"):
            fused.symmetric_h(engine.Batch(bad, torch.zeros(R, n, dtype=torch.long), torch.zeros(R, n, K)), K,
                              torch.float64)


def test_histograms_the_kernel_cannot_count_are_engines(kernel, monkeypatch):
    """Tokens of K > 127 (not bytes), or not (R, n, L), are counted by engine (a token 256 would wrap to 0 as a
    byte); RW_SWEEPS_BACKEND=fused refuses them, saying why."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 300, (2, 3, 50), generator=g)
    tokens[0, 0, 0] = 256
    batch = engine.Batch(tokens, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 300))
    torch.testing.assert_close(fused.symmetric_h(batch, 300, torch.float64),
                               engine.symmetric_h(batch, 300, torch.float64), rtol=0, atol=0)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    with pytest.raises(RuntimeError, match=r"cannot count these histograms: K = 300 \(at most 127\)"):
        fused.symmetric_h(batch, 300, torch.float64)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_a_one_run_chunks_opt_acc_does_not_depend_on_threads_or_packing(tmp_path, monkeypatch, backend):
    """opt_acc (the mean over the test set of max_j P) of a family without a closed form, for a test set above
    torch's grain (32,768 values): the same bits alone and packed, whatever torch's thread count (torch splits
    a mean with one output among its threads), in a chunk of the kernel's and of PyTorch's."""
    from rw_sweeps.core import training

    monkeypatch.setenv("RW_SWEEPS_BACKEND", backend)

    def cfg(seed):
        c = RunConfig(seed=seed, data=data_config("markov_matrix", K=2, Pi=[[0.7, 0.3], [0.1, 0.9]], N=5, n_train=8,
                                                  n_test=50_000))
        c.optim.steps = 1
        return validate(c)

    got, before = [], torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got.append(training.train([cfg(0)], [tmp_path / f"a{threads}"], progress=False)[0].opt_acc)
        packed = training.train([cfg(0), cfg(1)], [tmp_path / "p0", tmp_path / "p1"], progress=False)[0].opt_acc
    finally:
        torch.set_num_threads(before)
    assert got[0] is not None and 0.5 < got[0] < 1
    assert got == [got[0]] * 3 and packed == got[0]


def test_torch_serial_leaves_the_kernels_threads_and_restores_torchs(monkeypatch):
    """Inside `torch_serial` torch's own ops run on one thread while the kernels keep the threads they had
    (RW_SWEEPS_THREADS, else torch's count outside); nested scopes stay serial; leaving, even by an error,
    gives torch its count back."""
    monkeypatch.delenv("RW_SWEEPS_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with pytest.raises(KeyError):
            with fused.torch_serial():
                assert torch.get_num_threads() == 1 and fused.threads(100) == 3 and fused.threads(2) == 2
                with fused.torch_serial():
                    assert torch.get_num_threads() == 1 and fused.threads(100) == 3
                assert torch.get_num_threads() == 1 and fused.threads(100) == 3
                monkeypatch.setenv("RW_SWEEPS_THREADS", "5")
                assert fused.threads(100) == 5
                raise KeyError("leave by an error")
        assert torch.get_num_threads() == 3 and fused.threads(100) == 5
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_torch_serial_changes_no_result(kernel, precision, tmp_path, monkeypatch):
    """A chunk trained with torch's ops on one thread (`torch_serial`, as training.train runs a kernel chunk)
    gives the records it gives with torch's whole pool: every history row and snapshot the same bits, Gaussian
    init drawn both ways (the dense draw reduces a (K+M)² W with products), zero init, p ∈ {0, 1}'s traps."""
    from rw_sweeps.core import training

    monkeypatch.delenv("RW_SWEEPS_THREADS", raising=False)
    cfgs = [_cfg(s, p=p, init=init, sigma=0.05, precision=precision, normalize=norm, K=4, N=33, n=300)
            for s, (p, init, norm) in enumerate([(0.5, "gaussian", "auto"), (1.0, "zero", "none"),
                                                 (0.3, "gaussian", "both"), (0.0, "zero", "both")])]
    for c in cfgs[2:3]:
        c.init.draw = "dense"
    for c in cfgs:
        c.optim.steps, c.eval_every, c.snapshot_steps = 12, 3, [0, 6]
    seen, evaluate = [], fused.evaluate

    def spy(*args, **kwargs):  # torch's threads and the kernel's, as each evaluation sees them
        seen.append((torch.get_num_threads(), fused.threads(len(cfgs))))
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(fused, "evaluate", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        serial = training.train(cfgs, [tmp_path / f"s{i}" for i in range(len(cfgs))], progress=False)
        assert torch.get_num_threads() == 2 and set(seen) == {(1, 2)}
        monkeypatch.setattr(fused, "torch_serial", lambda: __import__("contextlib").nullcontext())
        pooled = training.train(cfgs, [tmp_path / f"p{i}" for i in range(len(cfgs))], progress=False)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(serial, pooled):
        assert a.status == b.status == "done" and len(a.history) == 5 and len(a.snapshots) == 3
        same = lambda x, y: json.dumps(x) == json.dumps(y)  # noqa: E731 - every float's repr (NaN equal to NaN)
        assert same(a.history, b.history) and same(a.snapshots, b.snapshots)
        assert (a.trap, a.prediction_break_step, a.break_step) == (b.trap, b.prediction_break_step, b.break_step)
    assert [r.trap for r in serial] == [False, True, False, True]  # p ∈ {0, 1} with K = 4 | N − 1 = 32
