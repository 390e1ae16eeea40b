"""`experiment=escape_adaptive` against the dense escape map it stands in for: where each puts the boundary.

    python benchmarks/bench_escape_adaptive.py                  # 512 dense runs + 512 adaptive runs
    python benchmarks/bench_escape_adaptive.py --out multirun/bench_escape_adaptive --seeds 0-3

The reference is the dense escape map's p = 1 slice (`experiment=escape data.p=1.0`, float64, the preset's
own precision): 8 σ × 4 η × 2 normalisations × 8 seeds = 512 runs, each cell classified by its success
rate ≥ 0.5 (success: test_acc ≥ OPT − 0.02 at step 1000, the analysis's rule). The adaptive sweep is the
preset as shipped (64 points a panel × 2 normalisations × 4 seeds = 512 runs); `--seeds` and `--dense-seeds`
pick others, e.g. `--dense-seeds 8-15` for a reference on seeds the adaptive sweep never saw. Each dense cell is classified by the adaptive sweep's success rate
interpolated on its learner's triangulation at the cell's (log σ, log η), exactly as `python -m analysis`
draws it. The boundary matches "within one dense cell" when every cell classified unlike the reference has
a neighbour (of its 8) that the reference classifies the other way: the two boundaries never differ by more
than a cell. A differing cell is printed with the reference's k of n and Wilson 95 % interval: where that
holds the level, the reference itself cannot tell the cell's side with its seeds. Both are real sweeps through `launch.py` (wandb disabled), each in its own folder under --out;
a second invocation finds their runs done. Prints one line per normalisation and the runs each design spent
against the full escape map's 5,120.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FULL_MAP = 5120  # experiment=escape: 5 p × 8 σ × 4 η × 2 normalisations × 2 precisions × 8 seeds
LEVEL = 0.5


def launch(*args: str) -> float:
    env = {**os.environ, "WANDB_SILENT": "true"}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "launch.py"), "-m", *args, "wandb.mode=disabled"], cwd=ROOT,
                       env=env, text=True, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"launch failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "multirun" / "bench_escape_adaptive")
    ap.add_argument("--seeds", default="0-3", help="the adaptive sweep's seeds, lo-hi (the preset's: 0-3)")
    ap.add_argument("--dense-seeds", default="0-7", help="the dense reference's seeds, lo-hi (the preset's: 0-7)")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split("-"))
    dlo, dhi = (int(x) for x in args.dense_seeds.split("-"))
    out = args.out.resolve()
    dense_dir = out / ("dense" if (dlo, dhi) == (0, 7) else f"dense_seeds{dlo}-{dhi}")
    t_dense = launch("experiment=escape", "data.p=1.0", "precision=float64", f"seed=range({dlo},{dhi + 1})",
                     f"hydra.sweep.dir={dense_dir}")
    ada_dir = out / f"adaptive_seeds{lo}-{hi}"
    t_ada = launch("experiment=escape_adaptive", f"seed=range({lo},{hi + 1})", f"hydra.sweep.dir={ada_dir}")

    from matplotlib.tri import LinearTriInterpolator

    from analysis import load_runs
    from analysis.claims import rate as k_of_n, wilson
    from analysis.adaptive import points, read_record, run_values, triangulation
    from rw_sweeps.core.metrics import SUCCESS, SUCCESS_TOL

    dense = load_runs(dense_dir, progress=False)
    dense = dense.assign(_ok=run_values(dense, SUCCESS, SUCCESS_TOL))
    rec = read_record(ada_dir)
    ada = load_runs(ada_dir, progress=False)
    pts = points(ada, rec, ["model.normalize"])
    sig, lr = sorted(dense["init.sigma"].unique()), sorted(dense["optim.lr"].unique())
    print(f"dense p = 1 slice: {len(dense)} runs, seeds {dlo}-{dhi} ({t_dense:.0f} s); adaptive: {int(pts['runs'].sum())} runs at "
          f"{len(pts) // pts['model.normalize'].nunique()} points a panel, seeds {lo}-{hi} ({t_ada:.0f} s); "
          f"the full escape map: {FULL_MAP} runs")
    worst = 0
    for norm, g in pts.groupby("model.normalize"):
        cell = dense[dense["model.normalize"] == norm].groupby(["init.sigma", "optim.lr"])["_ok"]
        rate, wins, n = cell.mean(), cell.sum(), cell.size()
        truth = np.array([[rate[(s, e)] >= LEVEL for e in lr] for s in sig])
        f = LinearTriInterpolator(triangulation(g, rec), g["value"].to_numpy())
        est = np.array([[f(np.log10(s), np.log10(e)) for e in lr] for s in sig], dtype=float)
        cls = est >= LEVEL
        wrong = list(zip(*np.nonzero(cls != truth)))
        far = [(i, j) for i, j in wrong
               if not any(truth[a, b] != truth[i, j] for a in range(max(i - 1, 0), min(i + 2, len(sig)))
                          for b in range(max(j - 1, 0), min(j + 2, len(lr))))]
        unsure = [(i, j) for i, j in far if wilson(int(wins[(sig[i], lr[j])]), int(n[(sig[i], lr[j])]))[0] <= LEVEL
                  <= wilson(int(wins[(sig[i], lr[j])]), int(n[(sig[i], lr[j])]))[1]]
        worst = max(worst, len(far))
        print(f"model.normalize={norm}: reference escapes in {int(truth.sum())}/{truth.size} cells; adaptive "
              f"classifies {truth.size - len(wrong)}/{truth.size} alike; {len(wrong)} differ, "
              f"{len(far)} of them more than one cell from the reference boundary"
              + (f" ({len(unsure)} of those where the reference's own 95 % interval holds the level)" if far else "")
              + "".join(f"\n  differs at σ={sig[i]:g}, η={lr[j]:g}: reference "
                        f"{k_of_n(int(wins[(sig[i], lr[j])]), int(n[(sig[i], lr[j])]))}, adaptive {est[i, j]:.2f}"
                        for i, j in wrong))
    runs = int(pts["runs"].sum())
    print(f"boundary within one dense cell: {'yes' if worst == 0 else 'no'}; runs {runs} = "
          f"{100 * runs / FULL_MAP:.0f} % of the escape map's {FULL_MAP}, {100 * runs / len(dense):.0f} % of its "
          f"float64 p = 1 slice")


if __name__ == "__main__":
    main()
