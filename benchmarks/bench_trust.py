"""What the trust machinery costs, each against its own baseline measured in the same invocation:

    python benchmarks/bench_trust.py               # median of 3 repetitions, interleaved

1. `prediction_break_step` (summary.json): one extra forward pass per evaluation for runs whose attention is
   not exactly uniform and whose predictions have not yet left the symmetric point's. Its worst case is a
   batch that stays in that state all run long: normalised Gaussian init at p = 1 with a tiny σ (the escape
   preset's trapped cells). Timed as `training.train` with and without the check (the check replaced by a
   no-op), at eval_every = 10 (the escape preset) and 1 (the default), and on a typical batch (§5 zero init,
   p = 0.5). §5 shape, R = 8 runs, 200 steps.
2. Placement (`rw_sweeps.sweeps.placement.place`): finding every run's folder by its config before a launch.
   Timed on a finished sweep of n runs against `run.done_summary` per run (what a re-run paid before:
   the done check alone), both reading the same folders.

Times are wall seconds of this process; this VM's speed drifts, so only the ratios within one invocation
mean anything (medians over interleaved repetitions).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from rw_sweeps.sweeps import placement, run
from rw_sweeps.core import training
from rw_sweeps.core.config import RunConfig, data_config, validate
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.optimisers.gd import Gd

W = dataclasses.replace(RunConfig().wandb, mode="disabled")


def trapped_batch(R: int, steps: int, eval_every: int) -> list[RunConfig]:
    return [validate(RunConfig(seed=s, data=data_config(p=1.0), model=ModelConfig(normalize="whole"),
                               init=GaussianInit("gaussian", 1e-8), optim=Gd(lr=0.01, steps=steps),
                               eval_every=eval_every, wandb=W)) for s in range(R)]


def typical_batch(R: int, steps: int, eval_every: int) -> list[RunConfig]:
    """§5 zero init at p = 0.5: the attention breaks at once and the check stops after a few evaluations."""
    return [validate(RunConfig(seed=s, optim=Gd(steps=steps), eval_every=eval_every, wandb=W))
            for s in range(R)]


def time_train(cfgs, check: bool) -> float:
    original = training._Log.predictions
    if not check:
        training._Log.predictions = lambda self, *a, **k: None
    try:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            training.train(cfgs, [Path(d) / str(i) for i in range(len(cfgs))], progress=False)
            return time.perf_counter() - t0
    finally:
        training._Log.predictions = original


class _Spec:
    """What `place` reads of a job spec."""

    def __init__(self, cfg: RunConfig, num: int, sweep: Path):
        self.cfg, self.num, self.output_dir, self.placed = cfg, num, str(sweep / str(num)), None

    def relocate(self, num: int, output_dir: str) -> None:
        self.num, self.output_dir = num, output_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--R", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()

    for what, every in (("worst case", 10), ("worst case", 1), ("typical (§5, p = 0.5)", 1)):
        cfgs = (trapped_batch if what == "worst case" else typical_batch)(a.R, a.steps, every)
        time_train(cfgs, True)  # warm: the kernel, the data workers
        on, off = [], []
        for _ in range(a.reps):
            on.append(time_train(cfgs, True))
            off.append(time_train(cfgs, False))
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"prediction_break_step, {what}, eval_every={every}: {m_on:.3f} s with, {m_off:.3f} s without "
              f"({m_on / m_off:.2f}×), R={a.R}, {a.steps} steps")

    with tempfile.TemporaryDirectory() as d:
        sweep = Path(d) / "S"
        cfgs = [validate(RunConfig(seed=s, data=data_config(n_train=64, n_test=64), model=ModelConfig(M=200),
                                   optim=Gd(steps=2), wandb=W)) for s in range(a.runs)]
        run.execute(cfgs, [sweep / str(i) for i in range(a.runs)], progress=False)
        placed, done = [], []
        for _ in range(a.reps):
            specs = [_Spec(c, i, sweep) for i, c in enumerate(cfgs)]
            t0 = time.perf_counter()
            found = placement.place(specs, sweep, default_subdir=True)
            placed.append(time.perf_counter() - t0)
            assert len(found.done) == a.runs
            t0 = time.perf_counter()
            assert all(run.done_summary(c, sweep / str(i)) is not None for i, c in enumerate(cfgs))
            done.append(time.perf_counter() - t0)
        m_p, m_d = statistics.median(placed), statistics.median(done)
        print(f"placement of a finished {a.runs}-run sweep: {1e3 * m_p / a.runs:.3f} ms a run, against "
              f"{1e3 * m_d / a.runs:.3f} ms for the done check alone ({m_p / m_d:.2f}×)")


if __name__ == "__main__":
    main()
