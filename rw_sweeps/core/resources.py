"""Will a run fit where it is about to run? Its device must be visible, and its estimated peak memory must
fit in what the device has free: checked before anything is trained or written, so that a run that cannot
work fails in one line (`invalid config: model.M=30000: one run needs ~7.3 GB …`) rather than after minutes.
"""
from __future__ import annotations

import dataclasses
import os

from . import trainer
from .config import ConfigError, RunConfig, shape_key
from .contract import too_large


def bytes_per_run(c: RunConfig) -> int:
    """Peak memory of one run inside a batch, as its trainer estimates it (`batch_bytes`); the packing rule
    (`rw_sweeps.sweeps.packing`) sizes chunks with it."""
    return trainer.of(c).batch_bytes(c)


def run_bytes(cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes of one run (estimate), and the key that drives it (`cause`)."""
    total, largest = estimate(cfg)
    return total, cause(cfg, total, largest)


def estimate(cfg: RunConfig) -> tuple[int, str]:
    """Peak bytes of one run, and the key of the estimate's largest term, as its trainer estimates them."""
    return trainer.of(cfg).run_bytes(cfg)


def cause(cfg: RunConfig, total: int, largest: str) -> str:
    """The key a refusal names: of the integer keys of the run's data and model above their schema defaults,
    the one whose default alone would shrink the estimate the most, if that is more than half of it (what is
    out of scale: `model.d_model=65536`, a huge `data.N` or `data.n_train`); else the key of the largest term."""
    best, saved = largest, total // 2
    for group in ("data", "model"):
        part = getattr(cfg, group)
        for f in dataclasses.fields(part):
            value, default = getattr(part, f.name), f.default
            if type(value) is not int or type(default) is not int or value <= default:
                continue
            at_default = dataclasses.replace(cfg, **{group: dataclasses.replace(part, **{f.name: default})})
            less = total - estimate(at_default)[0]
            if less > saved:
                best, saved = f"{group}.{f.name}", less
    return best


def available_bytes(device: str) -> int | None:
    """Free memory of the device a run will use (host: MemAvailable; GPU: its free memory), or None."""
    if device.startswith("cuda"):
        import torch  # torch: only where a run trains

        idx = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        return gpu_free_bytes([idx])[0]
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def gpu_free_bytes(devices: list[int] | None = None) -> list[int]:
    """Free bytes of each GPU (all visible ones by default), counting as free what this process's caching
    allocator holds but does not use: a worker that trains chunk after chunk sees its GPU's memory as the
    first chunk did. torch.cuda.mem_get_info(i), which starts a CUDA context on GPU i."""
    import torch  # torch: only where a run trains

    if devices is None:
        devices = list(range(torch.cuda.device_count()))
    out = []
    for i in devices:
        free = torch.cuda.mem_get_info(i)[0]
        if torch.cuda.is_initialized():
            free += torch.cuda.memory_reserved(i) - torch.cuda.memory_allocated(i)
        out.append(int(free))
    return out


def resolve_device(device: str) -> str:
    """`auto` → cuda when a GPU is visible, else cpu; `cuda:N` checked against the visible GPUs."""
    import torch  # torch: only where a run trains

    n = torch.cuda.device_count() if device != "cpu" else 0
    if device == "auto":
        return "cuda" if n else "cpu"
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= n:
            seen = "none is" if n == 0 else f"only cuda:0 … cuda:{n - 1} are" if n > 1 else "only cuda:0 is"
            raise ConfigError("device", device, f"no such GPU here: {seen} visible (CUDA_VISIBLE_DEVICES)")
    return device


def check(cfg: RunConfig) -> None:
    """Raise ConfigError (one line) if the run would write a file its readers refuse (`contract.too_large`),
    its device is not visible or the run cannot fit its memory."""
    device = resolve_device(cfg.device)
    need, key = run_bytes(cfg)
    free = available_bytes(device)
    if free is not None and need > free:
        group, name = key.split(".", 1)
        value = getattr(getattr(cfg, group), name, None)
        raise ConfigError(key, value, f"one run needs ~{need / 2**30:.1f} GB (estimate), more than the "
                          f"{free / 2**30:.1f} GB free on {device} here")
    problem = too_large(cfg)  # after the memory: a run that cannot run here is told that first
    if problem is not None:
        raise problem


def problems(cfgs: list[RunConfig], shapes: list | None = None) -> list[ConfigError | None]:
    """`check` for every run, asked once per shape and init at unit scale (its draw counts): the error, or None.
    `shapes`: the runs' `shape_key`s, where the caller has them."""
    seen: dict = {}
    out = []
    for i, cfg in enumerate(cfgs):
        key = (type(cfg.init), repr(cfg.init.unit()), shapes[i] if shapes is not None else shape_key(cfg))
        if key not in seen:
            try:
                check(cfg)
                seen[key] = None
            except ConfigError as exc:
                seen[key] = exc
        out.append(seen[key])
    return out
