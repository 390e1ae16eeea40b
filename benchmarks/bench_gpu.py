"""The GPU path at scale: runs/s, end-to-end time and peak device memory for R = 1,000 / 10,000 / 100,000
runs of the §5 shape (RunConfig's defaults: K=6, N=97, M=1000, n_train = n_test = 1000, T=50, evaluation
every step, zero init), float64 and float32, measured in one invocation. Under 5 minutes on one
H200 (a time budget skips, and says so, what would not fit).

    python benchmarks/bench_gpu.py            # R = 1,000 / 10,000 / 100,000
    python benchmarks/bench_gpu.py --quick    # R = 1,000 / 10,000 (CPU: R = 16)

Two measurements per (R, precision):
- train: `rw_sweeps.core.training.train` on the R runs (data made on the host and copied, every step and every
  evaluation on the GPU; the records are dropped, nothing is written);
- end to end: `rw_sweeps.sweeps.run.run_batch` into a temporary folder (the same, plus every result file written;
  wandb disabled).
R is cut into chunks by the GPU's free memory with the launcher's own sizing (`gpu_budget_gb`: 80 % of the
free memory; `packing.chunk_sizes` with `resources.bytes_per_run`), as `packed_gpus` cuts a grid for a GPU.

Without a GPU it says so in one line, measures the per-run cost at a small R on this CPU with
RW_SWEEPS_BACKEND=torch (the PyTorch path, the one GPUs run), and prints the *expected* H200 figures from a
cost model whose inputs it measures here:
- device work per run: the bytes every aten op of the training loop reads and writes (a TorchDispatchMode
  counts them, and the element-wise FLOPs, at two small R; the slope is per run) at ~70 % of H200's
  4.8 TB/s HBM, against its ~34 TFLOP/s fp64 (vector; 67 with tensor cores) and ~67 TFLOP/s fp32;
- per chunk: the number of ops × 5 µs of eager PyTorch issue on the host (hidden when the device is the
  slower side: a chunk costs the larger of the two);
- the host-to-device copy of each run's data at 25 GB/s;
- host work per run as measured here: data generation (`data.make_batches`), and writing (the end-to-end
  call's time outside training.train).
Today's loop does these one after the other, so the model adds them; it also prints the bound if the host
work overlapped the device (the larger of the two).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from rw_sweeps.core import data as data_mod  # noqa: E402
from rw_sweeps.core import training  # noqa: E402
from rw_sweeps.sweeps import run  # noqa: E402
from rw_sweeps.core.config import RunConfig, validate  # noqa: E402
from rw_sweeps.core.resources import bytes_per_run  # noqa: E402
from rw_sweeps.sweeps.packing import chunk_sizes  # noqa: E402

H200 = {"hbm_Bps": 4.8e12, "bw_eff": 0.7, "flops": {"float64": 34e12, "float32": 67e12}, "free_GiB": 139.0,
        "issue_s": 5e-6, "h2d_Bps": 25e9}
FREE_SHARE = 0.8  # rw_sweeps/sweeps/packing.py: GPU_FREE_SHARE
PRECISIONS = ("float64", "float32")


def configs(R: int, precision: str, device: str) -> list[RunConfig]:
    """R runs of the §5 grid: data.p over 19 values, every run its own seed."""
    base = validate(RunConfig(precision=precision, device=device,
                              wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))
    return [dataclasses.replace(base, seed=i, data=dataclasses.replace(base.data, p=round(0.05 + 0.05 * (i % 19), 2)))
            for i in range(R)]


def sizes_for_gpu(cfgs: list[RunConfig]) -> list[int]:
    """The chunks `packed_gpus` would cut these runs into on this GPU (its free memory now)."""
    from rw_sweeps.sweeps.packing import gpu_budget_gb

    budget = gpu_budget_gb(None)
    return chunk_sizes(len(cfgs), bytes_per_run(cfgs[0]), budget * 2**30)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(cfgs: list[RunConfig], sizes: list[int], end_to_end: bool, folder: Path) -> dict:
    """Seconds and peak device memory of train (or run_batch) over the chunks, one after the other."""
    dirs = [folder / str(i) for i in range(len(cfgs))]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync()
    inner = [0.0]  # end to end: the seconds spent inside training.train (the rest is writing)
    train = training.train

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return train(*a, **k)
        finally:
            _sync()
            inner[0] += time.perf_counter() - t

    t0 = time.perf_counter()
    start = 0
    training.train = timed
    try:
        for n in sizes:
            c, d = cfgs[start:start + n], dirs[start:start + n]
            if end_to_end:
                out = run.run_batch(c, d, progress=False)
                bad = [s for s in out if s["status"] != "done"]
                if bad:
                    raise RuntimeError(f"{len(bad)} run(s) not done: {bad[0].get('error')}")
            else:
                train(c, d, progress=False)
            start += n
        _sync()
    finally:
        training.train = train
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    if end_to_end:
        shutil.rmtree(folder, ignore_errors=True)
    return {"wall_s": wall, "runs_s": len(cfgs) / wall, "peak_GiB": None if peak is None else peak / 2**30,
            "chunks": len(sizes), "write_s": (wall - inner[0]) / len(cfgs) if end_to_end else None}


# ------------------------------------------------------------------------------------------ the cost model
class _Count:
    """Bytes read and written, element-wise FLOPs, ops and sync points of every aten op while active."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        count = self
        self.bytes = self.flops = self.ops = self.syncs = 0
        self.active = True

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if count.active and not func.is_view:
                    count.add(func, args, kwargs or {}, out)
                return out

        self.mode = Mode()

    @staticmethod
    def _tensors(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for y in x:
                yield from _Count._tensors(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from _Count._tensors(y)

    def add(self, func, args, kwargs, out) -> None:
        name = func.__name__
        if name.startswith("_local_scalar_dense") or name.startswith("nonzero"):
            self.syncs += 1  # .item()/bool(t) and data-dependent shapes: a device-to-host sync on a GPU
        if name.startswith("_local_scalar_dense"):
            return
        seen, moved = set(), 0
        for t in [*self._tensors(args), *self._tensors(kwargs), *self._tensors(out)]:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape)
            if key in seen:
                continue
            seen.add(key)
            moved += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())  # broadcasts: the storage
        self.bytes += moved
        self.ops += 1
        outs = list(self._tensors(out))
        if name.split(".")[0] in ("mm", "bmm", "matmul", "addmm", "baddbmm") and outs:
            a = next(self._tensors(args))
            self.flops += 2 * outs[0].numel() * a.shape[-1]
        else:
            self.flops += sum(t.numel() for t in outs)


def _synced(c: _Count, fn):
    def wrapper(self, *a, **k):
        if c.active:
            c.syncs += 1
            was, c.active = c.active, False  # .item() inside .tolist() etc.: one sync, counted once
            try:
                return fn(self, *a, **k)
            finally:
                c.active = was
        return fn(self, *a, **k)
    return wrapper


def count_loop(R: int, precision: str, device: str) -> dict:
    """The device work of training.train on R runs (data generation, the initial state and the stacking
    of the data on the host are not counted; the stacked data's size is the host-to-device copy)."""
    cfgs = configs(R, precision, device)
    c = _Count()
    h2d = [0]
    patched = {}

    def host(fn, copy=False):
        def wrapper(*a, **k):
            was, c.active = c.active, False
            try:
                out = fn(*a, **k)
            finally:
                c.active = was
            if copy:  # the data the loop copies to its device
                h2d[0] += sum(t.numel() * t.element_size() for t in _Count._tensors(
                    [vars(x) if hasattr(x, "__dict__") else x for x in (out if isinstance(out, tuple) else [out])]))
            return out
        return wrapper

    for mod, name, copy in ((data_mod, "make", False), (data_mod, "make_batches", True), (training, "initial_state", False),
                            (training, "stack_data", True)):
        if not hasattr(mod, name):
            continue
        patched[(mod, name)] = getattr(mod, name)
        setattr(mod, name, host(getattr(mod, name), copy))
    for name in ("tolist", "item", "cpu", "numpy"):  # copies to the host that the dispatcher does not see
        patched[(torch.Tensor, name)] = getattr(torch.Tensor, name)
        setattr(torch.Tensor, name, _synced(c, getattr(torch.Tensor, name)))
    try:
        with tempfile.TemporaryDirectory() as tmp, c.mode:
            training.train(cfgs, [Path(tmp) / str(i) for i in range(R)], progress=False)
    finally:
        for (mod, name), fn in patched.items():
            setattr(mod, name, fn)
    return {"bytes": c.bytes, "flops": c.flops, "ops": c.ops, "syncs": c.syncs, "h2d": h2d[0]}


def cost_model(precision: str, device: str, host_per_run_s: float) -> dict:
    """Per-run device bytes and FLOPs (slope between two small R), ops per chunk, per-run host cost."""
    a, b = count_loop(2, precision, device), count_loop(6, precision, device)
    per = {k: (b[k] - a[k]) / 4 for k in ("bytes", "flops", "h2d")}
    return {**per, "ops": b["ops"], "syncs": b["syncs"], "host_s": host_per_run_s,
            "chunk_bytes": bytes_per_run(configs(1, precision, "cpu")[0])}


def expected_h200(m: dict, precision: str, R: int) -> dict:
    sizes = chunk_sizes(R, m["chunk_bytes"], FREE_SHARE * H200["free_GiB"] * 2**30)
    device = 0.0
    for n in sizes:
        device += max(n * m["bytes"] / (H200["bw_eff"] * H200["hbm_Bps"]),
                      n * m["flops"] / (H200["bw_eff"] * H200["flops"][precision]),
                      m["ops"] * H200["issue_s"])
    copy = R * m["h2d"] / H200["h2d_Bps"]
    host = R * m["host_s"]
    serial = device + copy + host
    return {"chunks": len(sizes), "device_s": device, "copy_s": copy, "host_s": host, "serial_s": serial,
            "overlap_s": max(device + copy, host)}


def print_model(models: dict, Rs: list[int], T: int) -> None:
    print("cost model per run (measured here; device work counted op by op on the PyTorch path):")
    for prec, m in models.items():
        print(f"  {prec}: {m['bytes'] / 2**20:.0f} MiB read and written ({m['bytes'] / (T + 1) / 2**20:.2f} MiB per step "
              f"with its evaluation), {m['flops'] / 1e6:.0f} MFLOP, {m['h2d'] / 2**20:.2f} MiB copied to the "
              f"device, {m['ops']} ops and {m['syncs']} device-to-host syncs per chunk ({m['syncs'] / (T + 1):.1f} "
              f"per step: .item/.tolist/.cpu/bool/nonzero), host {m['host_s'] * 1e3:.2f} ms (data + writing)")
    print(f"  H200: {H200['hbm_Bps'] / 1e12:.1f} TB/s HBM at {H200['bw_eff']:.0%}, "
          f"{H200['flops']['float64'] / 1e12:.0f} TFLOP/s fp64 / {H200['flops']['float32'] / 1e12:.0f} fp32 at "
          f"{H200['bw_eff']:.0%}, {H200['issue_s'] * 1e6:.0f} µs per op issued, {H200['h2d_Bps'] / 1e9:.0f} GB/s "
          f"host→device, chunks sized to {FREE_SHARE:.0%} of {H200['free_GiB']:.0f} GiB free")
    print(f"  {'precision':9} {'R':>7} {'chunks':>6} {'device s':>9} {'copy s':>7} {'host s':>8} "
          f"{'serial s':>9} {'runs/s':>8} {'overlapped s':>13} {'runs/s':>8}")
    for prec, m in models.items():
        for R in Rs:
            e = expected_h200(m, prec, R)
            print(f"  {prec:9} {R:>7} {e['chunks']:>6} {e['device_s']:>9.2f} {e['copy_s']:>7.2f} {e['host_s']:>8.1f} "
                  f"{e['serial_s']:>9.1f} {R / e['serial_s']:>8.0f} {e['overlap_s']:>13.1f} {R / e['overlap_s']:>8.0f}")


def warm(precision: str, device: str, tmp: Path) -> None:
    """First calls out of the way (imports of the writing and wandb paths, provenance's git, kernels)."""
    cfgs = configs(2, precision, device)
    run.run_batch(cfgs, [tmp / "warm" / str(i) for i in range(2)], progress=False)
    shutil.rmtree(tmp / "warm", ignore_errors=True)


def data_cost(cfgs: list[RunConfig]) -> float:
    """Seconds per run of making the runs' data on the host, as training.train makes it."""
    t0 = time.perf_counter()
    if hasattr(data_mod, "make_batches"):
        data_mod.make_batches(cfgs, dtype=getattr(torch, cfgs[0].precision))
    else:
        for cfg in cfgs:
            data_mod.make(cfg.data, cfg.seed)
    return (time.perf_counter() - t0) / len(cfgs)


def host_cost(R: int, precision: str, tmp: Path) -> tuple[dict, dict, float]:
    """train and run_batch on R runs on this CPU (PyTorch path), and the data's time per run."""
    cfgs = configs(R, precision, "cpu")
    data_s = data_cost(cfgs)
    warm(precision, "cpu", tmp)
    tr = measure(cfgs, [R], False, tmp / "train")
    e2e = measure(cfgs, [R], True, tmp / "e2e")
    return tr, e2e, data_s


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="R = 1,000 / 10,000 (CPU: R = 16)")
    ap.add_argument("--R", type=int, nargs="+", help="the grid sizes (default 1000 10000 100000)")
    ap.add_argument("--budget-s", type=float, default=270.0, help="skip what would end after this many seconds")
    args = ap.parse_args()
    Rs = args.R or ([1000, 10000] if args.quick else [1000, 10000, 100000])
    T = RunConfig().optim.steps
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp_s:
        tmp = Path(tmp_s)
        if not torch.cuda.is_available():
            cpu(args, Rs, T, tmp)
        else:
            gpu(args, Rs, T, tmp, t_start)
    print(f"total {time.perf_counter() - t_start:.0f} s")


def cpu(args, Rs: list[int], T: int, tmp: Path) -> None:
    print("no GPU visible: nothing measured on a device; the CPU per-run cost and the expected H200 figures follow")
    os.environ["RW_SWEEPS_BACKEND"] = "torch"  # the path GPUs run
    R = 16 if args.quick else 64
    models = {}
    print(f"this CPU, PyTorch path (RW_SWEEPS_BACKEND=torch), §5 shape, R = {R}, {torch.get_num_threads()} threads:")
    for prec in PRECISIONS:
        tr, e2e, data_s = host_cost(R, prec, tmp)
        write_s = e2e["write_s"]  # measured within the end-to-end call: its time outside training.train
        print(f"  {prec}: train {tr['wall_s'] / R * 1e3:.1f} ms per run ({tr['runs_s']:.1f} runs/s), end to end "
              f"{e2e['wall_s'] / R * 1e3:.1f} ms per run ({e2e['runs_s']:.1f} runs/s); of which data "
              f"{data_s * 1e3:.2f} ms, writing {write_s * 1e3:.2f} ms")
        models[prec] = cost_model(prec, "cpu", data_s + write_s)
    print_model(models, Rs, T)


def gpu(args, Rs: list[int], T: int, tmp: Path, t_start: float) -> None:
    name = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info(0)
    print(f"GPU: {name}, {free / 2**30:.0f} of {total / 2**30:.0f} GiB free; torch {torch.__version__}; "
          f"§5 shape, T = {T}, evaluation every step, zero init, wandb disabled")
    for prec in PRECISIONS:
        warm(prec, "cuda", tmp)
    rates: dict = {}
    print(f"  {'precision':9} {'R':>7} {'what':10} {'chunks':>6} {'wall s':>8} {'runs/s':>9} {'peak GiB':>9}")
    for R in Rs:
        for prec in PRECISIONS:
            cfgs = configs(R, prec, "cuda")
            sizes = sizes_for_gpu(cfgs)
            for what, e2e in (("train", False), ("end to end", True)):
                left = args.budget_s - (time.perf_counter() - t_start)
                expect = R * rates[(prec, what)] if (prec, what) in rates else 0.0
                if expect > left:
                    print(f"  {prec:9} {R:>7} {what:10} skipped: ~{expect:.0f} s expected (from the last R's rate), "
                          f"{max(0, left):.0f} s of the budget left")
                    continue
                m = measure(cfgs, sizes, e2e, tmp / "runs")
                rates[(prec, what)] = m["wall_s"] / R
                if e2e:
                    rates[(prec, "write")] = m["write_s"]
                print(f"  {prec:9} {R:>7} {what:10} {m['chunks']:>6} {m['wall_s']:>8.1f} {m['runs_s']:>9.0f} "
                      f"{m['peak_GiB']:>9.2f}", flush=True)
    models = {}
    for prec in PRECISIONS:  # host cost per run: data.make, and the writing measured above
        models[prec] = cost_model(prec, "cuda", data_cost(configs(1000, prec, "cpu")) + rates.get((prec, "write"), 0.0))
    print("for comparison, the model (host cost: the data made here, plus the writing measured above):")
    print_model(models, Rs, T)


if __name__ == "__main__":
    main()
