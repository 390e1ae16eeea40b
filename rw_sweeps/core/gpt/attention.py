"""Causal attention for model=gpt's training on a CPU: `attention.c`'s forward and backward as an autograd
Function, where torch's fused scaled_dot_product_attention is the reference and the fallback.

The same softmax to rounding (float64: ~1e-15 of the outputs' and gradients' scale, tests/test_gpt_attention.py),
no T×T map held (the backward recomputes the weights from the rows' log-sum-exp, as torch's does), and ~2×
faster forward and backward at model=gpt's sizes on this project's 2-core VM (docs/deeper-models.md), because
it vectorises across sequences rather than along a head's 8 features. Each sequence is computed alone, so a
packed run is the same run alone, bit for bit, and a non-finite one touches no other. Near overflow (logits
~1e18 in float64) torch's backward turns non-finite where the exact gradients are finite and the kernel's stay
so: a run blowing up is read diverged (non-finite loss or gradients) a few steps later than under torch.

Which path runs is declared, as for eq. 2.1's kernel (`rw_sweeps.core.fused`): RW_SWEEPS_BACKEND=auto (the
default) takes the kernel for float64 and float32 CPU tensors with heads at most MAX_AUTO_WIDTH wide and runs of
at least MIN_AUTO_SEQUENCES sequences, when it builds, torch otherwise; `torch` always torch; `fused` the kernel
(any head width, any batch) or a RuntimeError saying why not (`ckernel`: built, cached and threaded as every C
kernel of model=gpt).
"""
from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import fused
from .ckernel import SFX, CKernel

# Under RW_SWEEPS_BACKEND=auto the kernel takes heads at most MAX_AUTO_WIDTH wide, and runs of at least
# MIN_AUTO_SEQUENCES sequences each (batch × heads), where it was measured the faster on this project's 2-core VM:
# 1.4-2.7× torch's at width 8 (T 64 and 1,024; 16 sequences and more); no faster at width 16, where torch's kernel
# vectorises along the head's features; and 1.1-8× slower below 16 sequences, whose lane group is mostly padding.
# The rule reads a run's own shape, never the pack's size, so a run takes the same path alone and packed.
MAX_AUTO_WIDTH = 8
MIN_AUTO_SEQUENCES = 16


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, vp, dbl = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_double
    for sfx in SFX.values():
        f = getattr(lib, f"rw_attention_forward_{sfx}")
        f.argtypes, f.restype = [i64, i32, i32, i32, vp, vp, vp, i64, i64, vp, i64, i64, vp, dbl, i32], i32
        f = getattr(lib, f"rw_attention_backward_{sfx}")
        f.argtypes = [i64, i32, i32, i32, vp, vp, vp, i64, i64, vp, vp, i64, i64, vp, vp, vp, vp, dbl, i32]
        f.restype = i32


KERNEL = CKernel(Path(__file__).with_name("attention.c"), _declare)


def causal(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal attention of the heads in `qkv` (runs, …, T, 3·D: q, k and v side by side, as the model's one
    product makes them; head h is columns h·dh … (h + 1)·dh − 1 of each) → (runs, …, T, D), the heads side by
    side: softmax(q·kᵀ/√dh, causal)·v per head, as F.scaled_dot_product_attention(is_causal=True)."""
    if not isinstance(n_head, int) or isinstance(n_head, bool) or n_head < 1:
        raise ValueError(f"n_head={n_head!r}: must be a whole number of heads, at least 1")
    b = fused.backend()
    *lead, T, D3 = qkv.shape
    unfit = None if D3 % (3 * n_head) == 0 and lead else \
        f"qkv {tuple(qkv.shape)} is not (runs, …, T, 3 × {n_head} heads × a width)"
    dh, per_run = D3 // 3 // n_head, math.prod(lead[1:]) * n_head
    slower = (f"heads {dh} wide (auto: at most {MAX_AUTO_WIDTH})" if dh > MAX_AUTO_WIDTH else
              f"{per_run} sequences a run (auto: at least {MIN_AUTO_SEQUENCES})"
              if per_run < MIN_AUTO_SEQUENCES else None)
    why = KERNEL.why_not(qkv, b, unfit, slower)
    if why is None and qkv.numel():
        return _Causal.apply(qkv, n_head)
    if why is not None and b == "fused":
        raise RuntimeError(f"RW_SWEEPS_BACKEND=fused: the attention kernel cannot run: {why}")
    return reference(qkv, n_head)


def reference(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """`causal` by torch's scaled_dot_product_attention, on (rows, H, T, dh) copies of the heads."""
    *lead, T, D3 = qkv.shape
    D = D3 // 3
    heads = lambda z: z.unflatten(-1, (n_head, D // n_head)).transpose(-3, -2).reshape(-1, n_head, T, D // n_head)  # noqa: E731
    y = F.scaled_dot_product_attention(*(heads(z) for z in qkv.split(D, -1)), is_causal=True)
    return y.unflatten(0, lead).transpose(-3, -2).reshape(*lead, T, D)


class _Causal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, n_head):
        qkv = qkv.contiguous()
        *lead, T, D3 = qkv.shape
        D = D3 // 3
        dh, n = D // n_head, qkv.numel() // D3 // T * n_head
        y = torch.empty(*lead, T, D, dtype=qkv.dtype)
        lse = torch.empty(n, T, dtype=qkv.dtype)
        q, k, v = (qkv.data_ptr() + i * D * qkv.element_size() for i in range(3))
        KERNEL.call("rw_attention_forward", qkv.dtype, n, n_head, T, dh, q, k, v, T * D3, D3, y.data_ptr(), T * D, D, lse.data_ptr(),
              dh ** -0.5, fused.threads(1 << 30))
        ctx.save_for_backward(qkv, y, lse)
        ctx.n_head = n_head
        return y

    @staticmethod
    def backward(ctx, dy):
        KERNEL.no_double_backward("attention")
        qkv, y, lse = ctx.saved_tensors
        *_, T, D3 = qkv.shape
        D, n_head = D3 // 3, ctx.n_head
        dh, n = D // n_head, lse.shape[0]
        dy = dy.contiguous()
        dqkv = torch.empty_like(qkv)
        q, k, v = (qkv.data_ptr() + i * D * qkv.element_size() for i in range(3))
        dq, dk, dv = (dqkv.data_ptr() + i * D * qkv.element_size() for i in range(3))
        KERNEL.call("rw_attention_backward", qkv.dtype, n, n_head, T, dh, q, k, v, T * D3, D3, y.data_ptr(), dy.data_ptr(), T * D, D,
              lse.data_ptr(), dq, dk, dv, dh ** -0.5, fused.threads(1 << 30))
        return dqkv, None
