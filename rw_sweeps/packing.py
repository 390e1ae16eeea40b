"""Packing a multirun grid: runs of one shape are trained together as one batched tensor program.

The launcher turns Hydra's job list into `Run`s (config + folder), `chunks` groups them by shape and splits
each group to fit a memory budget, and `ChunkJob` trains one chunk wherever it runs (this process, a
process pinned to a GPU, a SLURM array task). Every run's folder ends up exactly as if it had run alone.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import results, run
from .config import RunConfig, from_dict


@dataclass
class Run:
    cfg: RunConfig
    run_dir: Path
    overrides: list[str]
    num: int  # Hydra's job number


def bytes_per_run(c: RunConfig) -> int:
    """Peak memory of one run inside a batch on the PyTorch path (int64 tokens, the (n, N−1) gather and
    scatter temporaries, a dozen (n, K) tensors); measured within ~20 % at the §5 shape."""
    n, L, K = c.data.n_train + c.data.n_test, c.data.N - 1, c.data.K
    item = 8 if c.precision == "float64" else 4
    width = max(K, c.model.m or 0)
    return n * L * (8 + 3 * item) + n * width * item * 14 + 4096


def chunks(runs: list[Run], memory_gb: float, max_runs: int | None = None) -> list[list[Run]]:
    """Group by shape (K, N, M, model, data sizes, steps, precision…), then split each group so that one
    chunk fits in `memory_gb` (and holds at most `max_runs`). Chunks are balanced within a group."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(run.shape_key(r.cfg), []).append(r)
    out = []
    for group in groups.values():
        cap = max(1, int(memory_gb * 2**30 // bytes_per_run(group[0].cfg)))
        if max_runs:
            cap = min(cap, max_runs)
        n = -(-len(group) // cap)  # ceil
        size = -(-len(group) // n)
        out += [group[i:i + size] for i in range(0, len(group), size)]
    return out


def write_overrides(r: Run) -> None:
    """What Hydra would have left in `.hydra/`: the job's overrides, so a run can be reproduced alone."""
    results.atomic_write(r.run_dir / ".hydra" / "overrides.yaml", yaml.safe_dump(r.overrides))


class RunsFailed(RuntimeError):
    """Raised by a job after writing every result, so that a scheduler records the job as failed."""


class ChunkJob:
    """Train one chunk (picklable). Wherever it is started again (a SLURM requeue after a preemption, a
    time limit or `scontrol requeue`; the same sweep run again) it skips the runs already done and
    continues the others from their checkpoints; a job with a failed run ends with an error, so that a
    scheduler records it as failed."""

    def __call__(self, cfgs: list[dict], run_dirs: list[str], fail_job_on_failed_run: bool = True) -> list[dict]:
        summaries = run.execute([from_dict(c) for c in cfgs], [Path(d) for d in run_dirs])
        failed = [d for d, s in zip(run_dirs, summaries) if s["status"] == "failed"]
        for s in summaries:
            print(run.one_line(s), flush=True)
        if failed and fail_job_on_failed_run:
            raise RunsFailed(f"{len(failed)} run(s) failed: " + ", ".join(failed[:5]))
        return summaries

    def checkpoint(self, *args, **kwargs):
        """submitit calls this on its timeout/preemption signal: requeue the same job; the runs' own
        checkpoints (every `checkpoint_every` steps) carry the progress."""
        import submitit

        print(f"rw_sweeps: job interrupted, requeued (pid {os.getpid()})", file=sys.stderr, flush=True)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
