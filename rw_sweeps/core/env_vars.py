"""The RW_SWEEPS_* environment variables a run reads, each read and checked here, in one place, with no import
of torch: the front door checks them all before any job starts (`check`), so a bad value is one line there,
not a traceback in a job. How the compiled kernels run (eq. 2.1's `fused.c`, model=gpt's `gpt/*.c`):

- RW_SWEEPS_BACKEND: auto (default: the kernels where they run and are the faster) | torch | fused (the kernels,
  or a refusal saying why they cannot run);
- RW_SWEEPS_FUSED_ISA: native (default: -march=native, best first) | generic (no ISA extensions);
- RW_SWEEPS_THREADS: a whole number ≥ 1 of threads for the kernels (default, unset, empty or 0: torch's).

What a run does around them:

- RW_SWEEPS_DATA_WORKERS: a whole number ≥ 1 of threads that draw a chunk's data (default, unset, empty or 0:
  the box's cores, at most `data.MAX_DATA_WORKERS`);
- RW_SWEEPS_PROGRESS_S: seconds between the progress lines of a batch without a terminal, a number ≥ 0
  (default 30).

Where files go (RW_SWEEPS_CACHE, RW_SWEEPS_SEAL_KEY) takes any path or text, and is read by its owner.
"""
from __future__ import annotations

import os
from typing import Optional

from .errors import ConfigError

BACKENDS = ("auto", "torch", "fused")
ISA_VARIANTS = ("native", "generic")


class EnvVarError(ConfigError, ValueError):
    """A bad value of one of the variables above: `invalid config: RW_SWEEPS_…=<value>: <what is allowed>`."""


def _choice(name: str, default: str, allowed: tuple, env) -> str:
    raw = (os.environ if env is None else env).get(name, default)
    v = raw.strip().lower() or default
    if v not in allowed:
        raise EnvVarError(name, raw, f"must be one of {', '.join(allowed)}")  # the value as it was set
    return v


def backend(env=None) -> str:
    return _choice("RW_SWEEPS_BACKEND", "auto", BACKENDS, env)


def isa_variant(env=None) -> str:
    return _choice("RW_SWEEPS_FUSED_ISA", "native", ISA_VARIANTS, env)


def threads(env=None) -> Optional[int]:
    """The threads asked for, or None for torch's count."""
    return _count("RW_SWEEPS_THREADS", "torch's count", env)


def _count(name: str, meaning: str, env) -> Optional[int]:
    """A whole number ≥ 1, or None where unset, empty or 0: ASCII digits only (no sign, no `_`, no other
    script's digits, which int() would take)."""
    raw = (os.environ if env is None else env).get(name, "")
    v = raw.strip()
    if v and not (v.isascii() and v.isdigit() and len(v) <= 6):
        raise EnvVarError(name, raw, f"must be a whole number of threads, at least 1 (0 or unset: {meaning})")
    return int(v or 0) or None


def data_workers(env=None) -> Optional[int]:
    return _count("RW_SWEEPS_DATA_WORKERS", "the box's cores", env)


def progress_s(env=None) -> float:
    """Seconds between progress lines: a finite decimal number ≥ 0 (`30`, `0.5`, `1e-3`), default 30."""
    raw = (os.environ if env is None else env).get("RW_SWEEPS_PROGRESS_S", "")
    v = raw.strip()
    if not v:
        return 30.0
    try:
        s = float(v) if v.isascii() and "_" not in v else None
    except ValueError:
        s = None
    if s is None or not (0 <= s < float("inf")):
        raise EnvVarError("RW_SWEEPS_PROGRESS_S", raw, "must be a number of seconds, at least 0 (unset: 30)")
    return s


def check(env=None) -> None:
    """Every variable above as the kernels will read it, from `env` (default: this process's environment;
    the front door also passes what `hydra.job.env_set` will add to a job's). Raises EnvVarError."""
    backend(env)
    isa_variant(env)
    threads(env)
    data_workers(env)
    progress_s(env)
