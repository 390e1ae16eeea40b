"""The cost of being a Hydra citizen: this tree against a reference commit, side by side in one run.

    python benchmarks/bench_hydra.py                  # against 86a8227 (main before the packed launcher), 3 rounds
    python benchmarks/bench_hydra.py --ref HEAD~3 --rounds 5

Each round runs the 1,000-run §5 grid through the default launcher, `python launch.py -m
data.p=0.05,…,0.95 'seed=range(0,100)'`, with the defaults (evaluation every step, wandb offline), from
process start to every result on disk, once from this tree and once from a `git worktree` of the
reference, alternating so that both see the same machine drift. It prints the medians and their ratio,
then what the per-run Hydra bookkeeping costs here: planning each job's spec, and the job envelope
(folder, `.hydra/` files, log, JobReturn) around a no-op twin.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ["data.p=0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95", "seed=range(0,100)"]


def grid(tree: Path, sweep: Path, extra: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(tree / "launch.py"), "-m", *GRID, *extra, f"hydra.sweep.dir={sweep}"],
                       cwd=tree, capture_output=True, text=True, env={**os.environ, "CI": "1", "WANDB_SILENT": "true"})
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{tree}: {r.stderr[-2000:]}")
    done = sum(json.loads(p.read_text())["status"] == "done" for p in sweep.glob("*/summary.json"))
    assert done == 1000, f"{tree}: only {done} runs done"
    return wall


def bookkeeping(n: int = 1000) -> tuple[float, float]:
    """µs per run: planning the specs of an n-run grid, and the Hydra job envelope around a no-op twin."""
    sys.path.insert(0, str(ROOT))
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from rw_sweeps.sweeps import writer
    from rw_sweeps.sweeps.hydra_job import Chunk
    from rw_sweeps.sweeps.run import Pending
    from rw_sweeps.sweeps.planner import Planner

    with tempfile.TemporaryDirectory() as d, initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        overrides = [GRID[0], f"seed=range(0,{n // 10})", f"hydra.sweep.dir={d}"]
        loader = GlobalHydra.instance().config_loader()
        cfg = loader.load_configuration("config", overrides=overrides, run_mode=RunMode.MULTIRUN)
        parser = OverridesParser.create(config_loader=loader)
        jobs = [j for b in BasicSweeper.split_arguments(parser.parse_overrides(overrides[:2]), None) for j in b]
        planner = Planner(loader, cfg)
        planner.plan(jobs[:1])  # the one composition per group choice, then the per-run part
        t = time.perf_counter()
        specs = planner.plan(jobs)
        plan_us = (time.perf_counter() - t) / len(specs) * 1e6
        chunk = Chunk(specs, lambda ss: Pending(lambda: [({"status": "done"}, ["done: …"]) for _ in ss]))
        devnull = open(os.devnull, "w")
        stdout, sys.stdout = sys.stdout, devnull
        try:
            t = time.perf_counter()
            chunk()
            writer.flush()  # the envelopes and the job logs are written on the writer thread
            envelope_us = (time.perf_counter() - t) / len(specs) * 1e6
        finally:
            sys.stdout = stdout
    return plan_us, envelope_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="86a8227", help="the reference commit (default: main before the packed launcher)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides for both, e.g. wandb.mode=disabled")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-hydra-"))
    ref = tmp / "ref"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(ref), args.ref], check=True,
                   capture_output=True)
    try:
        walls: dict[str, list[float]] = {"this tree": [], f"ref {args.ref}": []}
        for i in range(args.rounds):
            for name, tree in (("this tree", ROOT), (f"ref {args.ref}", ref)):
                walls[name].append(grid(tree, tmp / f"{name.split()[0]}-{i}", args.extra))
                print(f"round {i}: {name:<16} {walls[name][-1]:6.1f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], capture_output=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    this, base = med["this tree"], med[f"ref {args.ref}"]
    print(f"\n1,000-run §5 grid, default launcher, eval every step, wandb offline ({os.cpu_count()} cores), "
          f"median of {args.rounds}:")
    for k, v in med.items():
        print(f"  {k:<16} {v:6.1f} s   ({1000 / v:5.1f} runs/s)")
    print(f"  ratio this/ref   {this / base:6.2f}×")
    plan_us, envelope_us = bookkeeping()
    print(f"\nper-run Hydra bookkeeping here: planning {plan_us:.0f} µs, job envelope (folder, .hydra/ files, "
          f"log, JobReturn) {envelope_us:.0f} µs")


if __name__ == "__main__":
    main()
