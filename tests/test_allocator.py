"""`rw_sweeps.core.allocator`: a large block freed by one training step is taken back by the next without the
kernel faulting its pages in again. The setting is process-wide, so each case runs in a process of its own."""
from __future__ import annotations

import sys

import pytest

from .conftest import ROOT, python

pytestmark = pytest.mark.e2e  # a process per case (tests/conftest.py)

MIB_64 = 64 << 20
PAGES = MIB_64 // 4096

# A training loop's buffers: each step allocates and writes a 64 MiB and a 24 MiB block, keeps a small tensor made
# from the first (as a step keeps its metrics) and frees the rest; prints the page faults of each of 16 steps
STEPS = """
import resource, sys
sys.path.insert(0, {root!r})  # this checkout's, whatever the environment has installed
import torch
from rw_sweeps.core import allocator
if sys.argv[1] == "keep" and allocator.keep_freed_blocks() < {n}:
    print("unkept")  # this C library keeps no block that large (an older glibc keeps 32 MiB at most)
    sys.exit()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():
    a, b = torch.ones({n}, dtype=torch.uint8), torch.ones({m}, dtype=torch.uint8)
    return a[:10].clone()
out = []
for _ in range(16):
    before = faults()
    step()
    out.append(faults() - before)
print(*out)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="not Linux: the allocator is left as it is")
def test_the_blocks_a_step_frees_are_reused_by_the_next_without_faulting_their_pages_in_again(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(STEPS.format(root=str(ROOT), n=MIB_64, m=24 << 20))
    faults = {}
    for mode in ("default", "keep"):
        r = python(script, mode)
        assert r.returncode == 0, r.stderr
        if r.stdout.strip() == "unkept":
            pytest.skip("this C library keeps no 64 MiB block (mallopt refused the threshold)")
        faults[mode] = [int(x) for x in r.stdout.split()]
    # the last 8 steps (the heap settles in the first few: 4 measured here):
    # glibc's own: the 64 MiB block unmapped when freed, and every page of it faulted in again, every step
    assert all(f >= PAGES * 0.9 for f in faults["default"][8:]), faults
    # kept: the same pages, step after step
    assert all(f <= PAGES * 0.01 for f in faults["keep"][8:]), faults
