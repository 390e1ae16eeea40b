"""model=gpt's causal attention kernel (rw_sweeps/core/gpt/attention.c) against torch's
scaled_dot_product_attention, the reference: the same outputs and gradients to rounding, every sequence its own
computation, and the backend switch as declared."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rw_sweeps.core import fused
from rw_sweeps.core.gpt import attention

TOL = {torch.float64: 1e-14, torch.float32: 5e-6}  # of each output's and gradient's scale (below)


@pytest.fixture(scope="module")
def kernel():
    if attention.library() is None:
        pytest.skip(f"no attention kernel: {attention.last_error()}")
    return attention.library()


def _inputs(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_() for _ in range(3)]


def _run(fn, q, k, v, w):
    y = fn(q, k, v)
    return (y, *torch.autograd.grad((y * w).sum(), (q, k, v)))


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ragged lane groups (1, 15, 17, 40 sequences of 16 a group), one key, odd widths, T past a group's 64
SHAPES = [(1, 1, 2, 8), (3, 5, 3, 8), (17, 1, 64, 8), (2, 20, 7, 1), (40, 1, 130, 3), (4, 2, 33, 5), (2, 1, 300, 8)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch(kernel, monkeypatch, shape, dtype):
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    q, k, v = _inputs(shape, dtype, seed=sum(shape))
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    ref, got = _run(_sdpa, q, k, v, w), _run(attention.causal, q, k, v, w)
    # each compared at the scale of the terms it sums (a saturated softmax's dq and dk are far smaller)
    top = lambda t: t.detach().abs().max().item()  # noqa: E731
    terms = {"y": top(v), "dq": top(w) * top(v) * top(k), "dk": top(w) * top(v) * top(q), "dv": top(w)}
    for (name, scale), a, b in zip(terms.items(), got, ref):
        err = (a - b).abs().max().item() / max(top(b), scale)
        assert err < TOL[dtype], f"{name}: {err:.1e}"
    assert torch.equal(got[0][..., 0, :], v[..., 0, :])  # the first query sees one key: its value, exactly


def test_each_sequence_alone(kernel, monkeypatch):
    """Sequence s computed among 37 others is bit for bit sequence s computed alone, and a non-finite
    sequence leaves every other one as it was (lanes never mix)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    q, k, v = _inputs((37, 1, 24, 8), torch.float64, seed=5)
    w = torch.randn(37, 1, 24, 8, dtype=torch.float64)
    whole = _run(attention.causal, q, k, v, w)
    for s in (0, 15, 16, 36):
        alone = _run(attention.causal, *(t[s:s + 1].detach().requires_grad_() for t in (q, k, v)), w[s:s + 1])
        assert all(torch.equal(a[s:s + 1], b) for a, b in zip(whole, alone))
    bad = [t.detach().clone() for t in (q, k, v)]
    bad[1][20, 0, 3, 2] = float("nan")
    bad[0][21, 0, 0, 0] = float("inf")
    got = _run(attention.causal, *(t.requires_grad_() for t in bad), w)
    hit = torch.zeros(37, dtype=torch.bool)
    hit[20:22] = True
    for a, b in zip(got, whole):
        assert torch.equal(a[~hit], b[~hit]) and not torch.isfinite(a[hit]).all()


def test_backend_switch(kernel, monkeypatch):
    """torch: torch's kernel, bit for bit; auto: the kernel for heads up to MAX_AUTO_WIDTH wide on a CPU in
    float64/float32, torch's for wider heads and other dtypes; fused: the kernel, or a RuntimeError naming why."""
    q, k, v = _inputs((3, 2, 9, 8), torch.float64)
    ref = _sdpa(q, k, v)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    assert torch.equal(attention.causal(q, k, v), ref)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    assert attention.causal(q, k, v).grad_fn.name().endswith("_CausalBackward")
    wide = [t[..., :4].repeat(1, 1, 1, 4).detach() for t in (q, k, v)]  # 16 wide
    assert torch.equal(attention.causal(*wide), _sdpa(*wide))
    half = [t.detach().to(torch.bfloat16) for t in (q, k, v)]
    assert torch.equal(attention.causal(*half), _sdpa(*half))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    assert (attention.causal(*wide) - _sdpa(*wide)).abs().max() < 1e-13
    with pytest.raises(RuntimeError, match="attention kernel cannot run: dtype torch.bfloat16"):
        attention.causal(*half)


def test_fallback_without_compiler(monkeypatch, tmp_path):
    """No compiler: auto runs torch's kernel, bit for bit; fused refuses, saying so."""
    monkeypatch.setattr(fused, "CC", str(tmp_path / "no-such-gcc"))
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    attention.reset()
    try:
        q, k, v = _inputs((2, 1, 5, 8), torch.float32)
        assert torch.equal(attention.causal(q, k, v), _sdpa(q, k, v))
        assert attention.library() is None and "no-such-gcc" in attention.last_error()
        monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
        with pytest.raises(RuntimeError, match="no compiled kernel"):
            attention.causal(q, k, v)
    finally:
        monkeypatch.undo()
        attention.reset()
