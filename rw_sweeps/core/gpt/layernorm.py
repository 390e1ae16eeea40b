"""LayerNorm with a gain (and bias) per run, for model=gpt on a CPU: `layernorm.c`'s forward and backward as an
autograd Function, where torch's layer_norm followed by the run's gain (and bias) is the reference and the
fallback.

The same arithmetic to rounding, and NaN for a row whose variance overflows the dtype (torch's own result there
is NaN, or 0 in a narrow band, as its sums fall: tests/test_gpt_layernorm.py), faster at model=gpt's
widths because it vectorises across rows rather than along a row's 8 features (docs/deeper-models.md). A run's
gain and bias gradients are the sums of its pieces of 256 rows, added in order, so neither the thread count nor
the other runs in the pack change a bit.

Which path runs: RW_SWEEPS_BACKEND as for the attention kernel (`ckernel`); auto takes the kernel for every
width where the gain and bias are (runs, width) of x's dtype (measured here, forward and backward, one run of
16 × 1,024 rows and 256 runs of 1,024: 0.33-0.6 of torch's time at width 8, 0.5-0.95 at 16 to 128).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from .. import fused
from .ckernel import SFX, CKernel

LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, vp, dbl = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_double
    for sfx in SFX.values():
        f = getattr(lib, f"rw_layernorm_forward_{sfx}")
        f.argtypes, f.restype = [i64, i64, i32, vp, vp, vp, dbl, vp, vp, vp, i32], i32
        f = getattr(lib, f"rw_layernorm_backward_{sfx}")
        f.argtypes, f.restype = [i64, i64, i32, vp, vp, vp, vp, vp, vp, vp, vp, i32], i32


KERNEL = CKernel(Path(__file__).with_name("layernorm.c"), _declare)


def layer_norm(x: torch.Tensor, g: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LayerNorm over the last dimension of x (R, …, D) with run r's gain g[r] (R, D) and bias b[r], or none."""
    backend = fused.backend()
    want = (x.shape[0], x.shape[-1]) if x.dim() >= 2 else None
    unfit = None if want is not None and all(t is None or (t.shape == want and t.dtype == x.dtype and t.device == x.device)
                                             for t in (g, b)) else "the gain and bias are not (runs, width) of x's dtype"
    why = KERNEL.why_not(x, backend, unfit)
    if why is None and x.numel():
        return _LayerNorm.apply(x, g, b)
    if why is not None and backend == "fused":
        raise RuntimeError(f"RW_SWEEPS_BACKEND=fused: the layernorm kernel cannot run: {why}")
    return reference(x, g, b)


def reference(x: torch.Tensor, g: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`layer_norm` by torch's kernel, the run's gain (and bias) after it."""
    lead = (slice(None),) + (None,) * (x.dim() - 2)
    y = F.layer_norm(x, x.shape[-1:], eps=LN_EPS) * g[lead]
    return y + b[lead] if b is not None else y


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, b):
        x, g = x.contiguous(), g.contiguous()
        b = b.contiguous() if b is not None else None
        R, D = x.shape[0], x.shape[-1]
        per_run = x.numel() // D // R
        y = torch.empty_like(x)
        mean, rstd = (torch.empty(R * per_run, dtype=x.dtype) for _ in range(2))
        KERNEL.call("rw_layernorm_forward", x.dtype, R, per_run, D, x.data_ptr(), g.data_ptr(),
                    b.data_ptr() if b is not None else None, LN_EPS, y.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                    fused.threads(1 << 30))
        ctx.save_for_backward(x, g, mean, rstd)
        ctx.bias = b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        KERNEL.no_double_backward("layernorm")
        x, g, mean, rstd = ctx.saved_tensors
        R, D = x.shape[0], x.shape[-1]
        dy = dy.contiguous()
        dx, dg = torch.empty_like(x), torch.empty_like(g)
        db = torch.empty_like(g) if ctx.bias else None
        KERNEL.call("rw_layernorm_backward", x.dtype, R, x.numel() // D // R, D, x.data_ptr(), g.data_ptr(),
                    mean.data_ptr(), rstd.data_ptr(), dy.data_ptr(), dx.data_ptr(), dg.data_ptr(),
                    db.data_ptr() if db is not None else None, fused.threads(1 << 30))
        return dx, dg, db
