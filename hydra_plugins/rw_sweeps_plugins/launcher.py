"""`hydra/launcher=packed | local_gpus | packed_gpus | slurm | packed_slurm`: one launcher, three places
to run and two ways to cut the grid.

- backend `local` trains in this process; `local_gpus` runs one submitit job per visible GPU at a time,
  each pinned to its own device (submitit's stock local launcher gives every job every GPU at once);
  `slurm` submits job arrays through submitit, split so no array exceeds the cluster's MaxArraySize.
- `pack: true` trains every chunk of same-shape runs as one batched program (`rw_sweeps.packing`);
  `pack: false` gives every run its own job, as Hydra's stock launchers do.

Runs already `done` in the sweep folder are skipped before anything is submitted (resume). Every job is
submitted with `--requeue`: a job that is preempted, requeued by an admin or hits its time limit comes back
and its runs continue from their checkpoints (`checkpoint_every`). A job with a failed run exits non-zero,
so SLURM shows FAILED rather than a silent COMPLETED.

The launcher records the sweep in `<sweep>/.rw_sweep.json` (expected runs, skipped runs, job ids), which
`python -m rw_sweeps.status` reads. A blocking SLURM sweep waits through that same status code, so a
detached sweep (`detach: true`: submit, print the folder and job ids, return at once) followed with
`python -m rw_sweeps.status <sweep> --wait` ends with the very same summary line. `dry_run: true` prints
the plan (and the sbatch scripts) without writing or submitting anything.
"""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher

log = logging.getLogger(__name__)
LOCAL_TIMEOUT_MIN = 60 * 24 * 365  # local jobs have no time limit (timeout_min is SLURM's)


@dataclass
class RwLauncherConf:
    _target_: str = "hydra_plugins.rw_sweeps_plugins.launcher.RwLauncher"
    backend: str = "local"  # local | local_gpus | slurm
    pack: bool = True  # many same-shape runs per job, trained as one batched program
    memory_gb: float = 2.0  # packed: memory budget of one chunk (a GPU's budget is its free memory)
    max_runs_per_job: Optional[int] = None  # packed: cap on runs per chunk (null: by memory only)
    detach: bool = False  # slurm: submit, print the job ids and return
    dry_run: bool = False  # print the plan (slurm: the sbatch scripts) and stop: nothing written or submitted
    poll_s: float = 5.0  # slurm, blocking: seconds between questions to SLURM while waiting
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # SLURM (names as in hydra-submitit-launcher; every one can be overridden on the command line)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    timeout_min: int = 60
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    gres: Optional[str] = None
    mem_gb: Optional[float] = None
    array_parallelism: int = 256
    max_array_size: Optional[int] = None  # null: the cluster's MaxArraySize (scontrol show config)
    max_num_timeout: int = 3  # requeues after a time limit (preemptions are always requeued)
    signal_delay_s: int = 60
    setup: List[str] = field(default_factory=list)  # shell lines before the job (module load, venv…)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option


ConfigStore.instance().store(group="hydra/launcher", name="rw", node=RwLauncherConf, provider="rw_sweeps")


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


def visible_gpus() -> List[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices, or UUIDs under MIG)."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return []
    env = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return env[:n] if env else [str(i) for i in range(n)]


def _bad(key: str, value: Any, allowed: str) -> None:
    """One line and exit 2 before anything is launched (SystemExit passes Hydra's traceback printing)."""
    print(f"error: invalid config: hydra.launcher.{key}={value!r}: {allowed}", file=sys.stderr, flush=True)
    sys.exit(2)


class RwLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.plans: Dict[tuple, Any] = {}  # filled by the rw sweeper: overrides → validated RunConfig
        self.config = self.hydra_context = self.task_function = None
        self.record: Optional[dict] = None  # .rw_sweep.json, grown batch after batch

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        p = self.params
        if p["backend"] not in ("local", "local_gpus", "slurm"):
            _bad("backend", p["backend"], "must be local, local_gpus or slurm")
        if p.get("gres") and p.get("gpus_per_node"):
            _bad("gres", p["gres"], "set gres or gpus_per_node, not both")
        if p["detach"] and p["backend"] != "slurm":
            _bad("detach", True, "needs the slurm backend (hydra/launcher=slurm or packed_slurm)")
        if not p["memory_gb"] > 0:
            _bad("memory_gb", p["memory_gb"], "must be > 0")
        if p.get("max_runs_per_job") is not None and p["max_runs_per_job"] < 1:
            _bad("max_runs_per_job", p["max_runs_per_job"], "must be >= 1 or null")

    @property
    def sweep_label(self) -> str:
        return str(Path(str(self.config.hydra.sweep.dir)))  # as the sweeper's summary line prints it

    @property
    def sweep_dir(self) -> Path:
        return Path(self.sweep_label).absolute()

    # ----------------------------------------------------------------------------------------------------
    def runs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        from rw_sweeps.packing import Run
        from rw_sweeps.sweep import Planner

        sweep_dir = self.sweep_dir
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)["subdir"]
        group = "/".join(Path(self.sweep_label).parts[-2:])
        planner = None
        out = []
        for i, ov in enumerate(job_overrides):
            cfg = self.plans.get(tuple(ov))
            if cfg is None:  # launched without the rw sweeper
                planner = planner or Planner(self.hydra_context.config_loader, self.config)
                cfg = planner.plan([ov])[0].cfg
            if cfg.wandb.group is None:
                cfg = replace(cfg, wandb=replace(cfg.wandb, group=group))
            num = initial_job_idx + i
            name = str(num) if subdir == "${hydra.job.num}" else _resolve_subdir(subdir, cfg, ov, num)
            out.append(Run(cfg, sweep_dir / name, list(ov), num))
        return out

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Optional[Sequence[JobReturn]]:
        from rw_sweeps import packing, run, status

        p = self.params
        runs = self.runs(job_overrides, initial_job_idx)
        sweep_dir = self.sweep_dir
        todo = [r for r in runs if not run.is_done(r.cfg, r.run_dir)]
        skipped = {r.num for r in runs} - {r.num for r in todo}
        memory = p["memory_gb"]
        if p["backend"] == "local_gpus" and visible_gpus():
            memory = _gpu_budget_gb(memory)
        jobs = packing.chunks(todo, memory, p["max_runs_per_job"]) if p["pack"] else [[r] for r in todo]
        payloads = [([r.cfg.to_dict() for r in job], [str(r.run_dir) for r in job]) for job in jobs]
        if p["dry_run"]:
            self._dry_run(runs, skipped, jobs, payloads)
            return None

        sweep_dir.mkdir(parents=True, exist_ok=True)
        for r in todo:
            packing.write_overrides(r)
        if self.record is None:
            self.record = status.new_record(self.sweep_label, p["backend"], detached=p["detach"])
        rec = self.record
        rec["runs"] += [_name(r, sweep_dir) for r in runs]
        rec["skipped"] += [_name(r, sweep_dir) for r in runs if r.num in skipped]
        rec["stale"].update({_name(r, sweep_dir): fp for r in todo if (fp := status.fingerprint(r.run_dir))})
        log.info(f"{p['backend']} launcher: {len(runs)} runs ({len(skipped)} already done) in {len(jobs)} job(s)"
                 f"{' (packed)' if p['pack'] else ''}; sweep folder {sweep_dir}")

        errors: Dict[str, str] = {}
        if p["backend"] in ("local", "local_gpus"):
            rec["jobs"].setdefault("local", []).extend(_name(r, sweep_dir) for job in jobs for r in job)
            status.write_record(sweep_dir, rec)
            run_jobs = self._local if p["backend"] == "local" else self._local_gpus
            by_num = run_jobs(payloads, jobs)
            errors = {_name(r, sweep_dir): by_num[r.num] for r in todo if r.num in by_num}
        else:
            submitted = self._slurm(payloads)
            for j, job in zip(submitted, jobs):
                rec["jobs"][j.job_id] = [_name(r, sweep_dir) for r in job]
            rec["arrays"] += sorted({j.job_id.split("_")[0] for j in submitted}, key=int)
            status.write_record(sweep_dir, rec)
            ids = _compact_ids([j.job_id for j in submitted])
            follow = f"python -m rw_sweeps.status {shlex.quote(str(sweep_dir))} --wait"
            if p["detach"]:
                print(f"submitted {len(todo)} run(s) ({len(skipped)} already done) as {len(submitted)} SLURM "
                      f"job(s): {ids or 'none'}\nsweep folder: {sweep_dir}\nfollow with: {follow}", flush=True)
                return None
            log.info(f"submitted {len(submitted)} SLURM job(s): {ids or 'none'}; waiting (Ctrl-C stops waiting, "
                     f"not the jobs; follow again with: {follow})")
            try:
                snap = status.Sweep(sweep_dir, record=rec).follow(interval=p["poll_s"])
            except KeyboardInterrupt:
                print(f"\nstopped waiting; the jobs go on ({ids}). Follow them with: {follow}\n"
                      f"or cancel them with: scancel {' '.join(rec['arrays'])}", file=sys.stderr, flush=True)
                sys.exit(130)
            errors = snap.errors
        tracker = status.Sweep(sweep_dir, record=rec)
        return [_job_return(r, r.num in skipped, tracker.summary(_name(r, sweep_dir)),
                            errors.get(_name(r, sweep_dir))) for r in runs]

    # ----------------------------------------------------------------------------------------------------
    def _local(self, payloads, jobs) -> Dict[int, str]:
        from rw_sweeps.packing import ChunkJob

        errors = {}
        for (cfgs, dirs), job in zip(payloads, jobs):
            try:
                ChunkJob()(cfgs, dirs, fail_job_on_failed_run=False)
            except Exception as exc:  # noqa: BLE001 - a crash of one chunk never takes the sweep down
                errors.update({r.num: _first_line(exc) for r in job})
        return errors

    def _local_gpus(self, payloads, jobs) -> Dict[int, str]:
        """At most one job per GPU at a time, each pinned to its device through CUDA_VISIBLE_DEVICES."""
        import submitit

        from rw_sweeps.packing import ChunkJob

        gpus = visible_gpus()
        folder = self.params["submitit_folder"]
        executors = []
        if gpus:
            log.info(f"local_gpus: {len(gpus)} GPU(s) ({', '.join(gpus)}): one job per GPU at a time")
            for g in gpus:  # submitit's own visible_gpus takes indices only; this also takes MIG UUIDs
                ex = submitit.LocalExecutor(folder=folder)
                ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, setup=[f"export CUDA_VISIBLE_DEVICES={g}"])
                executors.append(ex)
        else:
            log.warning("local_gpus: no GPU visible: running the jobs on the CPU, one at a time")
            ex = submitit.LocalExecutor(folder=folder)
            ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
            executors = [ex]
        queue = list(zip(payloads, jobs))
        running: Dict[int, Any] = {}
        errors: Dict[int, str] = {}
        while queue or running:
            for slot in range(len(executors)):
                if slot not in running and queue:
                    (cfgs, dirs), job = queue.pop(0)
                    running[slot] = (executors[slot].submit(ChunkJob(), cfgs, dirs), job)
            time.sleep(0.05)
            for slot, (fut, job) in list(running.items()):
                if fut.done():
                    del running[slot]
                    try:
                        fut.result()
                    except Exception as exc:  # noqa: BLE001 - its runs say why on disk
                        errors.update({r.num: _first_line(exc) for r in job})
        return errors

    def _slurm(self, payloads) -> list:
        """Submit one array per MaxArraySize jobs; returns submitit's jobs, in payload order."""
        import submitit

        from rw_sweeps.packing import ChunkJob

        p = self.params
        ex = submitit.SlurmExecutor(folder=p["submitit_folder"], max_num_timeout=p["max_num_timeout"])
        ex.update_parameters(**slurm_parameters(p, name=str(self.config.hydra.job.name)))
        limit = p["max_array_size"] or slurm_max_array_size()
        submitted = []
        for start in range(0, len(payloads), limit):  # no array larger than the cluster allows
            part = payloads[start:start + limit]
            submitted += ex.map_array(ChunkJob(), [c for c, _ in part], [d for _, d in part])
        return submitted

    def _dry_run(self, runs, skipped, jobs, payloads) -> None:
        p = self.params
        print(f"dry run: {len(runs)} runs ({len(skipped)} already done) in {len(jobs)} job(s)"
              f"{' (packed)' if p['pack'] else ''} on {p['backend']}; sweep folder {self.sweep_dir}", flush=True)
        for i, job in enumerate(jobs[:20]):
            names = [_name(r, self.sweep_dir) for r in job]
            shown = ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])} … {', '.join(names[-2:])}"
            print(f"  job {i}: {len(job)} run(s): {shown}")
        if len(jobs) > 20:
            print(f"  … and {len(jobs) - 20} more job(s)")
        if p["backend"] == "slurm":
            print(sbatch_scripts(p, len(payloads), name=str(self.config.hydra.job.name)), end="", flush=True)


def slurm_parameters(p: Dict[str, Any], name: str = "rw_sweeps") -> Dict[str, Any]:
    """Our launcher keys → submitit SlurmExecutor parameters (the sbatch flags, by their own names)."""
    out: Dict[str, Any] = {"job_name": name, "time": p["timeout_min"], "array_parallelism": p["array_parallelism"],
                           "signal_delay_s": p["signal_delay_s"]}
    for key in ("partition", "account", "qos", "cpus_per_task", "gpus_per_node", "gres"):
        if p.get(key) is not None:
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


def sbatch_scripts(p: Dict[str, Any], n_jobs: int, name: str = "rw_sweeps") -> str:
    """The sbatch script(s) a sweep of n_jobs jobs submits (one per array), as submitit writes them."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(p, name)
    limit = p.get("max_array_size") or slurm_max_array_size()
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit",
                        shlex.quote(str(p["submitit_folder"]))])
    out = []
    for i, start in enumerate(range(0, n_jobs, limit)):
        n = min(limit, n_jobs - start)
        text = _make_sbatch_string(command=command, folder=p["submitit_folder"], map_count=n if n > 1 else None,
                                   **params)
        out.append(f"# ---- array {i}: {n} job(s)\n{text}")
    return "".join(out)


def _gpu_budget_gb(default: float) -> float:
    try:
        import torch

        free, _ = torch.cuda.mem_get_info()
        return max(default, 0.8 * free / 2**30)
    except Exception:  # noqa: BLE001
        return default


def _resolve_subdir(pattern: str, cfg, overrides, num: int) -> str:
    dirname = ",".join(sorted(o for o in overrides if not o.startswith("hydra")))
    node = OmegaConf.create({**cfg.to_dict(), "_subdir": pattern,
                             "hydra": {"job": {"num": num, "id": str(num), "name": "launch",
                                               "override_dirname": dirname}}})
    return str(node._subdir)


def _name(r, sweep_dir: Path) -> str:
    """A run's folder relative to the sweep folder (how .rw_sweep.json names it)."""
    return Path(os.path.relpath(r.run_dir, sweep_dir)).as_posix()


def _compact_ids(job_ids: List[str]) -> str:
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


def _job_return(r, skipped: bool, summary: Optional[dict], error: Optional[str]) -> JobReturn:
    """The folder is the source of truth; no summary means the job died before this run ended."""
    if skipped:
        from rw_sweeps import results

        summary = results.read_summary(r.run_dir)
    s = summary if summary is not None else {"status": "failed",
                                             "error": error or "the job ended without writing a summary"}
    ret = JobReturn(overrides=r.overrides, working_dir=str(r.run_dir), task_name="launch")
    ret.status = JobStatus.COMPLETED
    ret.return_value = {**s, "skipped": skipped}
    return ret


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"
