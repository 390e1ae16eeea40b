"""Sweeps end to end against the dense one-run-per-process baseline, with the per-run breakdown, in one run.

    python benchmarks/bench_sweep.py            # the grids against the baseline, the breakdown (~5–8 min on a 2-core laptop)
    python benchmarks/bench_sweep.py --quick    # one baseline run, no 10,000-run grid
    python benchmarks/bench_sweep.py --streaming    # first training line and memory: 100,000 vs 1,000 runs
    python benchmarks/bench_sweep.py --against ../old-checkout   # the 1,000-run grid's CPU and the 10,000-run grid, side by side
    python benchmarks/bench_sweep.py --write-behind   # results written behind against in turn, 1 and all threads
    python benchmarks/bench_sweep.py --all --against ../old-checkout   # the first, --streaming's and --against's rows at once (~20 min)

Baseline: `python -m rw_sweeps.core.oracle` in a fresh process per run: the literal dense eq. 2.1 with autograd
(X̃ ∈ R^{n×(K+M)×N}, W ∈ R^{(K+M)²}), as a straightforward implementation would run a sweep.

End to end: `python launch.py -m data.p=0.05,…,0.95 'seed=range(0,S)'` (the §5 grid, 10 values of p), from
process start to every result on disk, with the defaults (evaluation every step, wandb offline): 1,000 runs
with zero init and with Gaussian init (σ = 0.01), 1,000 runs with wandb disabled, and 10,000 runs.

Breakdown: each piece of that path measured on its own, in this process, at the §5 shape and the chunk
size the packed launcher uses here: imports, planning (`Planner.plan`), data (`data.make_batches`), one
training step and one evaluation per run (the fused kernel, as the loop calls it with eval_every=1), writing
a run's folder (`results`, and the Hydra envelope: `.hydra/` files and the job log) next to the file system's
own cost of creating that many files and folders, and wandb's time on the critical path of a packed job.

Every ratio is against a baseline measured in the same invocation: this VM's speed drifts ~2× over minutes.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GRID = "data.p=0.05,0.15,0.25,0.35,0.45,0.55,0.65,0.75,0.85,0.95"
GOALS = {"planning": 100, "data": 500, "writing": 500}  # µs per run (per split for data)


def baseline(n_runs: int) -> dict:
    """Wall time and peak memory of one dense run per process (§5 config, float64)."""
    walls, peaks = [], []
    for seed in range(n_runs):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "rw_sweeps.core.oracle", "precision=float64", f"seed={seed}"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        walls.append(time.perf_counter() - t)
        peaks.append(int(out.split("PEAK")[-1]))
    wall = statistics.median(walls)
    return {"runs_s": 1 / wall, "wall_s": wall, "peak_mb": statistics.median(peaks) / 2**20}


def front_door(tmp: Path, seeds: int, *extra: str, cpu: list | None = None) -> float:
    """`python launch.py -m` on the §5 grid (10 values of p × `seeds` seeds), end to end, in seconds; its CPU
    seconds (the launch's and those of the processes it waited for) appended to `cpu` where given."""
    sweep = tmp / f"grid-{seeds}-{len(list(tmp.iterdir()))}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "launch.py", "-m", GRID, f"seed=range(0,{seeds})", *extra,
                        f"hydra.sweep.dir={sweep}"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "CI": "1"})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    if r.returncode != 0:
        raise SystemExit(f"launch.py failed:\n{r.stderr[-2000:]}")
    done = sum(json.loads(p.read_text())["status"] == "done" for p in sweep.glob("*/summary.json"))
    assert done == 10 * seeds, f"only {done} runs done"
    return wall  # the folders stay until the end: deleting 10,000 of them slows this file system for minutes


def imports_s(rounds: int = 3) -> float:
    code = "import torch, hydra, omegaconf, rw_sweeps.sweeps.app, hydra_plugins.rw_sweeps_plugins.launcher"
    walls = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls)


def _median_us(fn, rounds: int, per: int, before=None) -> float:
    """Median µs per item of fn() over `rounds` (with `before()` untimed ahead of each round)."""
    ts = []
    for _ in range(rounds):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) / per * 1e6


FILES = [("", "config.yaml"), ("", "history.jsonl"), ("", "snapshots.jsonl"), ("", "summary.json"),
         (".hydra/", "config.yaml"), (".hydra/", "hydra.yaml"), (".hydra/", "overrides.yaml"), ("", "launch.log")]


def fs_floor(base: Path, runs: int) -> None:
    """The file system's own work for `runs` run folders: 2 folders and 8 small files each, every file
    written to a temp name and renamed, with bare os calls (no Python around them to speak of)."""
    base.mkdir(parents=True)
    for i in range(runs):
        d = f"{base}/{i}"
        os.mkdir(d)
        os.mkdir(d + "/.hydra")
        for sub, f in FILES:
            fd = os.open(f"{d}/{sub}.{f}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            os.write(fd, b"x" * 2000)
            os.close(fd)
            os.replace(f"{d}/{sub}.{f}.tmp", f"{d}/{sub}{f}")


def breakdown(tmp: Path) -> dict:
    """Per-run costs of each piece of the 1,000-run path, measured here, in this process."""
    import torch

    import bench_hydra
    from rw_sweeps.core import data, engine, fused, model, results, training
    from rw_sweeps.sweeps import run, tracking
    from rw_sweeps.core.config import RunConfig, validate
    from rw_sweeps.core.resources import bytes_per_run
    from rw_sweeps.sweeps.packing import chunk_sizes

    out = {"imports_s": imports_s()}
    base = validate(RunConfig())
    R = chunk_sizes(1000, bytes_per_run(base), 2 * 2**30)[0]  # the packed launcher's chunk (memory_gb: 2 GB)
    out["chunk"] = R
    cfgs = [dataclasses.replace(base, seed=i, data=dataclasses.replace(base.data, p=round(0.05 + 0.1 * (i % 10), 2)))
            for i in range(R)]
    tokens = torch.uint8 if fused.available(base) else torch.int64  # as training.train asks for them
    out["data_us"] = _median_us(lambda: data.make_batches(cfgs, token_dtype=tokens), 3, 2 * R)  # per run per split
    tr, te = data.make_batches(cfgs, token_dtype=tokens)
    train_set, test_set = (engine.Batch(s.tokens, s.y, s.P_true) for s in (tr, te))
    geo = model.geometry(base.model, base.data.N)
    st = training.initial_state(cfgs, geo, torch.float64)
    lr, eps = torch.ones(R, dtype=torch.float64), torch.full((R,), 0.1, dtype=torch.float64)
    w = torch.full((R,), 1e-3, dtype=torch.float64)
    steps, evals = [], []
    for _ in range(10):  # interleaved along the trajectory, as the loop calls them
        t = time.perf_counter()
        fused.evaluate(st, test_set, eps, geo, full=False)
        evals.append(time.perf_counter() - t)
        t = time.perf_counter()
        fused.train_steps(st, train_set, lr, eps, w, geo, 1)
        steps.append(time.perf_counter() - t)
    out["step_us"], out["eval_us"] = (statistics.median(v) / R * 1e6 for v in (steps, evals))
    # writing: the records of a real 50-step chunk into fresh folders
    disabled = dataclasses.replace(base.wandb, mode="disabled")
    small = [dataclasses.replace(c, wandb=disabled) for c in cfgs]
    recs = training.train(small, [tmp / "w" / str(i) for i in range(R)], progress=False)
    summaries = [{**training.summary(r, 0.1), **run.provenance()} for r in recs]

    def write(folder: Path) -> None:
        for r, s in zip(recs, summaries):
            d = folder / r.run_dir.name
            results.write_run(d, r.cfg.to_dict(), r.history, r.snapshots)
            results.write_summary(d, s)

    # this VM's file system swings several-fold within minutes: the two measured in alternation, in fresh
    # folders (nothing deleted in between), medians
    ours, floor, planning, envelope = [], [], [], []
    for i in range(5):
        t = time.perf_counter()
        write(tmp / f"w{i}")
        ours.append((time.perf_counter() - t) / R * 1e6)
        plan_us, envelope_us = bench_hydra.bookkeeping(1000)  # planning a 1,000-run grid, the job envelope
        planning.append(plan_us)
        envelope.append(envelope_us)
        t = time.perf_counter()
        fs_floor(tmp / f"f{i}", R)
        floor.append((time.perf_counter() - t) / R * 1e6)
    out["results_us"], out["fs_floor_us"], out["planning_us"], out["envelope_us"] = (
        statistics.median(v) for v in (ours, floor, planning, envelope))
    # wandb: what a packed job's logging costs the sweep (log_runs returns at once; the logger thread works
    # while the next chunk trains) and what it costs in all (until wait() returns)
    offline = [dataclasses.replace(c, wandb=dataclasses.replace(base.wandb, mode="offline", group="bench")) for c in cfgs]
    entries = [{"cfg": c.to_dict(), "run_dir": r.run_dir, "run_id": results.run_id(r.run_dir), "history": r.history,
                "summary": s} for c, r, s in zip(offline, recs, summaries)]
    tracking.log_runs(entries)  # the first job of a process also imports wandb (~1.5 s)
    tracking.wait()
    entries = [{**e, "run_dir": Path(str(e["run_dir"]) + "b")} for e in entries]  # a second job
    t = time.perf_counter()
    tracking.log_runs(entries)
    out["wandb_critical_s"] = time.perf_counter() - t
    tracking.wait()
    out["wandb_total_s"] = time.perf_counter() - t
    t = time.perf_counter()
    training.train(small, [None] * R, progress=False)
    out["chunk_train_s"] = time.perf_counter() - t
    shutil.rmtree(tmp / "w", ignore_errors=True)
    return out


TINY = ["data.K=4", "data.N=9", "model.M=16", "data.n_train=4", "data.n_test=4", "optim.steps=1", "wandb.mode=disabled"]


@contextlib.contextmanager
def kept_to_the_end():
    """A list for `first_line`'s and `grid_once`'s `keep`: the folders put in it are deleted when the block ends,
    not between grids. Creating a file or folder on this VM's ext4 (no journal) skips every inode freed in the
    last minutes (`recently_deleted`), one buffer lookup each, so deleting one grid's 10,000 right before the
    next put 5.6–6.0 CPU s of the next grid's ~19 into the kernel's inode search (perf, two grids), whichever
    tree it was."""
    kept: list = []
    try:
        yield kept
    finally:
        for folder in kept:
            shutil.rmtree(folder, ignore_errors=True)


def first_line(tree: Path, runs: int, keep: list | None = None) -> tuple[float, float]:
    """Seconds from process start to the first `training …` line of a `seed=range(0,runs)` grid of tiny runs,
    and the launcher's peak RSS (VmHWM) at that moment in MB; the process is then stopped, and its folder
    deleted, or left for the caller where `keep` (a list) is given."""
    import signal

    sweep = Path(tempfile.mkdtemp(prefix=f"rw-stream-{runs}-")) / "s"
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "launch.py", "-m", f"seed=range(0,{runs})", *TINY, f"hydra.sweep.dir={sweep}"],
                         cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, peak = float("nan"), float("nan")
    for line in p.stdout:
        if line.startswith("training "):
            wall = time.perf_counter() - t
            with open(f"/proc/{p.pid}/status") as fh:
                peak = next(int(x.split()[1]) for x in fh if x.startswith("VmHWM")) / 1024
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    if keep is None:
        shutil.rmtree(sweep.parent, ignore_errors=True)
    else:
        keep.append(sweep.parent)
    return wall, peak


def streaming(reps: int = 3) -> dict:
    """The first training line and the launcher's memory of a 100,000-run grid against a 1,000-run grid,
    measured side by side (alternating), medians of `reps`, the folders kept to the end (`kept_to_the_end`: the
    100,000-run grid makes its first chunk's folders before its first line, and right after a deletion each
    mkdir took ~0.3 ms of inode search, 2.3 of its ~10 s under cProfile)."""
    small, big = [], []
    with kept_to_the_end() as kept:
        for _ in range(reps):
            small.append(first_line(ROOT, 1000, kept))
            big.append(first_line(ROOT, 100000, kept))
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    return {"t_1k": med(small, 0), "t_100k": med(big, 0), "mb_1k": med(small, 1), "mb_100k": med(big, 1)}


def grid_once(root: Path, seeds: int, *extra: str, env: dict | None = None, keep: list | None = None) -> tuple[float, float]:
    """`python launch.py -m` on the §5 grid (10 values of p × `seeds` seeds) from the checkout `root`, in a folder
    deleted after, or left for the caller where `keep` (a list) is given: (wall seconds, CPU seconds of the
    launch and the processes it waited for)."""
    sweep = Path(tempfile.mkdtemp(prefix="rw-grid-")) / "s"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "launch.py", "-m", GRID, f"seed=range(0,{seeds})", *extra,
                        f"hydra.sweep.dir={sweep}"], cwd=root, capture_output=True, text=True,
                       env={**os.environ, "CI": "1", **(env or {})})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{root}/launch.py failed:\n{r.stderr[-2000:]}")
    if keep is None:
        shutil.rmtree(sweep.parent, ignore_errors=True)
    else:
        keep.append(sweep.parent)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def grid_against(tree: Path, seeds: int = 1000, reps: int = 1) -> tuple[tuple[float, float], tuple[float, float]]:
    """The §5 grid of 10 × `seeds` runs end to end, this tree and `tree` (another checkout of the project,
    e.g. the commit before a change) side by side: ((wall, CPU seconds) here, (wall, CPU seconds) there),
    medians of `reps`."""
    ours, theirs = [], []
    with kept_to_the_end() as kept:
        for _ in range(reps):
            for root, out in ((ROOT, ours), (tree, theirs)):
                out.append(grid_once(root, seeds, keep=kept))
    med = lambda xs: (statistics.median(w for w, _ in xs), statistics.median(c for _, c in xs))  # noqa: E731
    return med(ours), med(theirs)


def cpu_against(tree: Path, seeds: int = 100, reps: int = 2) -> dict:
    """The §5 grid of 10 × `seeds` runs end to end, this tree and `tree` alternating, with wandb offline and
    disabled, and here also offline without the sweep's analysis run (`wandb.analysis=false`, a key `tree` may
    not have): {(where, what): (wall seconds, CPU seconds of the launch and the processes it waited for), each
    the median of `reps` runs (with 2, their mean)}; every grid's folder kept to the end (`kept_to_the_end`)."""
    cases = [("offline", ["wandb.mode=offline"]), ("offline, no analysis run", ["wandb.mode=offline", "wandb.analysis=false"]),
             ("disabled", ["wandb.mode=disabled"])]
    out: dict = {}
    with kept_to_the_end() as kept:
        for _ in range(reps):
            for what, extra in cases:
                for where, root in (("here", ROOT), ("there", tree)):
                    if where == "there" and "wandb.analysis=false" in extra:
                        continue
                    out.setdefault((where, what), []).append(grid_once(root, seeds, *extra, keep=kept))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in out.items()}


def write_behind(seeds: int = 200, reps: int = 2) -> dict:
    """The §5 grid of 10 × `seeds` runs (wandb disabled) end to end, with each chunk's results written in
    turn and written behind (`hydra.launcher.write_behind`), with one training thread and with torch's
    default, alternating: {(threads, behind): median seconds}."""
    out: dict = {}
    for _ in range(reps):
        for threads in ("1", ""):
            for behind in ("false", "true"):
                wall, _ = grid_once(ROOT, seeds, "wandb.mode=disabled", f"hydra.launcher.write_behind={behind}",
                                    env={"RW_SWEEPS_THREADS": threads})
                out.setdefault((threads or "default", behind), []).append(wall)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one baseline run, no 10,000-run grid")
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--streaming", action="store_true", help="only the streaming ratios (100,000 against 1,000 runs)")
    ap.add_argument("--against", type=Path, help="another checkout: the 1,000-run grid's wall and CPU (wandb offline and "
                    "disabled, medians of 3) and the 10,000-run grid's, end to end, side by side")
    ap.add_argument("--write-behind", action="store_true", help="only results written behind against in turn")
    ap.add_argument("--all", action="store_true", help="with --against: every row of the speed table in one "
                    "invocation (the default run, then --streaming's and --against's rows; ~20 min here)")
    args = ap.parse_args()
    if args.all and not args.against:
        ap.error("--all needs --against CHECKOUT (the tree to compare the CPU rows with)")
    if args.all:
        args.streaming = True
    if args.write_behind:
        w = write_behind()
        for threads in ("1", "default"):
            a, b = w[(threads, "false")], w[(threads, "true")]
            print(f"2,000-run §5 grid, RW_SWEEPS_THREADS={threads}: in turn {a:.1f} s, written behind {b:.1f} s "
                  f"= {b / a:.2f}× the time in turn (medians of 2, alternating)")
        return
    if args.streaming or args.against:
        if args.streaming:
            s = streaming()
            print(f"streaming (tiny runs, medians of 3, side by side): first training line {s['t_1k']:.1f} s (1,000 runs) "
                  f"→ {s['t_100k']:.1f} s (100,000 runs) = {s['t_100k'] / s['t_1k']:.2f}× (bound 3×); launcher peak "
                  f"RSS {s['mb_1k']:.0f} MB → {s['mb_100k']:.0f} MB = {s['mb_100k'] / s['mb_1k']:.2f}× (bound 2×)")
        if args.against:
            c = cpu_against(args.against, reps=3)
            print(f"1,000-run §5 grid end to end, here and in {args.against} alternating (medians of 3 runs each; CPU: "
                  f"the launch and the processes it waited for):")
            for what in ("offline", "offline, no analysis run", "disabled"):
                here = c[("here", what)]
                # `tree` may have no analysis run to leave out: its offline grid is then the one to compare with
                there = c.get(("there", what)) or c[("there", "offline")]
                print(f"  wandb {what:<26} here {here[0]:.1f} s, CPU {here[1]:.1f} s; there {there[0]:.1f} s, CPU "
                      f"{there[1]:.1f} s → CPU {here[1] / there[1]:.2f}× theirs")
            (ow, oc), (tw, tc) = grid_against(args.against)
            print(f"10,000-run §5 grid end to end (defaults: wandb offline): {ow:.1f} s and {oc:.1f} CPU s here, {tw:.1f} s "
                  f"and {tc:.1f} CPU s in {args.against} = {ow / tw:.2f}× its time, {oc / tc:.2f}× its CPU")
        if not args.all:
            return
        print()
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    print(f"§5 shape: K=6 N=97 M=1000 n_train=n_test=1000 T=50, evaluation every step "
          f"(torch {torch.__version__}, {os.cpu_count()} cores, backend {os.environ.get('RW_SWEEPS_BACKEND', 'auto')})\n")
    b = baseline(1 if args.quick else args.baseline_runs)
    print(f"dense baseline, 1 run per process: {b['wall_s']:.1f} s per run ({b['runs_s']:.3f} runs/s), "
          f"peak {b['peak_mb']:.0f} MB")
    d = breakdown(tmp)  # first: the grids' 13,000 folders load this VM's file system for a while
    print("\nend to end, `python launch.py -m` (process start → every result on disk), wandb offline:")
    cpu: list = []
    zero = front_door(tmp, 100, cpu=cpu)
    print(f"  1,000 runs, zero init            {zero:6.1f} s = {1000 / zero:6.1f} runs/s = "
          f"{1000 / zero / b['runs_s']:5.0f}× the baseline")
    gauss = front_door(tmp, 100, "init=gaussian", "init.sigma=0.01", cpu=cpu)
    print(f"  1,000 runs, Gaussian σ=0.01      {gauss:6.1f} s = {gauss / zero:.2f}× zero init "
          f"({cpu[1] / cpu[0]:.2f}× its CPU)")
    off = front_door(tmp, 100, "wandb.mode=disabled")
    print(f"  1,000 runs, wandb disabled       {off:6.1f} s (wandb offline costs {zero - off:+.1f} s)")
    if not args.quick:
        big = front_door(tmp, 1000)
        print(f"  10,000 runs, zero init           {big:6.1f} s = {big / zero:.1f}× the 1,000-run grid = "
              f"{10000 / big / b['runs_s']:5.0f}× the baseline")
    print(f"\nper-run breakdown (in process, chunks of {d['chunk']} runs as the packed launcher cuts them here):")
    print(f"  imports (torch, Hydra, the app)       {d['imports_s']:8.2f} s once per process")
    print(f"  planning (Planner.plan)               {d['planning_us']:8.0f} µs per run   (goal ≤ {GOALS['planning']})")
    print(f"  data (make_batches)                   {d['data_us']:8.0f} µs per run and split   (goal ≤ {GOALS['data']})")
    print(f"  training step (fused)                 {d['step_us']:8.1f} µs per run, × 50 steps")
    print(f"  evaluation (test set, every metric)   {d['eval_us']:8.1f} µs per run, × 51 = "
          f"{d['eval_us'] / d['step_us']:.2f}× a training step")
    writing = d["results_us"] + d["envelope_us"]
    print(f"  writing: run folder                   {d['results_us']:8.0f} µs per run")
    print(f"           Hydra envelope (.hydra/, log){d['envelope_us']:8.0f} µs per run")
    print(f"           the file system's own share  {d['fs_floor_us']:8.0f} µs per run (the same 2 folders and 8 files "
          f"with bare os calls): {writing - d['fs_floor_us']:.0f} µs above it   (goal ≤ {GOALS['writing']})")
    print(f"  wandb, one packed job of {d['chunk']} runs     {d['wandb_critical_s']:8.3f} s on the critical path, "
          f"{d['wandb_total_s']:.2f} s in the background = {d['wandb_critical_s'] / d['chunk_train_s']:.1%} of "
          f"its {d['chunk_train_s']:.1f} s of training")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
