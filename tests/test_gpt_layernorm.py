"""model=gpt's LayerNorm kernel (rw_sweeps/core/gpt/layernorm.c) against torch's layer_norm with each run's gain
and bias after it, the reference: the same outputs and gradients to rounding, each run its own computation,
and the backend switch as declared."""
from __future__ import annotations

import pytest
import torch

from rw_sweeps.core import fused
from rw_sweeps.core.gpt import layernorm

TOL = {torch.float64: 1e-14, torch.float32: 5e-6}  # of each output's and gradient's largest |value|


@pytest.fixture(scope="module")
def kernel():
    if layernorm.KERNEL.library() is None:
        pytest.skip(f"no layernorm kernel: {layernorm.KERNEL.last_error()}")


def _inputs(shape, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    R, D = shape[0], shape[-1]
    x = (3 * rnd(*shape) + rnd(*shape[:-1], 1)).to(dtype).requires_grad_()  # rows with their own offsets
    gain = (1 + 0.3 * rnd(R, D)).to(dtype).requires_grad_()
    b = (0.5 * rnd(R, D)).to(dtype).requires_grad_() if bias else None
    return x, gain, b, rnd(*shape).to(dtype)


def _run(fn, x, g, b, w):
    y = fn(x, g, b)
    wrt = [x, g] + ([b] if b is not None else [])
    return (y, *torch.autograd.grad((y * w).sum(), wrt))


# (runs, …, D): rows per run not a multiple of a lane group's 16, one row, width 8 and others
SHAPES = [(1, 1, 1, 8), (3, 5, 7, 8), (4, 2, 64, 8), (2, 3, 5, 1), (5, 37, 3), (2, 1, 9, 40)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch(kernel, monkeypatch, shape, dtype, bias):
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    x, g, b, w = _inputs(shape, dtype, bias, seed=sum(shape))
    got, ref = _run(layernorm.layer_norm, x, g, b, w), _run(layernorm.reference, x, g, b, w)
    for name, a, r in zip(("y", "dx", "dg", "db"), got, ref):
        err = ((a - r).abs().max() / r.abs().max().clamp_min(1)).item()
        assert err < TOL[dtype], f"{name}: {err:.1e}"


def test_each_run_alone(kernel, monkeypatch):
    """Run r normalised among 9 others is bit for bit run r alone (its gain's gradient summed in one order),
    and a non-finite run leaves the others as they were."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    x, g, b, w = _inputs((10, 3, 21, 8), torch.float64, True, seed=3)
    whole = _run(layernorm.layer_norm, x, g, b, w)
    for r in (0, 4, 9):
        part = [t[r:r + 1].detach().requires_grad_() for t in (x, g, b)]
        alone = _run(layernorm.layer_norm, *part, w[r:r + 1])
        assert all(torch.equal(a[r:r + 1], c) for a, c in zip(whole, alone))
    bad = x.detach().clone()
    bad[6, 1, 2, 3] = float("nan")
    got = _run(layernorm.layer_norm, bad.requires_grad_(), g, b, w)
    others = torch.arange(10) != 6
    assert all(torch.equal(a[others], c[others]) for a, c in zip(got, whole))
    assert not any(torch.isfinite(a[6]).all() for a in got[:3])  # y, dx, dg (db = Σ dy does not read x)


@pytest.mark.parametrize("dtype,big", [(torch.float32, 3e19), (torch.float64, 3e154)])
def test_a_row_whose_variance_overflows_is_nan(kernel, monkeypatch, dtype, big):
    """Finite entries whose variance is not finite in the dtype: the row cannot be normalised, and the kernel
    says so with NaN (a run that blew up reads as diverged, not as a row of zeros). torch's own result there
    depends on how it summed: NaN for these rows, 0 in a narrow band below (rows ±6.6e18 in float32)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    x = torch.tensor([[[big, -big / 2, big / 3, 0.0, 1.0, -1.0, 2.0, big / 7]]], dtype=dtype)
    g = torch.ones(1, 8, dtype=dtype)
    assert torch.isnan(layernorm.reference(x, g)).all() and torch.isnan(layernorm.layer_norm(x, g)).all()
    band = torch.tensor([[[1.0, 1, 1, 1, -1, -1, -1, -1]]], dtype=dtype) * (6.607e18 if dtype == torch.float32 else 4.8e153)
    assert torch.isnan(layernorm.layer_norm(band, g)).all()


@pytest.mark.parametrize("runs,rows", [(1, 600), (3, 257), (2, 5)])
def test_threads_change_no_bit(kernel, monkeypatch, runs, rows):
    """1, 2 or 3 threads, sharing one run's rows (pieces of 256) or whole runs: the same bits, gain and bias
    gradients included."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    x, g, b, w = _inputs((runs, rows, 8), torch.float64, True, seed=rows)
    got = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("RW_SWEEPS_THREADS", threads)
        got.append(_run(layernorm.layer_norm, x, g, b, w))
    assert all(torch.equal(a, c) for other in got[1:] for a, c in zip(got[0], other))


def test_backend_switch(kernel, monkeypatch):
    """torch: torch's kernel, bit for bit; auto: the kernel on a CPU in float64/float32 with a (runs, width) gain
    and bias of x's dtype, torch's otherwise (other dtypes, a gain to broadcast); fused: the kernel, or a
    RuntimeError naming why."""
    x, g, b, _ = _inputs((3, 4, 8), torch.float64, False)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    assert torch.equal(layernorm.layer_norm(x, g), layernorm.reference(x, g))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    assert layernorm.layer_norm(x, g).grad_fn.name().endswith("_LayerNormBackward")
    half = [t.detach().to(torch.bfloat16) for t in (x, g)]
    assert torch.equal(layernorm.layer_norm(*half), layernorm.reference(*half))
    for gain in (g[:1].detach(), g.detach().float()):  # one gain for every run; a float32 gain for float64 rows
        assert torch.equal(layernorm.layer_norm(x, gain), layernorm.reference(x, gain))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    with pytest.raises(RuntimeError, match="layernorm kernel cannot run: dtype torch.bfloat16"):
        layernorm.layer_norm(*half)
    with pytest.raises(RuntimeError, match="the gain and bias are not \\(runs, width\\) of x's dtype"):
        layernorm.layer_norm(x, g[:1])


def test_no_silent_second_derivative(kernel, monkeypatch):
    """The kernel's backward is not differentiable: create_graph=True through it is refused."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    x, g, b, w = _inputs((2, 3, 8), torch.float64, False)
    y = layernorm.layer_norm(x, g)
    with pytest.raises(RuntimeError, match="layernorm: the C kernel's backward is not differentiable"):
        torch.autograd.grad((y * w).sum() + (x ** 3).sum(), x, create_graph=True)


def test_fallback_without_compiler(monkeypatch, tmp_path):
    """No compiler: auto runs torch's kernel, bit for bit; fused refuses, saying so."""
    monkeypatch.setattr(fused, "CC", str(tmp_path / "no-such-gcc"))
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    layernorm.KERNEL.reset()
    try:
        x, g, b, _ = _inputs((2, 5, 8), torch.float32, True)
        assert torch.equal(layernorm.layer_norm(x, g, b), layernorm.reference(x, g, b))
        assert layernorm.KERNEL.library() is None and "no-such-gcc" in layernorm.KERNEL.last_error()
        monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
        with pytest.raises(RuntimeError, match="no compiled kernel"):
            layernorm.layer_norm(x, g, b)
    finally:
        monkeypatch.undo()
        layernorm.KERNEL.reset()
