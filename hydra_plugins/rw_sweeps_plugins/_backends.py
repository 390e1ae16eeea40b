"""What the backends of `launcher.py` run on: the pool of local submitit processes, one per visible GPU, of
`local_gpus` (and how an interrupted launch stops them), and the submitit parameters, sbatch scripts and job
ids of `slurm`.

A module of `launcher.py`'s, named with `_` so that Hydra's plugin scan leaves it alone (the scan executes
every other module of the package again)."""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from rw_sweeps.core import signals
from rw_sweeps.sweeps import packing
from rw_sweeps.sweeps.hydra_adapter import SUBMITIT_ENTRY, sbatch_script

from hydra_plugins.rw_sweeps_plugins._schema import SLURM_KEYS

log = logging.getLogger("hydra_plugins.rw_sweeps_plugins.launcher")  # the launcher's lines, under its name
LOCAL_TIMEOUT_MIN = 60 * 24 * 365  # local jobs have no time limit (timeout_min is SLURM's)
LOCAL_STOP_S = 300.0  # how long an interrupted launch waits for its local jobs to checkpoint and end


# ------------------------------------------------------------------------------------------ local_gpus
def local_gpu_pool(payloads: list, folder: str, pinned: bool = False) -> list:
    """At most one job per GPU at a time, each pinned to its device through CUDA_VISIBLE_DEVICES; with
    `pinned`, payload i runs on GPU i (packed: one process per GPU trains all of that GPU's chunks; a
    None payload, a GPU with nothing to do, starts no process and returns [])."""
    # submitit: only a local_gpus launch starts processes; Hydra imports the plugins (and so this module) at
    # every start-up, --help included
    import submitit

    gpus = packing.visible_gpus()
    executors = []
    if gpus and pinned:
        log.info(f"local_gpus: {len(gpus)} GPU(s) ({', '.join(gpus)}): one process per GPU, each training "
                 f"its GPU's chunks in turn")
    elif gpus:
        log.info(f"local_gpus: {len(gpus)} GPU(s) ({', '.join(gpus)}): one job per GPU at a time")
    else:
        log.warning("local_gpus: no GPU visible: running the jobs on the CPU, one at a time")
    for g in gpus or [None]:  # submitit's own visible_gpus takes indices only; this also takes MIG UUIDs
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN,
                             **({"setup": [f"export CUDA_VISIBLE_DEVICES={g}"]} if g is not None else {}))
        executors.append(ex)
    if pinned and len(payloads) > len(executors):
        raise ValueError(f"{len(payloads)} pinned payloads for {len(executors)} device(s)")
    queue = [(i, payload) for i, payload in enumerate(payloads) if payload is not None]
    running: Dict[int, Any] = {}
    out: list = [[] if payload is None else None for payload in payloads]
    try:
        while queue or running:
            for slot in range(len(executors)):
                if slot not in running and queue and (not pinned or queue[0][0] == slot):
                    i, payload = queue.pop(0)
                    running[slot] = (executors[slot].submit(payload), i)
            time.sleep(0.02)
            for slot, (fut, i) in list(running.items()):
                if fut.done():
                    del running[slot]
                    try:
                        out[i] = fut.result()
                    except Exception as exc:  # noqa: BLE001 - its runs say why on disk
                        out[i] = exc
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the jobs checkpoint and end first
        _stop_local_jobs([fut for fut, _ in running.values()], exc)
        raise
    return out


def _stop_local_jobs(jobs: list, exc: BaseException) -> None:
    """The launching process was interrupted while local submitit jobs ran: each job's task process (the
    child of submitit's controller) gets SIGINT, so that it checkpoints its runs at the end of the current
    step and ends, writing the results it has finished; the launch then ends once they have (at most
    LOCAL_STOP_S). Not the controller: it would SIGKILL its task a second later. Not SIGTERM: inside a
    submitit job it is only logged. A job left running would go on writing into the sweep after its lock
    is released."""
    signals.stopping(exc)  # a second signal within a second is the same request; a later one stops at once
    for job in jobs:
        tasks = _children(_local_pid(job))
        if not tasks:  # none found (no /proc): submitit's own cancel (SIGINT to its controller)
            job.cancel()
        for pid in tasks:
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass
    end = time.monotonic() + LOCAL_STOP_S
    while any(not job.done() for job in jobs) and time.monotonic() < end:
        time.sleep(0.05)
    for job in jobs:
        if not job.done():
            job.cancel()


def _local_pid(job) -> Optional[int]:
    """A submitit LocalJob's process (its controller): its job id is that process's pid."""
    try:
        return int(job.job_id)
    except (TypeError, ValueError):
        return None


def _children(pid: Optional[int]) -> List[int]:
    """The processes whose parent is `pid` (Linux /proc; none elsewhere)."""
    if pid is None:
        return []
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(name))
    return out


# ------------------------------------------------------------------------------------------ slurm
def result_or_error(job, wait: bool = True) -> Any:
    try:
        if not wait and not job.done():
            return RuntimeError(f"job {job.job_id} has not finished")
        return job.result()
    except Exception as exc:  # noqa: BLE001
        return exc


def slurm_max_array_size() -> int:
    """The cluster's MaxArraySize (an array holds at most that many tasks); SLURM's default is 1001."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if line.split("=")[0].strip() == "MaxArraySize":
                return int(line.split("=")[1])
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return 1001


def slurm_parameters(p: Dict[str, Any]) -> Dict[str, Any]:
    """Our launcher keys → submitit SlurmExecutor parameters (the sbatch flags, by their own names)."""
    out: Dict[str, Any] = {"job_name": str(p.get("name") or "rw_sweeps"), "time": p["timeout_min"],
                           "array_parallelism": p["array_parallelism"], "signal_delay_s": p["signal_delay_s"]}
    if p.get("tasks_per_node") not in (None, 1):
        out["ntasks_per_node"] = p["tasks_per_node"]
    for key in SLURM_KEYS:
        if p.get(key) is not None and not (key == "nodes" and p[key] == 1) and not (
                key == "stderr_to_stdout" and not p[key]):
            out[key] = p[key]
    if p.get("mem_gb") is not None:
        gb = float(p["mem_gb"])
        out["mem"] = f"{int(gb)}GB" if gb == int(gb) else f"{int(gb * 1024)}MB"
    if p.get("setup"):
        out["setup"] = [str(line) for line in p["setup"]]
    extra = {str(k).replace("-", "_"): v for k, v in (p.get("additional_parameters") or {}).items()}
    if extra.pop("requeue", True) is False:  # `--requeue=False` is no sbatch flag
        extra["no_requeue"] = True
    else:  # preempted or requeued jobs come back and resume from their checkpoints
        extra["requeue"] = True
    out["additional_parameters"] = extra
    return out


def sbatch_scripts(p: Dict[str, Any], n_jobs: int) -> str:
    """The sbatch script(s) a sweep of n_jobs jobs submits (one per array), as submitit writes them."""
    params = slurm_parameters(p)
    limit = p.get("max_array_size") or slurm_max_array_size()
    command = " ".join([shlex.quote(sys.executable), "-u -m", SUBMITIT_ENTRY,
                        shlex.quote(str(p["submitit_folder"]))])
    out = []
    for i, start in enumerate(range(0, n_jobs, limit)):
        n = min(limit, n_jobs - start)
        text = sbatch_script(command=command, folder=p["submitit_folder"], map_count=n if n > 1 else None,
                             **params)
        out.append(f"# ---- array {i}: {n} job(s)\n{text}")
    return "".join(out)


def compact_ids(job_ids: List[str]) -> str:
    """['12_0', '12_1', '12_2', '13_0'] → '12_[0-2], 13_0'."""
    arrays: Dict[str, List[int]] = {}
    for j in job_ids:
        a, _, t = j.partition("_")
        arrays.setdefault(a, []).extend([int(t)] if t else [])
    parts = []
    for a, tasks in arrays.items():
        if not tasks:
            parts.append(a)
        elif len(tasks) == 1:
            parts.append(f"{a}_{tasks[0]}")
        else:
            parts.append(f"{a}_[{min(tasks)}-{max(tasks)}]" if sorted(tasks) == list(range(min(tasks), max(tasks) + 1))
                         else f"{a}_[{','.join(map(str, sorted(tasks)))}]")
    return ", ".join(parts)
