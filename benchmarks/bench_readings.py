"""What each reading the paper leaves open costs per run and step, against the default (eq. 2.1, GD, the fused kernel)
measured in the same invocation:

    python benchmarks/bench_readings.py            # R = 8 runs of the §5 shape, 20 steps, median of 3
    python benchmarks/bench_readings.py --R 16 --steps 50 --reps 5

§5 shape: K = 6, N = 97, M = 1000, n = 1000, Gaussian init σ = 0.01. The FFN rows use the same shape with
m = 19 (the FFN runs on the PyTorch path, so its baseline is GD on that path too: `torch` column). Adam
runs on the PyTorch path (rw_sweeps/core/adam.py). Data generation and the initial state are not timed; the
readings are interleaved repetition by repetition and the median kept, because this VM's speed drifts
(so compare within one invocation). Times are process CPU seconds (both cores count).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from rw_sweeps.core import adam, data as data_mod, engine, fused, model, training
from rw_sweeps.core.config import RunConfig, validate, option_config
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit

READINGS = [  # name, model keys, optim name
    ("default: normalize=none, GD (kernel)", dict(normalize="none"), "gd"),
    ("normalize=whole, GD (kernel)", dict(normalize="whole"), "gd"),
    ("normalize=positional, GD (kernel)", dict(normalize="positional"), "gd"),
    ("normalize=whole, Adam (torch)", dict(normalize="whole"), "adam"),
    ("normalize=whole, GD (torch path)", dict(normalize="whole"), "gd-torch"),
    ("FFN after, whole, GD (torch)", dict(name="transformer_ffn", m=19, normalize="whole"), "gd"),
    ("FFN before, whole, GD (torch)", dict(name="transformer_ffn", m=19, normalize="whole", ffn="before"), "gd"),
    ("FFN before, whole, Adam (torch)", dict(name="transformer_ffn", m=19, normalize="whole", ffn="before"), "adam"),
]


def setup(model_keys: dict, optim: str, R: int):
    name = "adam" if optim == "adam" else "gd"
    cfgs = [validate(RunConfig(seed=s, init=GaussianInit("gaussian", 0.01), model=option_config("model", **model_keys),
                               optim=option_config("optim", name, lr=0.01))) for s in range(R)]
    c0, dtype = cfgs[0], torch.float64
    geo = model.geometry(c0.model, c0.data.N)
    train, _ = data_mod.make_batches(cfgs, dtype=dtype, token_dtype=torch.int64)
    batch = engine.Batch(train.tokens, train.y, train.P_true)
    vec = lambda key: torch.tensor([getattr(c.optim, key) for c in cfgs], dtype=dtype)  # noqa: E731
    lr, eps, w = vec("lr"), vec("eps"), torch.full((R,), 1 / c0.data.n_train, dtype=dtype)
    hp = adam.hyper(cfgs, geo, dtype, "cpu") if name == "adam" else None

    def run(steps: int) -> None:
        state = training.initial_state(cfgs, geo, dtype)
        if hp is not None:
            adam.train_steps(state, batch, hp, eps, w, geo, steps)
        elif optim == "gd-torch":
            fused._train_steps_torch(state, batch, lr, eps, w, geo, steps)
        else:
            fused.train_steps(state, batch, lr, eps, w, geo, steps)  # the kernel where it applies
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--R", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    runs = [(label, setup(keys, optim, args.R)) for label, keys, optim in READINGS]
    for _, run in runs:
        run(1)  # warm: the kernel built, first calls made
    times: dict[str, list[float]] = {label: [] for label, _ in runs}
    for _ in range(args.reps):
        for label, run in runs:
            t0 = time.process_time()
            run(args.steps)
            times[label].append((time.process_time() - t0) / (args.R * args.steps))
    base = statistics.median(times[READINGS[0][0]])
    torch_base = statistics.median(times["normalize=whole, GD (torch path)"])
    ffn_base = statistics.median(times["FFN after, whole, GD (torch)"])
    print(f"R = {args.R} runs of the §5 shape, {args.steps} steps, median of {args.reps}; CPU µs per run-step")
    print(f"{'reading':40} {'µs':>9} {'× default':>10} {'× torch GD':>11} {'× FFN after':>12}")
    for label, _ in runs:
        t = statistics.median(times[label])
        ffn = f"{t / ffn_base:12.2f}" if label.startswith("FFN") else f"{'':12}"
        print(f"{label:40} {t * 1e6:9.1f} {t / base:10.2f} {t / torch_base:11.2f} {ffn}")


if __name__ == "__main__":
    main()
