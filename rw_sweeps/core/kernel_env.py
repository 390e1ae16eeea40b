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


def _choice(name: str, default: str, allowed: tuple, env) -> str:
    raw = (os.environ if env is None else env).get(name, default)
    v = raw.strip().lower() or default
    if v not in allowed:
        raise KernelEnvError(name, raw, f"must be one of {', '.join(allowed)}")  # the value as it was set
    return v


def backend(env=None) -> str:
    return _choice("RW_SWEEPS_BACKEND", "auto", BACKENDS, env)


def isa_variant(env=None) -> str:
    return _choice("RW_SWEEPS_FUSED_ISA", "native", ISA_VARIANTS, env)


def threads(env=None) -> Optional[int]:
    """The threads asked for, or None for torch's count: ASCII digits only (no sign, no `_`, no other script's
    digits, which int() would take)."""
    raw = (os.environ if env is None else env).get("RW_SWEEPS_THREADS", "")
    v = raw.strip()
    if v and not (v.isascii() and v.isdigit() and len(v) <= 6):
        raise KernelEnvError("RW_SWEEPS_THREADS", raw,
                             "must be a whole number of threads, at least 1 (0 or unset: torch's count)")
    return int(v or 0) or None


def check(env=None) -> None:
    """Every variable above as the kernels will read it, from `env` (default: this process's environment;
    the front door also passes what `hydra.job.env_set` will add to a job's). Raises KernelEnvError."""
    backend(env)
    isa_variant(env)
    threads(env)
