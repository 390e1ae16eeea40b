"""Time `analysis.load_runs` on a synthetic 10,000-run sweep: cold (no cache), warm (cache
fresh), and after 100 runs were added. Target: under 10 s on the 2-core dev machine.

    python benchmarks/bench_load.py [--runs 10000] [--dir /tmp/bench-sweep]
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._fake_runs import write_run    # noqa: E402
from analysis.load import CACHE_NAME, load_runs   # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, help="sweep folder to (re)use; default: a temp folder")
    args = ap.parse_args()
    sweep = args.dir or Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    n_old = len(list(sweep.glob("[0-9]*"))) if sweep.exists() else 0
    if n_old != args.runs:
        shutil.rmtree(sweep, ignore_errors=True)
        t = time.perf_counter()
        for i in range(args.runs):
            write_run(sweep / str(i), p=round(i % 11 / 10, 1), sigma=10.0 ** -(i % 5),
                      init="gaussian" if i % 2 else "zero", seed=i // 110, light=True)
        print(f"wrote {args.runs} runs in {time.perf_counter() - t:.1f} s")

    (sweep / CACHE_NAME).unlink(missing_ok=True)
    for label in ("cold (no cache)", "warm (cache fresh)", "warm again"):
        t = time.perf_counter()
        df = load_runs(sweep, progress=False)
        print(f"{label:>22}: {time.perf_counter() - t:6.2f} s  ({len(df)} rows)")

    added = [write_run(sweep / str(i), p=0.5, seed=i, light=True)
             for i in range(args.runs, args.runs + 100)]
    t = time.perf_counter()
    df = load_runs(sweep, progress=False)
    print(f"{'100 runs added':>22}: {time.perf_counter() - t:6.2f} s  ({len(df)} rows)")
    if args.dir is None:
        shutil.rmtree(sweep)
    else:                       # leave --dir as it was, ready for the next measurement
        for run in added:
            shutil.rmtree(run)
        load_runs(sweep, progress=False)


if __name__ == "__main__":
    main()
