"""The C allocator's handling of large freed blocks, for training loops that free and allocate the same large
buffers every step.

glibc's malloc gives a block above its mmap threshold (at most 32 MiB, adjusted as it goes) its own mapping and
returns it to the system when it is freed, and trims free memory off the top of its heap; every step then takes
the same pages back from the kernel, each one zeroed and faulted in again. model=gpt's step on a CPU frees
and allocates tens of MB of activations (at the benchmark's 256 Makkuva-sized runs, ~2 million page faults in
100 steps, ~10 % of its time in the kernel). `keep_freed_blocks` has glibc serve such blocks from its heap and
keep them when freed (`mallopt`, glibc's public interface): the next step reuses them. The memory stays with
the process, up to its peak (measured: ~10 % above the peak without it, from the heap's fragmentation).

Process-wide and for good: called by a training loop that gains from it (`rw_sweeps.core.gpt.training`), never
on import. Elsewhere than glibc (macOS, musl's stub) it changes nothing.
"""
from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 1 << 30   # a block below 1 GiB comes from the heap
TRIM_THRESHOLD = 2**31 - 1  # free memory at the heap's top below 2 GiB is kept (mallopt takes an int)


@functools.lru_cache(maxsize=1)
def keep_freed_blocks() -> bool:
    """Set this process's allocator to keep large freed blocks for reuse; True where it did (glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    # both: setting either ends glibc's adjustment of the other (the trim threshold alone would leave every
    # block above 128 KiB its own mapping, measured 4× the page faults)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
