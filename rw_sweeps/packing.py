"""Packing a multirun grid: runs of one shape are trained together as one batched tensor program.

The launcher plans a `Spec` per job (`rw_sweeps.sweep`), `chunks` groups them by shape (and by
`hydra.job.env_set`, which is process-wide) and splits each group to fit a memory budget, and
`rw_sweeps.hydra_job.Chunk` trains one chunk wherever it runs. Every run's folder ends up exactly as if it
had run alone.
"""
from __future__ import annotations

from .config import RunConfig
from .hydra_job import env_set_of
from .training import group_by, shape_key


def bytes_per_run(c: RunConfig) -> int:
    """Peak memory of one run inside a batch on the PyTorch path (int64 tokens, the (n, N−1) gather and
    scatter temporaries, a dozen (n, K) tensors); measured within ~20 % at the §5 shape."""
    n, L, K = c.data.n_train + c.data.n_test, c.data.N - 1, c.data.K
    item = 8 if c.precision == "float64" else 4
    width = max(K, c.model.m or 0)
    return n * L * (8 + 3 * item) + n * width * item * 14 + 4096


def chunks(specs: list, memory_gb: float, max_runs: int | None = None) -> list[list]:
    """Group by shape (K, N, M, model, data sizes, steps, precision…) and env_set, then split each group so
    that one chunk fits in `memory_gb` (and holds at most `max_runs`). Chunks are balanced within a group."""
    out = []
    for idx in group_by(specs, lambda s: (shape_key(s.cfg), env_set_of(s))).values():
        group = [specs[i] for i in idx]
        cap = max(1, int(memory_gb * 2**30 // bytes_per_run(group[0].cfg)))
        if max_runs:
            cap = min(cap, max_runs)
        n = -(-len(group) // cap)  # ceil
        size = -(-len(group) // n)
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return out


class RunsFailed(RuntimeError):
    """Raised by a job after writing every result, so that a scheduler records the job as failed."""
