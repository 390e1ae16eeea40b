"""A dense reference grid, a uniform grid and an adaptive sweep of the same plane, side by side: how many
cells each classifies as the reference does, and how many runs each spent.

    python benchmarks/bench_adaptive.py                       # the escape-map cut below: 256 + 49 + 48 runs
    python benchmarks/bench_adaptive.py --points 32 --batch 8 --out multirun/bench_adaptive

The cut of the escape map: p = 1 (Theorem 4.1's trap), Gaussian init, sum loss, 150 GD steps, the §5 shape
(K = 6, N = 97, M = 1000, n = 1000), seed 0; log σ ∈ [1e-8, 1e-1] × log η ∈ [0.3, 3]; a cell escapes when
test_acc ≥ 0.5. The reference is a 16 × 16 grid at the centres of its cells (held out: no other sweep samples
there). The uniform grid (7 × 7, cell centres) classifies each reference cell by its nearest point; the
adaptive sweep (`hydra/sweeper=adaptive hydra.sweeper.metric=test_acc`) by its test_acc interpolated on the
learner's triangulation at the cell's centre (and, for comparison, by its nearest point). All three are real
sweeps through `launch.py`, each in its own folder under --out: a second invocation finds their runs done.
Writes OUT/bench_adaptive.png (the three side by side) and prints one line per design.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CUT = ["data.p=1.0", "init=gaussian", "optim.reduction=sum", "optim.steps=150", "seed=0", "wandb.mode=disabled"]
SIGMA, LR = (1e-8, 1e-1), (0.3, 3.0)
LEVEL = 0.5


def launch(*args: str) -> str:
    env = {**os.environ, "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, str(ROOT / "launch.py"), "-m", *CUT, *args], cwd=ROOT, env=env, text=True,
                       capture_output=True)
    if r.returncode != 0:
        sys.exit(f"launch failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r.stdout


def centres(lo: float, hi: float, n: int) -> np.ndarray:
    """The centres of n equal cells of [lo, hi] in log space."""
    a, b = math.log10(lo), math.log10(hi)
    return 10 ** (a + (b - a) * (np.arange(n) + 0.5) / n)


def grid(folder: Path, n: int) -> dict:
    """An n × n grid of cell centres, launched (or found done): {(log10 σ, log10 η): test_acc}."""
    s, lr = centres(*SIGMA, n), centres(*LR, n)
    launch("init.sigma=" + ",".join(repr(float(x)) for x in s), "optim.lr=" + ",".join(repr(float(x)) for x in lr),
           f"hydra.sweep.dir={folder}")
    return read(folder)


def read(folder: Path) -> dict:
    out = {}
    for f in folder.glob("*/summary.json"):
        s = json.loads(f.read_text())
        if s["status"] == "done":
            out[(math.log10(s["sigma"]), math.log10(s["lr"]))] = s["test_acc"]
    return out


def nearest(points: dict, at: np.ndarray) -> np.ndarray:
    """Each row of `at` classified by the nearest point (in log σ × log η, each axis scaled to [0, 1])."""
    span = np.array([math.log10(SIGMA[1] / SIGMA[0]), math.log10(LR[1] / LR[0])])
    xy = np.array(list(points)) / span
    v = np.array(list(points.values()))
    d = ((at / span)[:, None, :] - xy[None, :, :]) ** 2
    return v[d.sum(-1).argmin(1)]


def interpolated(points: dict, at: np.ndarray) -> np.ndarray:
    """Linear interpolation on the learner's own triangulation (Learner2D, told the points)."""
    import adaptive  # the benchmark's only use of it

    learner = adaptive.Learner2D(None, [tuple(np.log10(SIGMA)), tuple(np.log10(LR))])
    learner.tell_many(list(points), list(points.values()))
    scaled = (at - learner.xy_mean) / learner.xy_scale  # the unit square its triangulation lives in
    return learner.interpolator(scaled=True)(scaled).ravel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "multirun" / "bench_adaptive")
    ap.add_argument("--dense", type=int, default=16)
    ap.add_argument("--uniform", type=int, default=7)
    ap.add_argument("--points", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    out = args.out.resolve()
    t = time.perf_counter()
    ref = grid(out / "dense", args.dense)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    uni = grid(out / "uniform", args.uniform)
    t_uni = time.perf_counter() - t
    t = time.perf_counter()
    folder = out / f"adaptive_{args.points}_b{args.batch}"
    log = launch("hydra/sweeper=adaptive", f"init.sigma=tag(log,interval({SIGMA[0]!r},{SIGMA[1]!r}))",
                 f"optim.lr=tag(log,interval({LR[0]!r},{LR[1]!r}))", "hydra.sweeper.metric=test_acc",
                 f"hydra.sweeper.level={LEVEL}", f"hydra.sweeper.n_points={args.points}",
                 f"hydra.sweeper.batch={args.batch}", f"hydra.sweep.dir={folder}")
    t_ada = time.perf_counter() - t
    # the points this sweep asked for (its folder may hold runs of other sweeps: a changed --batch)
    record = json.loads((folder / "adaptive.json").read_text())
    ada = {(math.log10(p["at"][0]), math.log10(p["at"][1])): p["value"] for p in record["points"]}

    at = np.array(list(ref))
    truth = np.array(list(ref.values())) >= LEVEL
    rows = [("dense reference", len(ref), truth, t_ref),
            (f"uniform {args.uniform}×{args.uniform}, nearest point", len(uni), nearest(uni, at) >= LEVEL, t_uni),
            (f"adaptive {args.points} points, on its triangulation", len(ada), interpolated(ada, at) >= LEVEL, t_ada),
            (f"adaptive {args.points} points, nearest point", len(ada), nearest(ada, at) >= LEVEL, None)]
    print(f"escape-map cut: {int(truth.sum())} of {len(truth)} reference cells escape (test_acc >= {LEVEL})")
    for name, runs, cls, wall in rows:
        agree = (cls == truth).mean()
        print(f"{name:45s} runs {runs:4d}  agreement {100 * agree:5.1f} % ({int((cls == truth).sum())}/{len(truth)})"
              + (f"  wall {wall:.0f} s" if wall is not None else ""))
    rounds = [ln for ln in log.splitlines() if ln.startswith(("round ", "adaptive sweep"))]
    print("\n".join(rounds[-2:]))
    draw(out / "bench_adaptive.png", ref, uni, ada, rows, args)


def draw(path: Path, ref: dict, uni: dict, ada: dict, rows: list, args) -> None:
    import matplotlib  # the figure only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at = np.array(list(ref))
    truth = rows[0][2]
    fig, axs = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    us, vs = np.unique(at[:, 0]), np.unique(at[:, 1])
    du, dv = (us[1] - us[0]) / 2, (vs[1] - vs[0]) / 2
    for ax, (name, runs, cls, _), pts in zip(axs, rows[:3], (ref, uni, ada)):
        for (u, v), good, bad in zip(at, cls, cls != truth):  # each reference cell as it is classified
            ax.add_patch(plt.Rectangle((u - du, v - dv), 2 * du, 2 * dv, color="tab:green" if good else "tab:red",
                                       alpha=0.35, lw=0))
            if bad:
                ax.add_patch(plt.Rectangle((u - du, v - dv), 2 * du, 2 * dv, fill=False, ec="k", lw=1.2))
        p = np.array(list(pts))
        ax.plot(p[:, 0], p[:, 1], "k.", ms=4)
        ax.set_xlim(us[0] - du, us[-1] + du)
        ax.set_ylim(vs[0] - dv, vs[-1] + dv)
        ax.set_title(f"{name}\n{runs} runs, {100 * (cls == truth).mean():.1f} % of cells as the reference", fontsize=9)
        ax.set_xlabel("log10 σ")
    axs[0].set_ylabel("log10 η")
    fig.suptitle("escape (test_acc ≥ 0.5, green) at p = 1, Gaussian init, sum loss, 150 GD steps; "
                 "outlined: classified unlike the reference", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
