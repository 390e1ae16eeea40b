"""Packed sweeps against the dense one-run-per-process baseline, measured in one invocation.

    python benchmarks/bench_sweep.py                 # everything (~5 min on a 2-core laptop)
    python benchmarks/bench_sweep.py --quick         # R ∈ {1, 16, 128}, fewer baseline runs

Baseline: `python -m rw_sweeps.oracle` in a fresh process per run — the literal dense eq. 2.1 with autograd
(X̃ ∈ R^{n×(K+M)×N}, W ∈ R^{(K+M)²}), as a straightforward implementation would run a sweep.
Packed: `rw_sweeps.run.run_batch` on R runs of the same grid in one warm process (data generation,
training, test evaluation at steps 0 and 50, every result file written), and the whole front door:
`python launch.py -m …` for a 1,000-run §5 grid, process start to the last file on disk.

Every figure is a ratio against the baseline measured in the same invocation: this VM's speed drifts ~2×.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rw_sweeps import run  # noqa: E402
from rw_sweeps.config import RunConfig, validate  # noqa: E402

PEAK = "import resource; print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def baseline(precision: str, n_runs: int) -> dict:
    """Wall time and peak memory of one dense run per process (§5 config)."""
    walls, peaks = [], []
    for seed in range(n_runs):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "rw_sweeps.oracle", f"precision={precision}", f"seed={seed}"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        walls.append(time.perf_counter() - t)
        peaks.append(int(out.split("PEAK")[-1]))
    wall = statistics.median(walls)
    return {"runs_s": 1 / wall, "wall_s": wall, "peak_mb": statistics.median(peaks) / 2**20}


def packed(precision: str, R: int, tmp: Path) -> dict:
    """In a fresh process, so that its peak memory is this measurement's alone."""
    out = subprocess.run([sys.executable, __file__, "--one", precision, str(R), str(tmp)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _packed_here(precision: str, R: int, tmp: Path) -> dict:
    base = validate(RunConfig(precision=precision, eval_every=50,
                              wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))
    cfgs = [dataclasses.replace(base, seed=i, data=dataclasses.replace(base.data, p=round(0.05 + 0.9 * (i % 10) / 9, 3)))
            for i in range(R)]
    dirs = [tmp / f"{precision}-{R}-{i}" for i in range(R)]
    run.run_batch(cfgs[:1], [tmp / f"warm-{precision}-{R}"], progress=False)  # imports, kernel load
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    run.run_batch(cfgs, dirs, progress=False)
    wall = time.perf_counter() - t
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"runs_s": R / wall, "wall_s": wall, "peak_mb": max(rss1 - rss0, 0) / R / 2**20}


def front_door(tmp: Path, wandb_mode: str, granularity: str = "auto") -> float:
    """`python launch.py -m` on a 1,000-run §5 grid (10 values of p × 100 seeds), end to end."""
    sweep = tmp / f"grid-{wandb_mode}-{granularity}"
    t = time.perf_counter()
    subprocess.run([sys.executable, "launch.py", "-m", "data.p=0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95",
                    "seed=range(0,100)", "eval_every=50", f"wandb.mode={wandb_mode}",
                    f"wandb.granularity={granularity}", f"hydra.sweep.dir={sweep}"],
                   cwd=ROOT, check=True, capture_output=True, text=True, env={**os.environ, "CI": "1"})
    wall = time.perf_counter() - t
    done = sum(json.loads(p.read_text())["status"] == "done" for p in sweep.glob("*/summary.json"))
    assert done == 1000, f"only {done} runs done"
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--one", nargs=3, metavar=("PRECISION", "R", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_packed_here(args.one[0], int(args.one[1]), Path(args.one[2]))))
        return
    Rs = [1, 16, 128] if args.quick else [1, 16, 128, 1024]
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    print(f"§5 shape: K=6 N=97 M=1000 n_train=n_test=1000 T=50 (torch {__import__('torch').__version__}, "
          f"{os.cpu_count()} cores, backend {os.environ.get('RW_SWEEPS_BACKEND', 'auto')})\n")
    print(f"{'path':<34}{'runs/s':>10}{'× baseline':>12}{'wall s':>10}{'peak MB/run':>13}")
    for precision in ("float64", "float32"):
        b = baseline(precision, 1 if args.quick else args.baseline_runs)
        print(f"{'dense baseline, 1 run/process ' + precision[-2:]:<34}{b['runs_s']:>10.3f}{1:>12.0f}"
              f"{b['wall_s']:>10.2f}{b['peak_mb']:>13.0f}")
        for R in Rs:
            p = packed(precision, R, tmp)
            print(f"{f'packed R={R} {precision[-2:]}':<34}{p['runs_s']:>10.1f}{p['runs_s'] / b['runs_s']:>12.0f}"
                  f"{p['wall_s']:>10.2f}{p['peak_mb']:>13.1f}")
    if not args.quick:
        b = baseline("float64", 1)
        print("\n1,000-run §5 grid through `python launch.py -m` (process start → every result on disk):")
        for mode, gran in (("disabled", "auto"), ("offline", "job"), ("offline", "run")):
            wall = front_door(tmp, mode, gran)
            print(f"  wandb {mode:<8} {gran:<4}: {wall:6.1f} s = {1000 / wall:6.1f} runs/s = "
                  f"{1000 / wall / b['runs_s']:.0f}× the baseline ({b['wall_s']:.1f} s/run)")
    print(f"\n(results under {tmp})")


if __name__ == "__main__":
    main()
