"""`hydra/launcher=packed | local_gpus | packed_gpus | slurm | packed_slurm`: one launcher, three places
to run and two ways to cut the grid.

- backend `local` trains in this process; `local_gpus` runs one submitit job per visible GPU at a time,
  each pinned to its own device (submitit's stock local launcher gives every job every GPU at once);
  `slurm` submits job arrays through submitit, split so no array exceeds the cluster's MaxArraySize.
- `pack: true` trains every chunk of same-shape runs as one batched program (`rw_sweeps.packing`);
  `pack: false` gives every run its own job, as Hydra's stock launchers do.

Runs already `done` in the sweep folder are skipped before anything is submitted (resume). A job that is
preempted or times out on SLURM is requeued by submitit and continues from its runs' checkpoints. A job
with a failed run exits non-zero, so SLURM shows FAILED rather than a silent COMPLETED. `detach: true`
submits, records the jobs in `<sweep>/.rw_sweep.json`, prints how to follow them
(`python -m rw_sweeps.status <sweep> --wait`) and returns at once.
"""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import json
import logging
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher

log = logging.getLogger(__name__)
STATE = ".rw_sweep.json"


@dataclass
class RwLauncherConf:
    _target_: str = "hydra_plugins.rw_sweeps_plugins.launcher.RwLauncher"
    backend: str = "local"  # local | local_gpus | slurm
    pack: bool = True  # many same-shape runs per job, trained as one batched program
    memory_gb: float = 2.0  # packed: memory budget of one chunk (a GPU's budget is its free memory)
    max_runs_per_job: Optional[int] = None  # packed: cap on runs per chunk (null: by memory only)
    detach: bool = False  # slurm: submit, print the job ids and return
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # SLURM (names as in hydra-submitit-launcher; every one can be overridden on the command line)
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    timeout_min: int = 60
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    gres: Optional[str] = None
    mem_gb: Optional[int] = None
    array_parallelism: int = 256
    max_array_size: Optional[int] = None  # null: the cluster's MaxArraySize (scontrol show config)
    max_num_timeout: int = 3  # requeues after a time limit (preemptions are always requeued)
    signal_delay_s: int = 60
    setup: List[str] = field(default_factory=list)  # shell lines before the job (module load, venv…)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option


ConfigStore.instance().store(group="hydra/launcher", name="rw", node=RwLauncherConf, provider="rw_sweeps")


def slurm_max_array_size() -> int:
    """The cluster's MaxArraySize (array indices must stay below it); SLURM's default is 1001."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if line.split("=")[0].strip() == "MaxArraySize":
                return int(line.split("=")[1])
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return 1001


def visible_gpus() -> List[int]:
    try:
        import torch

        return list(range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001
        return []


class RwLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.plans: Dict[tuple, Any] = {}  # filled by the rw sweeper: overrides → validated RunConfig
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        if self.params["backend"] not in ("local", "local_gpus", "slurm"):
            raise ValueError(f"hydra.launcher.backend={self.params['backend']!r}: must be local, local_gpus or slurm")

    # ----------------------------------------------------------------------------------------------------
    def runs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        from rw_sweeps.packing import Run
        from rw_sweeps.sweep import Planner

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        subdir = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)["subdir"]
        group = "/".join(sweep_dir.parts[-2:])
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
        from rw_sweeps import packing, run

        p = self.params
        runs = self.runs(job_overrides, initial_job_idx)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        todo = [r for r in runs if not run.is_done(r.cfg, r.run_dir)]
        skipped = {r.num for r in runs} - {r.num for r in todo}
        memory = p["memory_gb"]
        if p["backend"] in ("local_gpus",) and visible_gpus():
            memory = _gpu_budget_gb(memory)
        jobs = packing.chunks(todo, memory, p["max_runs_per_job"]) if p["pack"] else [[r] for r in todo]
        for r in todo:
            packing.write_overrides(r)
        log.info(f"{p['backend']} launcher: {len(runs)} runs ({len(skipped)} already done) in {len(jobs)} job(s)"
                 f"{' (packed)' if p['pack'] else ''}; sweep folder {sweep_dir}")
        payloads = [([r.cfg.to_dict() for r in job], [str(r.run_dir) for r in job]) for job in jobs]
        errors: Dict[int, str] = {}
        if p["backend"] == "local":
            errors = self._local(payloads, jobs)
        elif p["backend"] == "local_gpus":
            errors = self._local_gpus(payloads, jobs)
        else:
            errors = self._slurm(payloads, jobs, sweep_dir)
            if errors is None:
                return None
        return [_job_return(r, r.num in skipped, errors.get(r.num)) for r in runs]

    # ----------------------------------------------------------------------------------------------------
    def _local(self, payloads, jobs) -> Dict[int, str]:
        from rw_sweeps.packing import ChunkJob

        errors = {}
        for (cfgs, dirs), job in zip(payloads, jobs):
            try:
                ChunkJob()(cfgs, dirs, fail_job_on_failed_run=False)
            except Exception as exc:  # noqa: BLE001 - a crash of one chunk never takes the sweep down
                errors.update({r.num: f"{type(exc).__name__}: {exc}" for r in job})
        return errors

    def _local_gpus(self, payloads, jobs) -> Dict[int, str]:
        """At most one job per GPU at a time, each pinned to its device through CUDA_VISIBLE_DEVICES."""
        import submitit

        from rw_sweeps.packing import ChunkJob

        gpus = visible_gpus()
        folder = self.params["submitit_folder"]
        if gpus:
            executors = []
            for g in gpus:
                ex = submitit.LocalExecutor(folder=folder)
                ex.update_parameters(timeout_min=self.params["timeout_min"], gpus_per_node=1, visible_gpus=[g])
                executors.append(ex)
        else:
            log.warning("local_gpus: no GPU visible: running the jobs on the CPU, one at a time")
            ex = submitit.LocalExecutor(folder=folder)
            ex.update_parameters(timeout_min=self.params["timeout_min"])
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
                    except Exception as exc:  # noqa: BLE001
                        errors.update({r.num: _first_line(exc) for r in job})
        return errors

    def _slurm(self, payloads, jobs, sweep_dir: Path) -> Optional[Dict[int, str]]:
        import submitit

        from rw_sweeps.packing import ChunkJob

        p = self.params
        ex = submitit.AutoExecutor(folder=p["submitit_folder"], cluster="slurm",
                                   slurm_max_num_timeout=p["max_num_timeout"])
        ex.update_parameters(**slurm_parameters(p, name=str(self.config.hydra.job.name)))
        limit = p["max_array_size"] or slurm_max_array_size()
        submitted = []
        for start in range(0, len(payloads), limit):  # no array larger than the cluster allows
            part = payloads[start:start + limit]
            submitted += ex.map_array(ChunkJob(), [c for c, _ in part], [d for _, d in part])
        ids = sorted({j.job_id.split("_")[0] for j in submitted})
        if p["detach"]:
            state = {"jobs": [j.job_id for j in submitted], "arrays": ids,
                     "runs": [str(r.run_dir) for job in jobs for r in job], "submitted": time.time()}
            _write_json(sweep_dir / STATE, state)
            print(f"submitted {len(submitted)} job(s) in array(s) {', '.join(ids)} for sweep {sweep_dir}\n"
                  f"follow with: python -m rw_sweeps.status {sweep_dir} --wait", flush=True)
            return None
        log.info(f"waiting for {len(submitted)} SLURM job(s): {', '.join(ids)}")
        errors = {}
        for j, job in zip(submitted, jobs):
            try:
                j.results()
            except Exception as exc:  # noqa: BLE001 - a failed job: its runs say why on disk
                errors.update({r.num: _first_line(exc) for r in job})
        return errors


def slurm_parameters(p: Dict[str, Any], name: str = "rw_sweeps") -> Dict[str, Any]:
    """Our launcher keys → submitit's AutoExecutor parameters (and so sbatch flags)."""
    out: Dict[str, Any] = {"timeout_min": p["timeout_min"], "name": name,
                           "slurm_array_parallelism": p["array_parallelism"],
                           "slurm_signal_delay_s": p["signal_delay_s"]}
    for key, target in (("partition", "slurm_partition"), ("account", "slurm_account"), ("qos", "slurm_qos"),
                        ("cpus_per_task", "cpus_per_task"), ("gpus_per_node", "gpus_per_node"),
                        ("gres", "slurm_gres"), ("mem_gb", "mem_gb")):
        if p.get(key) is not None:
            out[target] = p[key]
    if p.get("setup"):
        out["slurm_setup"] = list(p["setup"])
    extra = dict(p.get("additional_parameters") or {})
    extra.setdefault("requeue", True)  # preempted jobs come back; submitit then resumes them
    out["slurm_additional_parameters"] = extra
    return out


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


def _job_return(r, skipped: bool, error: Optional[str]) -> JobReturn:
    from rw_sweeps import results

    s = results.read_summary(r.run_dir)
    if s is None:  # the folder is the source of truth; no summary means the job died before this run ended
        s = {"status": "failed", "error": error or "the job ended without writing a summary"}
    ret = JobReturn(overrides=r.overrides, working_dir=str(r.run_dir), task_name="launch")
    ret.status = JobStatus.COMPLETED
    ret.return_value = {**s, "skipped": skipped}
    return ret


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _write_json(path: Path, obj) -> None:
    from rw_sweeps import results

    results.atomic_write(path, json.dumps(obj, indent=1))

