"""256 runs of Makkuva et al.'s model, packed in one process, against the peers' way (one process per run)
and against a Python loop over the runs in one process, all measured in this invocation.

The model is experiment=makkuva's (a GPT block with n_embd 8, 1 layer, 1 head, MLP 4×, tied embeddings,
AdamW with warm-up and cosine, fresh binary-chain batches of 16 every step), with the sequence length and
the step count shrunk (--N, --steps) so that the three ways fit in minutes. The 256 runs are 16 (p, q) cells
× 16 seeds. One process per run is `python launch.py model=gpt …` as a user (or a peer's script) runs it,
timed for --processes runs; the loop trains --loop runs one at a time through the same trainer; both are
scaled to 256 runs by their median per-run time. The last line is the ratios; on a GPU it also prints
runs per second.

    python benchmarks/bench_models.py [--N 65] [--steps 100] [--processes 3] [--loop 8]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rw_sweeps.core import trainer  # noqa: E402
from rw_sweeps.sweeps.planner import plan_overrides  # noqa: E402

R = 256


def overrides(N: int, steps: int, device: str) -> list[str]:
    """experiment=makkuva's model and optimiser at the shrunk length and step count, one run's keys."""
    return ["model=gpt", "data=binary_chain", "data.start=stationary", f"data.N={N}", "data.target=all",
            "data.online=true", "data.batch=16", "data.n_test=16", "optim=adamw", "optim.lr=0.002",
            "optim.beta2=0.95", "optim.weight_decay=0.001", "optim.schedule=cosine", "optim.warmup=0.02",
            f"optim.steps={steps}", f"eval_every={steps}", "init=gpt2", f"device={device}", "wandb.mode=disabled"]


def grid(args) -> list:
    """The 256 runs, planned as `launch.py -m` plans them: 16 (p, q) cells × 16 seeds."""
    cells = ["data.p=0.2,0.4,0.6,0.8", "data.q=0.2,0.4,0.6,0.8", "seed=range(0,16)"]
    return [spec.cfg for spec in plan_overrides([*overrides(args.N, args.steps, args.device), *cells])]


def packed(cfgs) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / str(i) for i in range(len(cfgs))]
        t0 = time.perf_counter()
        recs = trainer.of(cfgs[0]).train(cfgs, dirs, progress=False)
        wall = time.perf_counter() - t0
    assert all(r.status == "done" for r in recs)
    return wall


def loop(cfgs) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cfgs):
            t0 = time.perf_counter()
            trainer.of(c).train([c], [Path(tmp) / str(i)], progress=False)
            out.append(time.perf_counter() - t0)
    return out


def processes(args, cfgs) -> list[float]:
    """One `python launch.py` per run, as a user (or a peer's script) runs it."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, c in enumerate(cfgs):
            cmd = [sys.executable, str(ROOT / "launch.py"), *overrides(args.N, args.steps, args.device),
                   f"data.p={c.data.p}", f"data.q={c.data.q}", f"seed={c.seed}", f"hydra.run.dir={tmp}/{r}"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=65, help="sequence length (Makkuva et al.: 1025)")
    ap.add_argument("--steps", type=int, default=100, help="training steps (Makkuva et al.: 400)")
    ap.add_argument("--processes", type=int, default=3, help="runs timed as one process each")
    ap.add_argument("--loop", type=int, default=8, help="runs timed in the Python loop")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cfgs = grid(args)
    assert len(cfgs) == R
    print(f"{R} runs: Makkuva's model (d_model 8, 1 layer, tied), N={args.N}, {args.steps} AdamW steps, "
          f"online batches of 16, on {args.device}", flush=True)
    t_proc = processes(args, cfgs[: args.processes])
    print(f"one process per run: {', '.join(f'{t:.2f}' for t in t_proc)} s per run (median "
          f"{statistics.median(t_proc):.2f} s) → {R} runs ≈ {R * statistics.median(t_proc):.1f} s", flush=True)
    t_loop = loop(cfgs[: args.loop])
    print(f"loop in one process: median {statistics.median(t_loop):.3f} s per run over {args.loop} → "
          f"{R} runs ≈ {R * statistics.median(t_loop):.1f} s", flush=True)
    t_pack = packed(cfgs)
    print(f"packed, one process: {t_pack:.2f} s for {R} runs", flush=True)
    if args.device.startswith("cuda"):
        print(f"runs per second (packed): {R / t_pack:.1f}")
    print(f"packed vs one process per run: {R * statistics.median(t_proc) / t_pack:.1f}x; "
          f"packed vs loop: {R * statistics.median(t_loop) / t_pack:.1f}x")


if __name__ == "__main__":
    main()
