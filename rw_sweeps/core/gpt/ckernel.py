"""A C kernel of model=gpt beside its torch reference: built, cached and checked as eq. 2.1's `fused.c` is
(`rw_sweeps.core.fused`: RW_SWEEPS_CACHE, CC, RW_SWEEPS_FUSED_ISA), and chosen as it is (RW_SWEEPS_BACKEND:
auto takes the kernel where it runs and the caller's rule says it is the faster, torch always torch, fused the
kernel or a RuntimeError saying why not). Threads: RW_SWEEPS_THREADS, else torch's.

OpenMP first: loaded beside torch, a kernel's libgomp.so.1 is torch's own (one soname, one copy in the process),
so its parallel loops run on torch's threads, which spin-wait a while after each of torch's ops. Threads of its
own would share the cores with those spinners: the attention kernel's passes measured 1.1-1.6× slower that way
on this project's 2-core VM. Where OpenMP does not build, pthreads.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable, Optional

import torch

from .. import fused

SFX = {torch.float64: "f64", torch.float32: "f32"}  # the dtypes every kernel is compiled for, and their suffix
LINKS = (("-fopenmp",), ())


class CKernel(fused.Library):
    """One C source's library (`fused.Library`, with torch's OpenMP first) and how a caller dispatches to it:
    `declare(lib)` sets its functions' ctypes signatures (and raises if the library is not the one expected,
    so that the next, more portable build is tried)."""

    def __init__(self, source: Path, declare: Callable[[ctypes.CDLL], None]):
        super().__init__(source, declare, LINKS)

    def why_not(self, x: torch.Tensor, backend: str, unfit: Optional[str] = None,
                slower: Optional[str] = None) -> Optional[str]:
        """Why the kernel does not take tensors like `x` under this backend, or None. `unfit`: the caller's reason
        the kernel cannot take these arguments at all (shapes, dtypes it does not serve); `slower`: its reason
        to leave them to torch under auto, where torch's kernel was measured the faster."""
        if backend == "torch":
            return "RW_SWEEPS_BACKEND=torch"
        if x.device.type != "cpu":
            return f"tensors on {x.device.type}"
        if x.dtype not in SFX:
            return f"dtype {x.dtype}"
        if unfit is not None:
            return unfit
        if backend == "auto" and slower is not None:
            return slower
        if self.library() is None:
            return f"no compiled kernel ({self.last_error().splitlines()[-1] if self.last_error() else 'unknown'})"
        return None

    @staticmethod
    def no_double_backward(name: str) -> None:
        """Raise where autograd is building a graph of the backward (create_graph=True): the kernels' backward
        passes are not differentiable, and a silent zero for their second-order terms would be a wrong
        number."""
        if torch.is_grad_enabled():
            raise RuntimeError(f"{name}: the C kernel's backward is not differentiable (create_graph=True); "
                               "RW_SWEEPS_BACKEND=torch runs torch's kernels")

    def call(self, name: str, dtype: torch.dtype, *args) -> None:
        """Its function `name` for this dtype; a MemoryError if it could not allocate its scratch."""
        if getattr(self.library(), f"{name}_{SFX[dtype]}")(*args) != 0:
            raise MemoryError(f"{self.source.name}: {name} could not allocate its scratch")
