"""The C allocator's handling of large freed blocks, for training loops that free and allocate the same large
buffers every step.

glibc's malloc gives a block above its mmap threshold (at most 32 MiB, adjusted as it goes) its own mapping and
returns it to the system when it is freed, and trims free memory off the top of its heap; every step then takes
the same pages back from the kernel, each one zeroed and faulted in again. model=gpt's step on a CPU frees
and allocates tens of MB of activations (at the benchmark's 256 Makkuva-sized runs, ~2 million page faults in
100 steps, ~10 % of its time in the kernel). `keep_freed_blocks` has glibc serve such blocks from its heap and
keep them when freed (`mallopt`, glibc's public interface): the next step reuses them. The memory stays with
the process, up to its peak (measured: up to ~10 % above the peak without it at the benchmark's 256 runs, +2 % over 8 chunks of a
sweep).

Process-wide and for good: called by a training loop that gains from it (`rw_sweeps.core.gpt.training`), never
on import. Elsewhere than glibc on Linux (macOS, Windows, musl's stub) it changes nothing.
"""
from __future__ import annotations

import ctypes
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
# a block below 1 GiB comes from the heap; older glibc versions refuse more than 32 MiB (their
# DEFAULT_MMAP_THRESHOLD_MAX on 64 bits, as mallopt(3) documents), which still keeps every block up to that size
MMAP_THRESHOLDS = (1 << 30, 32 << 20)
TRIM_THRESHOLD = 2**31 - 1  # free memory at the heap's top below 2 GiB is kept (mallopt takes an int)


@functools.lru_cache(maxsize=1)
def keep_freed_blocks() -> int:
    """Set this process's allocator to keep large freed blocks for reuse. Returns the mmap threshold set (the
    largest block kept, in bytes), or 0 where nothing was set (not glibc)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no C library to ask (musl's stub answers 0 below)
        return 0
    # both, in this order: setting either ends glibc's adjustment of the other (the trim threshold alone would
    # leave every block above 128 KiB its own mapping, measured 4× the page faults)
    threshold = next((t for t in MMAP_THRESHOLDS if mallopt(M_MMAP_THRESHOLD, t)), 0)
    if threshold and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return threshold
    return 0
