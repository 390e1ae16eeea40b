"""The cost of a sweep's wandb runs table (`rw_sweeps.core.wandb_io.runs_table`, logged by a packed job's run
and by the sweep's analysis run), per run:

    python benchmarks/bench_wandb_table.py            # 2,000 runs of a §5 config
    python benchmarks/bench_wandb_table.py --runs 10000

Three parts, each timed alone in a warm process: reading a run's config.yaml and summary.json as the
analysis run does (`contract.read_config`, `contract.read_summary`, from one real run folder trained here
first), building the rows, and `wandb.Table` (which type-checks every cell in Python; most of the cost).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    from rw_sweeps.core import contract
    from rw_sweeps.core.wandb_io import runs_table, wandb

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        subprocess.run([sys.executable, str(ROOT / "launch.py"), "optim.steps=2", "wandb.mode=disabled",
                        f"hydra.run.dir={run}"], check=True, capture_output=True)
        t = time.perf_counter()
        for _ in range(200):
            cfg, summary = contract.read_config(run), contract.read_summary(run)
        read = (time.perf_counter() - t) / 200
        entries = [{"cfg": {**cfg, "seed": i}, "run_dir": run.parent / str(i), "summary": {**summary, "success": True}}
                   for i in range(args.runs)]
        t = time.perf_counter()
        cols, rows = runs_table(entries, run.parent)
        build = (time.perf_counter() - t) / args.runs
        W = wandb()
        t = time.perf_counter()
        W.Table(columns=cols, data=rows, allow_mixed_types=True)
        table = (time.perf_counter() - t) / args.runs
    print(f"{args.runs} runs, {len(cols)} columns: read {read * 1e3:.2f} ms, rows {build * 1e3:.2f} ms, "
          f"wandb.Table {table * 1e3:.2f} ms; {(read + build + table) * 1e3:.2f} ms a run")


if __name__ == "__main__":
    main()
