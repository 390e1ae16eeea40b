"""The environment variables that choose how the compiled kernels run (eq. 2.1's `fused.c`, model=gpt's
`gpt/*.c`), each read and checked here, in one place, with no import of torch: the front door checks them
all before any job starts (`check`), so a bad value is one line there, not a traceback in a job.

- RW_SWEEPS_BACKEND: auto (default: the kernels where they run and are the faster) | torch | fused (the kernels,
  or a refusal saying why they cannot run);
- RW_SWEEPS_FUSED_ISA: native (default: -march=native, best first) | generic (no ISA extensions);
- RW_SWEEPS_THREADS: a whole number ≥ 1 of threads for the kernels (default, unset, empty or 0: torch's).
"""
from __future__ import annotations

import os
from typing import Optional

from .errors import ConfigError

BACKENDS = ("auto", "torch", "fused")
ISA_VARIANTS = ("native", "generic")


class KernelEnvError(ConfigError, ValueError):
    """A bad value of one of the variables above: `invalid config: RW_SWEEPS_…=<value>: <what is allowed>`."""


def _read(name: str, default: str) -> str:
    return os.environ.get(name, default).strip().lower() or default


def backend() -> str:
    b = _read("RW_SWEEPS_BACKEND", "auto")
    if b not in BACKENDS:
        raise KernelEnvError("RW_SWEEPS_BACKEND", b, f"must be one of {', '.join(BACKENDS)}")
    return b


def isa_variant() -> str:
    v = _read("RW_SWEEPS_FUSED_ISA", "native")
    if v not in ISA_VARIANTS:
        raise KernelEnvError("RW_SWEEPS_FUSED_ISA", v, f"must be one of {', '.join(ISA_VARIANTS)}")
    return v


def threads() -> Optional[int]:
    """The threads asked for, or None for torch's count."""
    raw = os.environ.get("RW_SWEEPS_THREADS", "").strip()
    try:
        n = int(raw or 0)
    except ValueError:
        n = -1
    if n < 0:
        raise KernelEnvError("RW_SWEEPS_THREADS", raw, "must be a whole number of threads, at least 1 (0 or unset: torch's count)")
    return n or None


def check() -> None:
    """Every variable above, as the kernels will read it (raises KernelEnvError)."""
    backend()
    isa_variant()
    threads()
