"""The sweep store (`rw_sweeps.core.store`) measured: its files, its launches, its writer, a million runs read back.

    python benchmarks/bench_store.py --against ../before-the-store   # every section (~17 min here; the first time
                                                                     # also ~10 min to write the million-run store)
    python benchmarks/bench_store.py --quick --against ../before-the-store   # smaller sizes, one round (~8 min)
    python benchmarks/bench_store.py --section writer                # one section (repeatable): inodes | grid |
                                                                     # writer | million

`--against` is another checkout of the project (a git worktree of the commit before the store, sharing this
virtualenv: its `launch.py` imports the package from its own folder); the grid section needs it, the inodes
section counts its folder layout where it is given.

1. inodes: a sweep of tiny runs (`bench_sweep.TINY`: K=4, N=9, M=16, 4 training and 4 test sequences, one step,
   wandb disabled) launched with the defaults, so it is stored; every entry under its folder counted, and larger
   sweeps projected by the launcher's packing rule (a job writes the same files whatever its size; the jobs are
   what grows): of this shape, of §5 runs on a CPU (fewer runs a job) and in 4,096-run shards (a GPU's jobs).
   The same shape's folder layout from `--against`, 1,000 runs counted, projected by run.
2. grid: the 1,000-run §5 grid end to end (`bench_sweep.grid_once`), here stored, here as run folders
   (`hydra.launcher.store=false`: the store's own share, apart from every other change since `--against`) and in
   `--against`, in turn (the order rotated each round), with wandb offline (the default) and disabled; medians;
   and against the one-process-per-run dense baseline (`bench_sweep.baseline`).
3. writer: the records of real §5 runs (50 steps, 51 history rows, the summary a launch writes) through the
   project's `Writer` (the contract's judgement, the runs-table row, the shard's Parquet and seal, the atomic
   writes), runs per second; alternating with the same records written as run folders (`results.write_run`,
   `write_summary`; the Hydra envelope not included); where one more write's time goes, under cProfile.
4. million: a store of 1,000,000 runs (10 values of p × zero/Gaussian init × 50,000 seeds), each a copy of one of
   20 real runs with its own seed and run id, written by one `Writer`, 4,096 runs a `write` (a shard each: every
   record judged, its row, Parquet, seal and files; ~10 min); kept in `--million-dir` and reused while it
   verifies. Then, each in a fresh process,
   alternating: the store read by its own primitives (`store.index`, every head's table, one run's body) and by
   the analysis (`load_runs`, `add_success` + `phase_diagram`, `load_history`), each step's wall time and the
   process's peak RSS (VmHWM) after it.

Every ratio is between two measurements of the same invocation: this VM's speed drifts ~2× over minutes, and
other work shares its two cores.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import json
import os
import pstats
import random
import re
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

import bench_sweep  # noqa: E402 - the grid, its launch and the dense baseline: one owner

SECTIONS = ("inodes", "grid", "writer", "million")
MILLION = 1_000_000
GOALS = {"entries_per_run": 0.01, "grid_speedup": 2.0, "grid_vs_baseline": 500, "writer_runs_s": 5000,
         "load_s": 10.0, "load_gb": 4.0, "phase_s": 30.0, "history_s": 1.0}
P_VALUES = [round(0.05 + 0.1 * i, 2) for i in range(10)]  # the §5 grid's p (bench_sweep.GRID)
INITS = ("zero", "gaussian")


# ------------------------------------------------------------------------------------------ helpers
def entries(folder: Path) -> dict[str, int]:
    """Every entry under `folder` (folders, files, links; not `folder` itself), by its top-level name's kind:
    `store`, numbered run folders (`runs`), and each other top-level name."""
    out: dict[str, int] = {}
    for top in os.scandir(folder):
        kind = "store" if top.name == "store" else "runs" if top.name.isdigit() else top.name
        n = 1
        if top.is_dir(follow_symlinks=False):
            n += sum(len(ds) + len(fs) for _, ds, fs in os.walk(top.path))
        out[kind] = out.get(kind, 0) + n
    return out


def launch(tree: Path, sweep: Path, *overrides: str) -> tuple[float, str]:
    """`python launch.py -m OVERRIDES` in checkout `tree` into `sweep`: (wall seconds, its output)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "launch.py", "-m", *overrides, f"hydra.sweep.dir={sweep}"], cwd=tree,
                       capture_output=True, text=True, env={**os.environ, "CI": "1"})
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{tree}/launch.py failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    return wall, r.stdout + r.stderr


DONE = r"""
import json, sys
from rw_sweeps.core import store
idx = store.index(sys.argv[1])
print(json.dumps({"done": sum(v[-1] == "done" for v in idx.runs.values()), "refused": idx.refused}))
"""


def done_here(sweep: Path) -> int:
    """Runs the contract finds done in a sweep of this checkout, its store's and its folders': asked of a fresh
    process, so that the tree's code as it is now reads what its launch wrote."""
    r = subprocess.run([sys.executable, "-c", DONE, str(sweep)], cwd=ROOT, capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    if got["refused"]:
        print(f"  {sweep}: {len(got['refused'])} store file(s) refused, e.g. {next(iter(got['refused'].items()))}")
    return got["done"] + done_in_folders(sweep)


def done_in_folders(sweep: Path) -> int:
    return sum(json.loads(p.read_text()).get("status") == "done" for p in sweep.glob("*/summary.json"))


def jobs_of(output: str) -> list[int]:
    """The runs of each job a packed launch announced (`job 2/4: 2992 run(s), …`)."""
    return [int(m.group(1)) for m in re.finditer(r"^job \d+/\d+: (\d+) run\(s\)", output, re.M)]


def projected_jobs(n: int, cap: int) -> int:
    """Jobs of an n-run sweep of one shape on a CPU, by the launcher's packing rule (`packing.chunks`): the first
    `packing.FIRST_RUNS` runs cut on their own, each part in balanced chunks of at most `cap` runs."""
    from rw_sweeps.sweeps.packing import FIRST_RUNS, chunk_sizes

    return len(chunk_sizes(min(n, FIRST_RUNS), 1, cap)) + len(chunk_sizes(n - FIRST_RUNS, 1, cap))


def cpu_cap(cfg) -> int:
    """Runs a CPU job of this config holds at most (`hydra.launcher.memory_gb` null)."""
    from rw_sweeps.core.resources import bytes_per_run
    from rw_sweeps.sweeps.packing import CPU_CHUNK_GB, CPU_MAX_RUNS, GB

    return min(CPU_MAX_RUNS, max(1, int(CPU_CHUNK_GB * GB // bytes_per_run(cfg))))


def table(rows: list[tuple], head: tuple) -> None:
    """Print `rows` under `head`, columns padded."""
    cells = [tuple(str(c) for c in r) for r in [head, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


# ------------------------------------------------------------------------------------------ 1. inodes
def inodes(against: Path | None, runs: int) -> None:
    """A stored sweep's entries, counted and projected; the folder layout's from `against`."""
    from rw_sweeps.core.config import RunConfig, validate
    from rw_sweeps.core.store.writer import SHARD_RUNS

    print(f"## 1. inodes: a sweep of tiny runs ({' '.join(bench_sweep.TINY)}), launched with the defaults\n")
    rows = []
    with bench_sweep.kept_to_the_end() as kept:
        base = None
        if against is not None:
            folder = Path(tempfile.mkdtemp(prefix="rw-inodes-base-"))
            kept.append(folder)
            wall_b, _ = launch(against, folder / "s", "seed=range(0,1000)", *bench_sweep.TINY)
            assert done_in_folders(folder / "s") == 1000, "the baseline's sweep is not 1,000 done runs"
            base = entries(folder / "s")
        folder = Path(tempfile.mkdtemp(prefix="rw-inodes-"))
        kept.append(folder)
        wall, out = launch(ROOT, folder / "s", f"seed=range(0,{runs})", *bench_sweep.TINY)
        counted = entries(folder / "s")
        assert "store" in counted and done_here(folder / "s") == runs, f"not {runs} stored done runs"
        job_files = sum(bool(re.match(r"w[0-9a-f]{12}", n)) for n in os.listdir(folder / "s" / "store"))
    jobs = jobs_of(out)
    assert sum(jobs) == runs, f"the launch announced {sum(jobs)} runs in jobs, not {runs}"
    total = sum(counted.values())
    # a job's files are named by its writer's id; the rest (the sweep's files, the store's own) are fixed
    per_job, fixed = job_files / len(jobs), total - job_files
    cap = max(jobs)  # the largest job measured: at most the launcher's cap, so the projections count jobs high
    rows.append((f"here, {runs:,} runs (measured, {wall:.0f} s)", len(jobs), total, f"{total / runs:.5f}",
                 "  ".join(f"{k} {v}" for k, v in sorted(counted.items()))))
    for n in sorted({100_000, MILLION} - {runs}):
        j = projected_jobs(n, cap)
        e = round(fixed + j * per_job)
        rows.append((f"here, {n:,} runs (projected)", j, e, f"{e / n:.5f}", f"jobs of ≤ {cap:,} runs, "
                     f"{per_job:g} files a job"))
    cap5 = cpu_cap(validate(RunConfig()))
    for n in (100_000, MILLION):  # a real shape: a CPU job holds fewer runs, so there are more jobs
        j = projected_jobs(n, cap5)
        e = round(fixed + j * per_job)
        rows.append((f"here, {n:,} §5 runs on a CPU (projected)", j, e, f"{e / n:.5f}", f"jobs of ≤ {cap5:,} runs"))
    for n in (100_000, MILLION):  # the fewest jobs: a GPU job of ≥ SHARD_RUNS runs writes a shard each SHARD_RUNS
        j = -(-n // SHARD_RUNS)
        e = round(fixed + j * per_job)
        rows.append((f"here, {n:,} runs in {SHARD_RUNS:,}-run shards (projected)", j, e, f"{e / n:.5f}",
                     "a GPU's jobs, one shard each"))
    if base is not None:
        per_run = base.get("runs", 0) / 1000
        other = sum(base.values()) - base.get("runs", 0)
        rows.append((f"{against.name}, 1,000 runs (measured, {wall_b:.0f} s)", "-", sum(base.values()),
                     f"{sum(base.values()) / 1000:.3f}", "  ".join(f"{k} {v}" for k, v in sorted(base.items()))))
        for n in sorted({runs, 100_000, MILLION}):
            rows.append((f"{against.name}, {n:,} runs (projected)", "-", f"{round(other + n * per_run):,}",
                         f"{per_run:.3f}", f"{per_run:g} entries a run folder"))
    table(rows, ("sweep", "jobs", "entries", "a run", "where"))
    at = {r[0]: r[2] for r in rows}
    tiny = at[next(k for k in at if k.startswith("here, 100,000 runs"))]
    s5 = at["here, 100,000 §5 runs on a CPU (projected)"]
    print(f"\n  goal: ≤ {GOALS['entries_per_run']} entries a run (≤ 1,000 for 100,000 runs): tiny runs "
          f"{verdict(tiny / 100_000 <= GOALS['entries_per_run'])} ({tiny:,} at 100,000); §5 runs on a CPU "
          f"{verdict(s5 / 100_000 <= GOALS['entries_per_run'])} ({s5:,} projected at 100,000)")


# ------------------------------------------------------------------------------------------ 2. grid
GRID_CASES = (("wandb offline", ()), ("wandb disabled", ("wandb.mode=disabled",)))  # the default first: the goals'


def grid(against: Path, rounds: int, baseline_runs: int) -> None:
    """The 1,000-run §5 grid end to end, here (stored), here as run folders (`hydra.launcher.store=false`: the
    store's own share, apart from every other change since `against`) and in `against`, in turn (the order
    rotated each round), with wandb offline (the default, which the goals are for) and disabled (what the store
    changes where wandb's own files are not written); the dense baseline."""
    trees = (("here", "here (the store)", ROOT, ()),
             ("folders", "here, store=false (run folders)", ROOT, ("hydra.launcher.store=false",)),
             ("there", f"{against.name} (run folders)", against, ()))
    print(f"## 2. the 1,000-run §5 grid end to end (bench_sweep.grid_once): here stored, here as run folders and in "
          f"{against}, in turn, {rounds} round(s) each with wandb offline (the default) and disabled\n")
    b = bench_sweep.baseline(baseline_runs)
    out: dict[tuple, list] = {}
    with bench_sweep.kept_to_the_end() as kept:
        for i in range(rounds):
            for case, extra in GRID_CASES:
                for where, _, root, more in trees[i % 3:] + trees[:i % 3]:
                    wall, cpu = bench_sweep.grid_once(root, 100, *extra, *more, keep=kept)
                    sweep = kept[-1] / "s"
                    done = done_here(sweep) if root == ROOT else done_in_folders(sweep)
                    assert done == 1000, f"{where}, {case}: {done} of 1,000 runs done"
                    assert (where == "here") == (sweep / "store").is_dir(), f"{where}, {case}: stored or not, wrongly"
                    out.setdefault((case, where), []).append((wall, cpu, entries(sweep), jobs_in_store(sweep)))
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in out.items()}
    rows = []
    for case, _ in GRID_CASES:
        for where, name, _, _ in trees:
            runs = out[(case, where)]
            e = runs[-1][2]
            rows.append((f"{case}: {name}", ", ".join(f"{x[0]:.1f}" for x in runs), f"{med[(case, where)][0]:.1f}",
                         f"{med[(case, where)][1]:.1f}", f"{1000 / med[(case, where)][0]:.1f}",
                         f"{1000 * b['wall_s'] / med[(case, where)][0]:,.0f}×", sum(e.values()),
                         "  ".join(f"{k} {v}" for k, v in sorted(e.items()))))
    table(rows, ("grid, tree", "wall s (each)", "median s", "CPU s", "runs/s", "× baseline", "entries", "where"))
    print(f"\n  dense baseline, one process per run: {b['wall_s']:.1f} s a run (median of {baseline_runs}), "
          f"peak {b['peak_mb']:.0f} MB")
    for case, _ in GRID_CASES:
        here = med[(case, "here")]
        for other, name in (("there", against.name), ("folders", "store=false here")):
            them = med[(case, other)]
            pair = [t[0] / h[0] for h, t in zip(out[(case, "here")], out[(case, other)])]
            goal = f" — goal ≥ {GOALS['grid_speedup']}×: {verdict(them[0] / here[0] >= GOALS['grid_speedup'])}" \
                if case == GRID_CASES[0][0] and other == "there" else ""
            print(f"  {case}: the store {them[0] / here[0]:.2f}× faster than {name} by the medians (rounds: "
                  f"{', '.join(f'{r:.2f}×' for r in pair)}); {them[1] / here[1]:.2f}× less CPU{goal}")
    ratio = 1000 * b["wall_s"] / med[(GRID_CASES[0][0], "here")][0]
    print(f"  {GRID_CASES[0][0]}, the store against the dense baseline: {ratio:,.0f}× its runs/s — goal ≥ "
          f"{GOALS['grid_vs_baseline']}×: {verdict(ratio >= GOALS['grid_vs_baseline'])}")
    last = out[(GRID_CASES[0][0], "here")][-1]
    jobs, wandb_files = last[3], last[2].get("wandb_jobs", 0)
    if jobs and wandb_files:
        from rw_sweeps.core.config import RunConfig, validate

        j = projected_jobs(MILLION, cpu_cap(validate(RunConfig())))
        print(f"  wandb offline's own files: {wandb_files} entries in wandb_jobs/ for {jobs} jobs, "
              f"{wandb_files / jobs:.0f} a job; a 1,000,000-run §5 sweep on a CPU ({j:,} jobs) would hold "
              f"~{round(j * wandb_files / jobs):,} of them = {j * wandb_files / jobs / MILLION:.3f} a run")


def jobs_in_store(sweep: Path) -> int:
    """The jobs that wrote a sweep's store (its files are named by their writer's id, `w<12 hex>`)."""
    folder = sweep / "store"
    return len({re.match(r"w[0-9a-f]{12}", n).group(0) for n in os.listdir(folder) if re.match(r"w[0-9a-f]{12}", n)}) \
        if folder.is_dir() else 0


# ------------------------------------------------------------------------------------------ records
_RECORDS: list = []


def real_records() -> list[tuple]:
    """20 real §5 runs (the grid's 10 values of p × zero and Gaussian σ=0.01 init, 50 steps, evaluation every
    step), trained once per invocation: [(config, summary as a launch writes it, history, snapshots)]."""
    if _RECORDS:
        return _RECORDS
    from rw_sweeps.core import training
    from rw_sweeps.core.config import RunConfig, option_config, validate
    from rw_sweeps.sweeps import run

    off = dataclasses.replace(RunConfig().wandb, mode="disabled")
    cfgs = [validate(RunConfig(init=option_config("init", init, **({"sigma": 0.01} if init == "gaussian" else {})),
                               data=dataclasses.replace(RunConfig().data, p=p), wandb=off))
            for init in INITS for p in P_VALUES]
    with tempfile.TemporaryDirectory() as tmp:
        recs = training.train(cfgs, [Path(tmp, str(i)) for i in range(len(cfgs))], progress=False)
        for rec in recs:
            summary = {**training.summary(rec, 0.5), **run.provenance()}
            _RECORDS.append((rec.cfg, summary, rec.history, rec.snapshots))
    return _RECORDS


def entries_for(sweep: Path, n: int) -> list[dict]:
    """n writer entries in `sweep`, run i a copy of real record i % 20 with seed i // 20 (and its own run id)."""
    from rw_sweeps.core.config import with_seed
    from rw_sweeps.core.results import run_id

    recs = real_records()
    out = []
    for i in range(n):
        cfg, summary, history, snapshots = recs[i % len(recs)]
        run_dir = sweep / str(i)
        out.append({"cfg": with_seed(cfg, i // len(recs)).to_dict(), "run_dir": run_dir, "history": history,
                    "snapshots": snapshots, "summary": {**summary, "seed": i // len(recs), "run_id": run_id(run_dir)}})
    return out


def overrides_of(name: str) -> list[str]:
    """The overrides a launch of the million-run grid gives run `name` (its p, init and seed)."""
    i = int(name)
    k = i % (len(P_VALUES) * len(INITS))
    return [f"data.p={P_VALUES[k % len(P_VALUES)]}", f"init={INITS[k // len(P_VALUES)]}", f"seed={i // 20}"]


# ------------------------------------------------------------------------------------------ 3. writer
def write_store(sweep: Path, batch: list[dict]) -> None:
    from rw_sweeps.core.store import Writer

    names = [e["run_dir"].name for e in batch]
    job = Writer(sweep, names, overrides={n: overrides_of(n) for n in names})
    refused = job.write(batch)
    job.close()
    assert not refused, f"the writer refused {len(refused)} record(s): {next(iter(refused.values()))}"


def write_folders(batch: list[dict]) -> None:
    from rw_sweeps.core import results

    for e in batch:
        results.write_run(e["run_dir"], e["cfg"], e["history"], e["snapshots"])
        results.write_summary(e["run_dir"], e["summary"])


def writer(runs: int, folder_runs: int, reps: int) -> None:
    """Runs a second through the store's writer, against the same records as run folders, alternating."""
    from rw_sweeps.core import store

    _, _, history, snapshots = real_records()[0]
    print(f"## 3. the writer: records of real §5 runs ({len(history)} history rows, {len(snapshots)} snapshots) "
          f"through store.Writer, {runs:,} runs a write; run folders ({folder_runs:,} runs a write) alternating, "
          f"{reps} rounds\n")
    ours, theirs = [], []
    with bench_sweep.kept_to_the_end() as kept:
        for r in range(reps):
            sweep = Path(tempfile.mkdtemp(prefix="rw-writer-")) / "s"
            kept.append(sweep.parent)
            batch = entries_for(sweep, runs)
            t = time.perf_counter()
            write_store(sweep, batch)
            ours.append(time.perf_counter() - t)
            idx = store.index(sweep)
            assert len(idx.runs) == runs and not idx.refused and all(s == "done" for _, _, s in idx.runs.values())
            folder = Path(tempfile.mkdtemp(prefix="rw-folders-")) / "s"
            kept.append(folder.parent)
            batch = entries_for(folder, folder_runs)
            folder.mkdir()
            t = time.perf_counter()
            write_folders(batch)
            theirs.append(time.perf_counter() - t)
        sizes = {kind: p.stat().st_size for p in (sweep / "store").iterdir() for kind in (".runs", ".body")
                 if p.name.endswith(kind + ".parquet")}
        steps, top = profiled(Path(tempfile.mkdtemp(prefix="rw-writer-prof-")) / "s", runs, kept)
    s_us = statistics.median(ours) / runs * 1e6
    f_us = statistics.median(theirs) / folder_runs * 1e6
    table([("store.Writer.write", ", ".join(f"{t:.2f}" for t in ours), f"{s_us:.0f}", f"{1e6 / s_us:,.0f}"),
           ("run folders (write_run, write_summary)", ", ".join(f"{t:.2f}" for t in theirs), f"{f_us:.0f}",
            f"{1e6 / f_us:,.0f}")], ("path", "s a write (each)", "µs a run", "runs/s"))
    print(f"\n  the store {f_us / s_us:.1f}× the run folders' runs/s; one shard's head "
          f"{sizes.get('.runs', 0) / 1e6:.2f} MB "
          f"and body {sizes.get('.body', 0) / 1e6:.2f} MB (the last write's last shard)")
    print(f"  goal ≥ {GOALS['writer_runs_s']:,} runs/s: {verdict(1e6 / s_us >= GOALS['writer_runs_s'])}\n")
    print(f"  where a write's time goes (cProfile, one more write of {runs:,} runs; cumulative s, share of the write):")
    total = steps.pop("store.Writer.write")
    table([(k, f"{v:.2f}", f"{v / total:.0%}") for k, v in steps.items()]
          + [("store.Writer.write (all)", f"{total:.2f}", "100%")], ("step", "s", "share"))
    print("\n  cProfile's top entries of that write by own time:")
    table(top, ("function", "calls", "own s", "cumulative s"))


PROFILED = [  # (label, file ending, function or its names over time): the steps of a write, by cumulative time
    ("contract.judge_record: the record judged", "core/contract.py", "judge_record"),
    ("  its history and snapshot rows parsed and checked", "core/contract.py", "_done_files"),
    ("  its config checked (config_problem)", "core/contract.py", "config_problem"),
    ("results.jsonl: history and snapshots as JSONL text", "core/results.py", ("jsonl", "_jsonl")),
    ("Writer._flush: a shard made and written", "store/writer.py", "_flush"),
    ("  table.run_row: the runs-table rows", "core/table.py", "run_row"),
    ("  shard.encode: Parquet and the seal", "store/shard.py", "encode"),
    ("  safefs.atomic_write: the two files", "core/safefs.py", "atomic_write"),
    ("store.Writer.write", "store/writer.py", "write"),
]


def profiled(sweep: Path, runs: int, kept: list) -> tuple[dict[str, float], list[tuple]]:
    """One write under cProfile: the cumulative seconds of each of its steps (`PROFILED`), and the top 12
    entries by own time as table rows."""
    kept.append(sweep.parent)
    batch = entries_for(sweep, runs)
    prof = cProfile.Profile()
    prof.enable()
    write_store(sweep, batch)
    prof.disable()
    st = pstats.Stats(prof)
    steps = {label: sum(v[3] for (f, _, name), v in st.stats.items() if name in (fn if isinstance(fn, tuple) else (fn,))
                        and f.endswith(ending)) for label, ending, fn in PROFILED}
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]
    return steps, [(f"{Path(f).parent.name}/{Path(f).name}:{line}({name})" if f != "~" else name, v[1], f"{v[2]:.3f}",
                    f"{v[3]:.3f}") for (f, line, name), v in top]


# ------------------------------------------------------------------------------------------ 4. million
class _Overrides(dict):
    """A writer's overrides by run name, made when asked (a million lists held at once are ~300 MB)."""

    def get(self, name, default=None):
        return overrides_of(name)


def build_million(sweep: Path, n: int) -> float:
    """A store of n runs in `sweep`, one `Writer` writing 4,096 runs a call (a shard each), every record judged
    (see the module's doc): seconds."""
    from rw_sweeps.core.results import run_id
    from rw_sweeps.core.store import Writer
    from rw_sweeps.core.store.writer import SHARD_RUNS

    recs = [(cfg.to_dict(), summary, history, snapshots) for cfg, summary, history, snapshots in real_records()]
    shutil.rmtree(sweep, ignore_errors=True)
    t = time.perf_counter()
    job = Writer(sweep, [str(i) for i in range(n)], overrides=_Overrides())
    rng = random.Random(0)
    for start in range(0, n, SHARD_RUNS):
        batch = []
        for i in range(start, min(n, start + SHARD_RUNS)):
            cfg, summary, history, snapshots = recs[i % len(recs)]
            seed, run_dir = i // len(recs), sweep / str(i)
            batch.append({"cfg": {**cfg, "seed": seed}, "run_dir": run_dir, "history": history, "snapshots": snapshots,
                          "summary": {**summary, "seed": seed, "run_id": run_id(run_dir),
                                      "wall_s": rng.uniform(0.5, 2.0)}})
        refused = job.write(batch)
        assert not refused, f"the writer refused {len(refused)} record(s): {next(iter(refused.values()))}"
    job.close()
    return time.perf_counter() - t


CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
sweep, name, what = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
def peak():  # GB: VmHWM, this process's own (ru_maxrss keeps the forking parent's peak across exec)
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("VmHWM")) / 2**20
def step(label, fn):
    t = time.perf_counter(); v = fn(); out[label] = (time.perf_counter() - t, peak()); return v
if what == "store":
    import pyarrow as pa
    from rw_sweeps.core import store
    from rw_sweeps.core.store import shard
    out["imports"] = (time.perf_counter() - t0, peak())
    try:  # the heads alone, each body's hash left to its reader (where this version can)
        step("store.index(bodies=False): heads verified", lambda: store.index(sweep, bodies=False))
    except TypeError:
        pass
    idx = step("store.index: heads verified, bodies hashed", lambda: store.index(sweep))
    out["runs"] = len(idx.runs); out["refused"] = len(idx.refused)
    def heads():
        book = [c for c in shard.BOOK if c != "_run"]
        ts = [shard.read_head(raw).drop_columns(book) for raw, _ in idx.heads.values()]
        return pa.concat_tables(ts, promote_options="default").to_pandas()
    df = step("every head's table → pandas", heads)
    out["rows"] = len(df)
    rows = step("store.body_rows: one run", lambda: store.body_rows(sweep, [name]))
    out["history_rows"] = len(rows[name][0])
else:
    from analysis import load_runs, load_history, phase_diagram, add_success
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    out["imports"] = (time.perf_counter() - t0, peak())
    df = step("load_runs", lambda: load_runs(sweep, progress=False))
    out["rows"] = len(df)
    if len(df):
        fig = step("add_success + phase_diagram(data.p, init)",
                   lambda: phase_diagram(add_success(df), "data.p", "init"))
        out["cells"] = len(fig.phase_table); plt.close(fig)
        h = step("load_history: one run", lambda: load_history(df[df["run"] == name]))
        out["history_rows"] = len(h)
print("RESULT " + json.dumps(out))
"""


def child(sweep: Path, name: str, what: str) -> dict:
    """One fresh process reading the million-run store (`what`: store or analysis): its timings and peaks, and
    `error` where it failed (its last line; with the steps it had reported where it failed after them)."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(sweep), name, what], cwd=ROOT, capture_output=True, text=True)
    out = json.loads(r.stdout.split("RESULT ", 1)[1]) if "RESULT " in r.stdout else {}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1][:160]
        out["error"] = f"exit {r.returncode}{' after its last step' if out else ''}: {last}"
    return out


def million(sweep: Path, n: int, reps: int, rebuild: bool) -> None:
    """A million-run store written, then read back in fresh processes, alternating the store's own
    primitives and the analysis."""
    from rw_sweeps.core import store
    from rw_sweeps.core.store.writer import SHARD_RUNS

    print(f"## 4. a store of {n:,} runs ({len(P_VALUES)} values of p × zero/Gaussian init × {n // 20:,} seeds, each a "
          f"copy of a real §5 run) in {sweep}\n")
    ok = False
    if not rebuild and store.present(sweep):
        idx = store.index(sweep)
        ok = len(idx.runs) == n and not idx.refused
    if ok:
        print("  the store was built earlier and verifies: reused (--rebuild to write it again)")
    else:
        s = build_million(sweep, n)
        print(f"  written by Writer.write, {SHARD_RUNS:,} runs a call, in {s:.0f} s = {n / s:,.0f} runs/s")
    files = list((sweep / "store").iterdir())
    heads = [f for f in files if f.name.endswith(".runs.parquet")]
    print(f"  {len(files)} files: {len(heads)} shards, heads {sum(f.stat().st_size for f in heads) / 1e6:.0f} MB, "
          f"bodies "
          f"{sum(f.stat().st_size for f in files if f.name.endswith('.body.parquet')) / 1e9:.2f} GB\n")
    name = str(n - 12_345)  # a run in the middle of a shard
    got: dict[str, list[dict]] = {"store": [], "analysis": []}
    for r in range(reps):
        for what in (("store", "analysis") if r % 2 == 0 else ("analysis", "store")):
            got[what].append(child(sweep, name, what))
    rows = []
    for what in ("store", "analysis"):
        runs = got[what]
        for x in runs:
            if "error" in x:
                rows.append((f"{what}: a process FAILED", x["error"], "", "", ""))
        runs = [x for x in runs if "rows" in x]
        if not runs:
            continue
        for label in [k for k, v in runs[0].items() if isinstance(v, list)]:
            walls = [x[label][0] for x in runs if label in x]
            rows.append((f"{what}: {label}", ", ".join(f"{w:.2f}" for w in walls), f"{statistics.median(walls):.2f}",
                         f"{max(x[label][1] for x in runs if label in x):.2f}", ""))
        rows.append((f"{what}: rows read", runs[0].get("rows"), "", "", f"history rows {runs[0].get('history_rows')}"
                     + (f", {runs[0]['cells']} cells" if "cells" in runs[0] else "")))
    table(rows, ("step (a fresh process each)", "s (each)", "median s", "peak RSS GB", ""))
    a = [x for x in got["analysis"] if "load_history: one run" in x or ("rows" in x and not x["rows"])]
    if not a:
        print("\n  the analysis failed on the store every time: the goals are not measured")
        return
    if not a[0]["rows"]:
        print("\n  load_runs reads no stored runs yet (0 rows): its goals are not measured; the store's own rows above "
              "are what it would read")
        return
    med = lambda k: statistics.median(x[k][0] for x in a)  # noqa: E731
    rss = max(x["load_runs"][1] for x in a)
    print(f"\n  goals: load_runs ≤ {GOALS['load_s']:g} s {verdict(med('load_runs') <= GOALS['load_s'])} "
          f"({med('load_runs'):.1f} s), peak RSS ≤ {GOALS['load_gb']:g} GB {verdict(rss <= GOALS['load_gb'])} "
          f"({rss:.2f} GB), "
          f"phase diagram ≤ {GOALS['phase_s']:g} s "
          f"{verdict(med('add_success + phase_diagram(data.p, init)') <= GOALS['phase_s'])}, one history ≤ "
          f"{GOALS['history_s']:g} s {verdict(med('load_history: one run') <= GOALS['history_s'])} "
          f"({med('load_history: one run'):.2f} s); rows {a[0]['rows']:,} of {n:,}")


# ------------------------------------------------------------------------------------------ main
def header() -> None:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--short").splitlines()
    print(f"bench_store {datetime.datetime.now():%Y-%m-%d %H:%M}, {git('rev-parse', '--short', 'HEAD')}"
          f"{f' + {len(dirty)} changed file(s) in the tree' if dirty else ''}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10,000 runs for the inodes, one grid round and baseline "
                    "run, 2,000-run writes, a 100,000-run store")
    ap.add_argument("--against", type=Path, help="a checkout of the project before the store (inodes, grid)")
    ap.add_argument("--section", choices=SECTIONS, action="append",
                    help="one section (repeat for several); all by default")
    ap.add_argument("--rounds", type=int, help="grid rounds, each here stored, here as folders and --against "
                    "(default 3; 1 with --quick)")
    ap.add_argument("--baseline-runs", type=int, help="dense baseline runs of the grid section (default 2; 1 with "
                    "--quick)")
    ap.add_argument("--million-dir", type=Path, help="where the million-run store is kept (default: under the temp "
                    "dir)")
    ap.add_argument("--rebuild", action="store_true", help="write the million-run store again even if it verifies")
    args = ap.parse_args()
    sections = args.section or list(SECTIONS)
    if "grid" in sections and args.against is None:
        ap.error("the grid section needs --against CHECKOUT (the tree before the store)")
    if args.against is not None and not (args.against / "launch.py").is_file():
        ap.error(f"--against {args.against}: no launch.py there")
    q = args.quick
    header()
    started = time.perf_counter()
    for s in sections:
        t = time.perf_counter()
        if s == "inodes":
            inodes(args.against, 10_000 if q else 100_000)
        elif s == "grid":
            grid(args.against.resolve(), args.rounds or (1 if q else 3), args.baseline_runs or (1 if q else 2))
        elif s == "writer":
            writer(2_000 if q else 10_000, 200 if q else 1_000, 3)
        elif s == "million":
            n = 100_000 if q else MILLION
            where = args.million_dir or Path(tempfile.gettempdir(), f"rw-bench-store-{n}")
            million(where, n, 2 if q else 3, args.rebuild)
        else:
            raise ValueError(f"no section {s!r}")
        print(f"\n  ({s}: {time.perf_counter() - t:.0f} s)\n")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
