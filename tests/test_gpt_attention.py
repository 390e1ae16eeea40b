"""model=gpt's causal attention kernel (rw_sweeps/core/gpt/attention.c) against torch's
scaled_dot_product_attention, the reference: the same outputs and gradients to rounding, every sequence its own
computation, and the backend switch as declared."""
from __future__ import annotations

import pytest
import torch

from rw_sweeps.core import fused
from rw_sweeps.core.gpt import attention

TOL = {torch.float64: 1e-14, torch.float32: 5e-6}  # of each output's and gradient's scale (below)


@pytest.fixture(scope="module")
def kernel():
    if attention.KERNEL.library() is None:
        pytest.skip(f"no attention kernel: {attention.KERNEL.last_error()}")
    return attention.KERNEL.library()


def _inputs(rows, H, T, dh, dtype, seed=0, scale=3.0):
    """A (rows, T, 3·H·dh) qkv, as the model's one product makes it, and a weight w for y's gradient."""
    g = torch.Generator().manual_seed(seed)
    qkv = (scale * torch.randn(rows, T, 3 * H * dh, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    return qkv, torch.randn(rows, T, H * dh, generator=g, dtype=torch.float64).to(dtype)


def _run(fn, qkv, H, w):
    y = fn(qkv, H)
    return y, torch.autograd.grad((y * w).sum(), qkv)[0]


def _literal(qkv, H):
    """The textbook float64 attention: scores, a −inf mask above the diagonal, softmax, weights × values."""
    *lead, T, D3 = qkv.shape
    q, k, v = (z.unflatten(-1, (H, D3 // 3 // H)).transpose(-3, -2) for z in qkv.split(D3 // 3, -1))
    s = q @ k.transpose(-1, -2) / (D3 // 3 // H) ** 0.5
    P = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (P @ v).transpose(-3, -2).flatten(-2)


# (rows, heads, T, head width): ragged lane groups (1, 15, 17, 40 sequences of 16 a group), several heads, odd
# widths, T past a lane group's 64 and past 256
SHAPES = [(1, 1, 2, 8), (3, 5, 3, 8), (17, 1, 64, 8), (2, 20, 7, 1), (40, 1, 130, 3), (4, 2, 33, 5), (2, 3, 300, 8),
          (5, 2, 16, 16)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_torch(kernel, monkeypatch, shape, dtype):
    """y and the gradient of every q, k and v entry, against torch's kernel (`reference`) and, in float64, the
    textbook attention, each at the scale of the terms it sums (a saturated softmax's dq and dk are far
    smaller than its inputs)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    rows, H, T, dh = shape
    qkv, w = _inputs(*shape, dtype, seed=sum(shape))
    got = _run(attention.causal, qkv, H, w)
    refs = [_run(attention.reference, qkv, H, w)]
    if dtype == torch.float64:
        refs.append(_run(_literal, qkv, H, w))
    top = lambda t: t.detach().abs().max().item()  # noqa: E731
    scale = {"y": top(qkv), "dqkv": top(w) * top(qkv) ** 2}
    for ref in refs:
        for (name, s), a, b in zip(scale.items(), got, ref):
            err = (a - b).abs().max().item() / max(top(b), s)
            assert err < TOL[dtype], f"{name}: {err:.1e}"
    D = H * dh
    assert torch.equal(got[0][:, 0], qkv[:, 0, 2 * D:])  # the first query sees one key: its value, exactly


def test_each_sequence_alone(kernel, monkeypatch):
    """Row r computed among 37 others is bit for bit row r computed alone, and a non-finite row leaves every
    other one as it was (lanes never mix)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    qkv, w = _inputs(37, 2, 24, 8, torch.float64, seed=5)
    whole = _run(attention.causal, qkv, 2, w)
    for r in (0, 7, 8, 36):
        alone = _run(attention.causal, qkv[r:r + 1].detach().requires_grad_(), 2, w[r:r + 1])
        assert all(torch.equal(a[r:r + 1], b) for a, b in zip(whole, alone))
    bad = qkv.detach().clone()
    bad[20, 3, 20] = float("nan")  # a key of row 20's first head
    bad[21, 0, 9] = float("inf")  # a query of row 21's second head
    got = _run(attention.causal, bad.requires_grad_(), 2, w)
    hit = torch.zeros(37, dtype=torch.bool)
    hit[20:22] = True
    for a, b in zip(got, whole):
        assert torch.equal(a[~hit], b[~hit]) and not torch.isfinite(a[hit]).all()


@pytest.mark.parametrize("rows,T", [(1, 300), (2, 64), (40, 9)])
def test_threads_change_no_bit(kernel, monkeypatch, rows, T):
    """1, 2 or 3 threads, with a group's rows shared among them (fewer lane groups than threads: one or two
    sequences of 300 or 64 positions) or whole groups each: the same bits."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    qkv, w = _inputs(rows, 1, T, 8, torch.float64, seed=T)
    got = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("RW_SWEEPS_THREADS", threads)
        got.append(_run(attention.causal, qkv, 1, w))
    assert all(torch.equal(a, b) for other in got[1:] for a, b in zip(got[0], other))


def test_backend_switch(kernel, monkeypatch):
    """torch: torch's kernel, bit for bit; auto: the kernel on a CPU in float64/float32 for heads at most
    MAX_AUTO_WIDTH wide and runs of at least MIN_AUTO_SEQUENCES sequences (batch × heads), torch's otherwise (wider
    heads, smaller runs, other dtypes); fused: the kernel, or a RuntimeError naming why."""
    qkv = _inputs(9, 2, 9, 8, torch.float64)[0].unsqueeze(0)  # one run of 9 × 2 heads = 18 sequences, 8 wide
    ref = attention.reference(qkv, 2)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    assert torch.equal(attention.causal(qkv, 2), ref)
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    assert attention.causal(qkv, 2).grad_fn.name().endswith("_CausalBackward")
    assert torch.equal(attention.causal(qkv, 1), attention.reference(qkv, 1))  # one head 16 wide
    small = qkv.detach().view(9, 1, 9, 48).requires_grad_()  # nine runs of 2 sequences: torch's, however many runs are packed
    assert torch.equal(attention.causal(small, 2), attention.reference(small, 2))
    half = qkv.detach().to(torch.bfloat16)
    assert torch.equal(attention.causal(half, 2), attention.reference(half, 2))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    assert (attention.causal(qkv, 1) - attention.reference(qkv, 1)).abs().max() < 1e-13
    assert attention.causal(small, 2).grad_fn.name().endswith("_CausalBackward")
    with pytest.raises(RuntimeError, match="attention kernel cannot run: dtype torch.bfloat16"):
        attention.causal(half, 2)
    with pytest.raises(RuntimeError, match=r"qkv \(1, 9, 9, 48\) is not \(runs, …, T, 3 × 5 heads × a width\)"):
        attention.causal(qkv, 5)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="must be a whole number of heads, at least 1"):
            attention.causal(qkv, bad)


@pytest.mark.parametrize("batch", [8, 16])
def test_auto_takes_the_same_path_for_a_run_alone_and_packed(kernel, monkeypatch, batch):
    """The auto rule reads a run's own batch, not the pack's size: run 0 alone and among 3 others is the same
    bits, below the rule's 16 sequences a run (torch's kernel) and at it (the C kernel)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    qkv = _inputs(4 * batch, 1, 9, 8, torch.float64)[0].detach().view(4, batch, 9, 24)
    assert torch.equal(attention.causal(qkv[:1], 1), attention.causal(qkv, 1)[:1])


def test_no_silent_second_derivative(kernel, monkeypatch):
    """The kernel's backward is not differentiable: create_graph=True through it is refused, not a gradient
    missing its second-order terms."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
    qkv, w = _inputs(2, 1, 5, 8, torch.float64)
    y = attention.causal(qkv, 1)
    with pytest.raises(RuntimeError, match="attention: the C kernel's backward is not differentiable"):
        torch.autograd.grad((y * w).sum() + (qkv ** 2).sum(), qkv, create_graph=True)


def test_fallback_without_compiler(monkeypatch, tmp_path):
    """No compiler: auto runs torch's kernel, bit for bit; fused refuses, saying so."""
    monkeypatch.setattr(fused, "CC", str(tmp_path / "no-such-gcc"))
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "auto")
    attention.KERNEL.reset()
    try:
        qkv, _ = _inputs(2, 1, 5, 8, torch.float32)
        assert torch.equal(attention.causal(qkv, 1), attention.reference(qkv, 1))
        assert attention.KERNEL.library() is None and "no-such-gcc" in attention.KERNEL.last_error()
        monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")
        with pytest.raises(RuntimeError, match="no compiled kernel"):
            attention.causal(qkv, 1)
    finally:
        monkeypatch.undo()
        attention.KERNEL.reset()
