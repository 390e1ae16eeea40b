"""Packing: which runs of a grid train together, on which device, within which memory budget.

The one place that decides it, for the CPU, local GPUs and SLURM alike. Runs that share a shape
(`config.shape_key`) and a `hydra.job.env_set` (process-wide) form a group; each group is cut into balanced
chunks by `chunk_sizes`, the one sizing rule, so that a chunk fits its budget (`resources.bytes_per_run`
per run) and holds at most `max_runs_per_job` runs. `rw_sweeps.sweeps.hydra_job.Chunk` trains one chunk
wherever it runs; every run's folder ends up exactly as if it had run alone.

Budgets: `memory_gb` when it is set; else on local GPUs each GPU's own (80 % of its free memory), for
SLURM jobs that ask for GPUs a 16 GB share (each job re-cuts its chunk to its own GPU when it starts), and
2 GB on a CPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from rw_sweeps.core import resources
from rw_sweeps.core.config import shape_key
from rw_sweeps.core.console import counted
from rw_sweeps.core.resources import bytes_per_run

CPU_CHUNK_GB = 2.0  # a chunk's budget on a CPU when memory_gb is null
# A chunk's runs on a CPU when max_runs_per_job is null: a chunk's envelopes and data are made before it
# trains, so the first chunk of a 100,000-run grid starts as soon as a 4,096-run grid's, and memory is bounded.
CPU_MAX_RUNS = 4096
# The first chunk a launch trains in this process holds at most this many runs (its group's other runs are cut
# as above): a grid's first training line then comes as soon as a 1,000-run grid's, whatever its size.
FIRST_RUNS = 1024
SLURM_GPU_PLAN_GB = 16.0  # packed_slurm with GPUs, memory_gb null: chunks planned for a 16 GB share of a GPU
GPU_FREE_SHARE = 0.8  # of a GPU's free memory, a chunk plans to use (the rest: CUDA, the allocator's slack)
GB = 2**30


def chunk_sizes(n: int, per_run: int, budget_bytes: float, max_runs: Optional[int] = None) -> list[int]:
    """n runs of `per_run` bytes each in balanced chunks of at most `budget_bytes` (at least one run each) and
    at most `max_runs` runs: the one sizing rule (10 runs, at most 4 a chunk: [4, 3, 3])."""
    if n <= 0:
        return []
    cap = max(1, int(budget_bytes // per_run))
    if max_runs:
        cap = min(cap, max_runs)
    k = -(-n // cap)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def env_set_of(spec: Any) -> tuple:
    """The job's hydra.job.env_set as its environment gets it (interpolations resolved as Hydra does: `Spec.env`), as a key
    for grouping runs into chunks (it is process-wide: a chunk trains under one, which
    `rw_sweeps.sweeps.hydra_job.Chunk` sets around its training)."""
    if getattr(spec, "env", None) is not None:
        return spec.env
    env_set = spec.base_hydra["job"].get("env_set")
    return tuple(sorted((str(k), str(v)) for k, v in env_set.items())) if env_set else ()


def _groups(specs: list) -> list[list]:
    """The runs that may share a chunk: one shape and one env_set, in first-seen order."""
    out: dict = {}
    for s in specs:
        shape = getattr(s, "shape", None) or shape_key(s.cfg)  # the planner's, computed once per composition
        out.setdefault((shape, env_set_of(s)), []).append(s)
    return list(out.values())


def chunks(specs: list, memory_gb: float, max_runs: Optional[int] = None, first: Optional[int] = None) -> list[list]:
    """The specs in chunks of one group each, every chunk within `memory_gb` and `max_runs`; with `first`, the
    first `first` runs of the first group are cut on their own (`FIRST_RUNS`)."""
    out = []
    for group in _groups(specs):
        per = bytes_per_run(group[0].cfg)
        parts = [group[:first], group[first:]] if first and not out and len(group) > first else [group]
        for part in parts:
            start = 0
            for size in chunk_sizes(len(part), per, memory_gb * GB, max_runs):
                out.append(part[start:start + size])
                start += size
    return out


def plan_devices(specs: list, budgets_gb: list[float], max_runs: Optional[int] = None) -> list[list[list]]:
    """The chunks of each device (GPU g's budget budgets_gb[g]): every group is spread over the devices, its
    largest shares to the least loaded (load: runs × bytes per run, summed over groups), and each device's
    share is cut by `chunk_sizes` to that device's own budget. A device too small for one run of a group
    gets none of it, unless none is large enough (then the runs fail in one line where they run). Every run
    is in exactly one chunk; a device gets no chunk only when there are fewer runs."""
    n_dev = len(budgets_gb)
    out: list[list[list]] = [[] for _ in range(n_dev)]
    load = [0.0] * n_dev
    for group in _groups(specs):
        per = bytes_per_run(group[0].cfg)
        fits = [g for g in range(n_dev) if budgets_gb[g] * GB >= per] or list(range(n_dev))
        k = min(len(fits), len(group))
        shares = [len(group) // k + (1 if i < len(group) % k else 0) for i in range(k)]  # largest first
        devices = sorted(fits, key=lambda g: (load[g], g))[:k]  # the least loaded first
        start = 0
        for g, share in zip(devices, shares):
            for size in chunk_sizes(share, per, budgets_gb[g] * GB, max_runs):
                out[g].append(group[start:start + size])
                start += size
            load[g] += share * per
    return out


# ------------------------------------------------------------------------------------------ devices
def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices, or UUIDs under MIG)."""
    try:
        # torch: CUDA is asked only when a launch plans for GPUs; the launcher plugin imports this module,
        # and Hydra imports the plugins at every start-up (--help included)
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return []
    env = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return env[:n] if env else [str(i) for i in range(n)]


def _budgets(free: list[int], memory_gb: Optional[float]) -> list[float]:
    return [min(GPU_FREE_SHARE * f / GB, memory_gb) if memory_gb is not None else GPU_FREE_SHARE * f / GB
            for f in free]


def gpu_budgets_gb(memory_gb: Optional[float]) -> Optional[list[float]]:
    """Each visible GPU's own chunk budget, in device order (CUDA_VISIBLE_DEVICES'): 80 % of its free memory
    (torch.cuda.mem_get_info(i)), at most memory_gb when it is set; None without a GPU."""
    try:
        import torch  # torch: only a launch on GPUs asks (see visible_gpus)

        if not torch.cuda.is_available() or not torch.cuda.device_count():
            return None
        return _budgets(resources.gpu_free_bytes(), memory_gb)
    except Exception:  # noqa: BLE001
        return None


def gpu_budget_gb(memory_gb: Optional[float], all_gpus: bool = False) -> Optional[float]:
    """80 % of this process's GPU's free memory (the smallest over the visible GPUs with `all_gpus`), at
    most memory_gb when it is set; None without a GPU."""
    try:
        import torch  # torch: only a job that may have a GPU asks (see visible_gpus)

        if not torch.cuda.is_available():
            return None
        budgets = gpu_budgets_gb(memory_gb) if all_gpus else _budgets(
            resources.gpu_free_bytes([torch.cuda.current_device()]), memory_gb)
    except Exception:  # noqa: BLE001
        return None
    return min(budgets) if budgets else None


def asks_for_gpus(p: dict) -> bool:
    """Does a SLURM launcher config ask for GPUs (gpus_per_node, gpus_per_task or a gpu gres)?"""
    return bool(p.get("gpus_per_node") or p.get("gpus_per_task") or "gpu" in str(p.get("gres") or ""))


# ------------------------------------------------------------------------------------------ the plan
@dataclass
class Plan:
    """How a launch's runs to train are cut into jobs. `per_device`: packed on local GPUs, each device's
    chunks (one process per device trains them in turn)."""
    jobs: list[list]
    per_device: Optional[list[list[list]]]
    packed: bool
    where: str  # "cpu", "4 GPUs", "slurm"

    def line(self, n_runs: int, n_done: int, why_not: Optional[str] = None) -> str:
        """The launcher's one line on how the sweep runs."""
        done = f" ({n_done:,} already done)" if n_done else ""
        if self.packed:
            return f"packed: {counted(n_runs, 'run', f'{n_runs:,}')}{done} in {len(self.jobs):,} job(s) on {self.where}"
        return f"not packed: {counted(n_runs, 'run', f'{n_runs:,}')}{done} as {len(self.jobs):,} job(s) on {self.where}: {why_not}"


# One function per place a launch runs, each named by its launcher backend (`cut_into_jobs` of the rw
# launcher's InProcessLauncher, LocalGpusLauncher and SlurmLauncher). `p`: the launcher's params
# (memory_gb, max_runs_per_job, the SLURM GPU keys); `pack` False: one job per run.
def _one_job_per_run(todo: list, where: str) -> Plan:
    return Plan([[s] for s in todo], None, False, where)


def plan_in_process(todo: list, p: dict[str, Any], pack: bool) -> Plan:
    """`local`: the jobs of the runs still to train, run in this process, on the CPU: chunks within
    memory_gb (2 GB when null) and max_runs_per_job (CPU_MAX_RUNS when null)."""
    if not pack:
        return _one_job_per_run(todo, "cpu")
    budget = p["memory_gb"] if p["memory_gb"] is not None else CPU_CHUNK_GB
    return Plan(chunks(todo, budget, p.get("max_runs_per_job") or CPU_MAX_RUNS, FIRST_RUNS), None, True, "cpu")


def plan_local_gpus(todo: list, p: dict[str, Any], pack: bool) -> Plan:
    """`local_gpus`: each visible GPU's chunks, within its own budget (`gpu_budgets_gb`), one process per GPU
    training them in turn. Without a GPU: the CPU, one process (the 2 GB CPU budget unless memory_gb)."""
    max_runs = p.get("max_runs_per_job")
    gpus = visible_gpus()
    where = f"{len(gpus)} GPU(s)" if gpus else "cpu"
    if not pack:
        return _one_job_per_run(todo, where)
    budgets = (gpu_budgets_gb(p["memory_gb"]) if gpus else None) or \
        [p["memory_gb"] or CPU_CHUNK_GB] * max(1, len(gpus))
    per_device = plan_devices(todo, budgets, max_runs or (None if gpus else CPU_MAX_RUNS))
    return Plan([job for device in per_device for job in device], per_device, True, where)


def plan_slurm(todo: list, p: dict[str, Any], pack: bool) -> Plan:
    """`slurm`: one SLURM job per chunk. Jobs that ask for GPUs (`asks_for_gpus`) plan for a 16 GB share of
    a GPU unless memory_gb (each job re-cuts its chunk to its own GPU when it starts); jobs on CPUs get the
    CPU's 2 GB budget and CPU_MAX_RUNS runs a chunk unless memory_gb and max_runs_per_job say otherwise."""
    if not pack:
        return _one_job_per_run(todo, "slurm")
    max_runs, gpu = p.get("max_runs_per_job"), asks_for_gpus(p)
    if p["memory_gb"] is not None:
        budget = p["memory_gb"]
    else:
        budget = SLURM_GPU_PLAN_GB if gpu else CPU_CHUNK_GB
    if not gpu and not max_runs:
        max_runs = CPU_MAX_RUNS
    return Plan(chunks(todo, budget, max_runs), None, True, "slurm")


def writes_behind(setting: Optional[bool], cfg: Any) -> bool:
    """Whether a chunk's results are written while the next chunk trains (`rw_sweeps.sweeps.writer`):
    `hydra.launcher.write_behind`, or where it is null, when the chunk trains on a GPU, where the host
    mostly waits on the device. On a CPU the training uses the cores the writer would need: on 2 cores a
    2,000-run §5 grid written behind took 1.14× as long as in turn with both cores training, and 0.99× with
    one training thread, itself slower than two (`benchmarks/bench_sweep.py --write-behind`, medians of 2)."""
    if setting is not None:
        return bool(setting)
    try:
        return resources.resolve_device(cfg.device).startswith("cuda")
    except Exception:  # noqa: BLE001 - the run itself says why its device is not there
        return False


class RunsFailed(RuntimeError):
    """Raised by a job after writing every result, so that a scheduler records the job as failed."""
