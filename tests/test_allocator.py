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
# from the first (as a step keeps its metrics) and frees the rest; after 3 steps, prints the page faults of 10
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
    kept = a[:10].clone()
    return kept
for _ in range(3):
    step()
before = faults()
for _ in range(10):
    step()
print(faults() - before)
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
        faults[mode] = int(r.stdout)
    assert faults["default"] >= 10 * PAGES * 0.9  # glibc's own: the 64 MiB block unmapped and faulted in, every step
    assert faults["keep"] <= 2 * PAGES  # kept: at most the heap settling once, then the same pages step after step
