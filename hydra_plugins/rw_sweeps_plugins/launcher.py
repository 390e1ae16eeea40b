"""`hydra/launcher=packed | local_gpus | packed_gpus | slurm | packed_slurm`: one launcher, three places to
run (`backend`: this process, one process per visible GPU, SLURM job arrays) and two ways to cut the grid.

Every job is a Hydra job. For any task, each job goes through Hydra's `run_job` (its folder, `.hydra/`
files, log, `env_set`, callbacks), one at a time (`local`), one per GPU (`local_gpus`) or one SLURM array
task each (`slurm`), as Hydra's basic launcher and hydra-submitit-launcher run it. With `pack: true` and the
project's own task (one that declares its batched twin, `rw_sweeps.sweeps.app.batched`), jobs of one shape are
trained together instead: `rw_sweeps.sweeps.hydra_job.Chunk` does for every run what `run_job` does, and replaces
only the call of the task by one call of the twin for the whole chunk.

launch = plan (a spec per job: config, folder; runs already done are not dispatched) → record (the sweep's
`.rw_sweep.json`, read by `python -m rw_sweeps.sweeps.status`) → dispatch (chunks or single jobs, by backend) →
collect (a JobReturn per job, in job order, keyed by run name; a job that died is read from its folder).
"""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import itertools
import logging
import os
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher

from rw_sweeps.core.errors import ConfigError, Interrupted, one_line
from rw_sweeps.sweeps.hydra_adapter import SUBMITIT_ENTRY, job_value, observes_jobs, sbatch_script

log = logging.getLogger(__name__)
LOCAL_TIMEOUT_MIN = 60 * 24 * 365  # local jobs have no time limit (timeout_min is SLURM's)


@dataclass
class RwLauncherConf:
    """The schema of every rw preset; the preset files hold only their deltas."""
    _target_: str = "hydra_plugins.rw_sweeps_plugins.launcher.RwLauncher"
    backend: str = "local"  # local | local_gpus | slurm
    pack: bool = True  # many same-shape runs per job, trained as one batched program (project's task only)
    memory_gb: Optional[float] = None  # packed: a chunk's memory budget (null: 2 GB on a CPU, a GPU's free memory)
    max_runs_per_job: Optional[int] = None  # packed: cap on runs per chunk (null: by memory only)
    write_behind: Optional[bool] = None  # packed: write a chunk's results while the next trains (null: on a GPU only)
    lean: bool = False  # packed: skip each run's .hydra/hydra.yaml and <job>.log (grids of 100k runs)
    wait_for_lock: bool = False  # another launch holds the sweep folder: wait for it (else: refuse, one line)
    overwrite: bool = False  # train over run folders that hold a run of another config (else: refuse, one line)
    detach: bool = False  # slurm: submit, print the job ids and return
    dry_run: bool = False  # print the plan (slurm: the sbatch scripts) and stop: nothing written or submitted
    poll_s: float = 5.0  # slurm, blocking: seconds between questions to SLURM while waiting
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # SLURM: the names and meanings of hydra-submitit-launcher 1.2.0's `submitit_slurm`
    timeout_min: int = 60  # --time; a job at its limit is requeued (max_num_timeout times) and resumes
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tasks_per_node: int = 1
    mem_gb: Optional[float] = None  # --mem in GB
    nodes: int = 1
    name: str = "${hydra.job.name}"
    stderr_to_stdout: bool = False
    partition: Optional[str] = None  # null: the cluster's default partition
    qos: Optional[str] = None
    comment: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    gres: Optional[str] = None  # or gpus_per_node (set one, not both)
    cpus_per_gpu: Optional[int] = None
    gpus_per_task: Optional[int] = None
    mem_per_gpu: Optional[str] = None
    mem_per_cpu: Optional[str] = None
    account: Optional[str] = None
    signal_delay_s: int = 60  # --signal=USR2@N: submitit requeues the job N s before its time limit
    max_num_timeout: int = 3  # requeues after a time limit (preemptions are always requeued)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option
    array_parallelism: int = 256  # --array=0-(n-1)%N: at most N jobs of an array run at once
    max_array_size: Optional[int] = None  # null: the cluster's MaxArraySize; larger grids become several arrays
    setup: List[str] = field(default_factory=list)  # shell lines before the job (module load, venv…)
    srun_args: Optional[List[str]] = None  # extra arguments of the srun that starts the job


ConfigStore.instance().store(group="hydra/launcher", name="rw", node=RwLauncherConf, provider="rw_sweeps")
SLURM_KEYS = ("partition", "account", "qos", "comment", "constraint", "exclude", "cpus_per_task", "gpus_per_node",
              "gres", "cpus_per_gpu", "gpus_per_task", "mem_per_gpu", "mem_per_cpu", "nodes", "stderr_to_stdout",
              "srun_args")


# Values that become `#SBATCH` lines or shell lines of the job script. A newline would start a line of its
# own (a command), and shlex.quote does not neutralise it there: control characters are refused everywhere,
# and scheduler names get the character set SLURM itself uses.
NAME_KEYS = ("partition", "account", "qos", "name", "gres", "constraint", "exclude", "mem_per_gpu", "mem_per_cpu")
SAFE_NAME = re.compile(r"[A-Za-z0-9_.,:=+@%/\-\[\]|&*!()]+")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_script_values(p: Dict[str, Any]) -> None:
    """One line and exit 2 for any value that could smuggle a command into a generated sbatch script."""
    for key in NAME_KEYS:
        v = p.get(key)
        if v is not None and not SAFE_NAME.fullmatch(str(v)):
            _bad(key, v, "may only hold letters, digits and _.,:=+@%/-[]|&*!() (it becomes an #SBATCH line)")
    values = [(k, v) for k, v in p.items() if k not in NAME_KEYS and k != "additional_parameters"]
    values += [(f"additional_parameters.{k}", v) for k, v in (p.get("additional_parameters") or {}).items()]
    values += [(f"additional_parameters.{k}", k) for k in (p.get("additional_parameters") or {})]
    for key, v in values:
        for item in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(item, str) and CONTROL.search(item):
                _bad(key, item, "must not contain control characters such as newlines (each would become a "
                     "line of the job script)")


def _bad(key: str, value: Any, allowed: str) -> None:
    """Refused before anything is launched: one line (Hydra prints it as its own; the front door exits 2)."""
    raise ConfigError(f"hydra.launcher.{key}", value, allowed)


# ------------------------------------------------------------------------------------------ jobs
class HydraJob:
    """One job through Hydra's `run_job`, wherever it runs (what hydra-submitit-launcher's `__call__` does)."""

    def __init__(self, launcher: "RwLauncher", overrides: List[str], num: int, project: bool,
                 output_dir: Optional[str] = None):
        self.hydra_context, self.task_function = launcher.hydra_context, launcher.task_function
        self.config, self.overrides, self.num, self.project = launcher.config, list(overrides), num, project
        self.output_dir = output_dir  # the project's runs: checked for planted links before run_job writes
        self.singleton_state = Singleton.get_state()

    def __call__(self) -> JobReturn:
        from omegaconf import open_dict

        from hydra.core.utils import run_job, setup_globals

        remote = _job_id() is not None
        if remote:
            Singleton.set_state(self.singleton_state)
            setup_globals()
        if self.output_dir is not None:  # Hydra's run_job writes `.hydra/` and the log with plain open()
            from rw_sweeps.core.safefs import refuse_links

            refuse_links(Path(self.output_dir), self.config.hydra.output_subdir)
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, self.overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = _job_id() or str(self.num)  # as Hydra's basic launcher, or submitit's job id
            cfg.hydra.job.num = self.num
        ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        if remote and self.project and ret.status == JobStatus.FAILED:
            raise job_value(ret)  # the scheduler records the job FAILED; its folder says why
        return ret

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """On submitit's preemption/timeout signal: requeue the same job (runs resume from checkpoints)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class ChunkJob:
    """A packed chunk, wherever it runs (this process, a process pinned to a GPU, a SLURM array task)."""

    def __init__(self, chunk, memory_gb: Optional[float] = None, label: Optional[str] = None,
                 finished_after: Optional[str] = None):
        self.chunk, self.memory_gb, self.singleton_state = chunk, memory_gb, Singleton.get_state()
        self.label = label  # "job 2/3: 4 run(s), runs 5–8 of 12", said when it starts
        self.finished_after = finished_after  # "8 of 12 runs finished", said when it ends in this process

    def __call__(self) -> List[JobReturn]:
        from hydra.core.utils import setup_globals

        job_id = _job_id()
        if job_id is not None:
            Singleton.set_state(self.singleton_state)
            setup_globals()
            self.chunk.job_id = job_id
        if job_id is None and self.finished_after:  # the jobs of this process run in turn: the count is true
            self.chunk.said_after = f"{self.finished_after} so far"
        returns = self._train()
        if job_id is not None:  # this job's own process ends here: its results and wandb logging first
            _wait_for_writes()
        failed = [r.working_dir for r in returns if r.status == JobStatus.FAILED]
        if failed and job_id is not None:  # after every result is written: the scheduler says FAILED
            from rw_sweeps.sweeps.packing import RunsFailed

            raise RunsFailed(f"{len(failed)} run(s) failed: " + ", ".join(failed[:5]))
        return returns

    def _train(self) -> List[JobReturn]:
        """The chunk, in pieces that fit this process's GPU when it has one (a SLURM job's allocated GPU)."""
        from dataclasses import replace

        from rw_sweeps.sweeps.packing import chunks, gpu_budget_gb

        if self.label:
            print(self.label, flush=True)
        budget = gpu_budget_gb(self.memory_gb) if self.chunk.specs and _job_id() is not None else None
        if budget is None:
            return self.chunk()
        return [r for part in chunks(self.chunk.specs, budget) for r in replace(self.chunk, specs=part)()]

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        print(f"rw_sweeps: job interrupted, requeued (pid {os.getpid()})", file=sys.stderr, flush=True)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class GpuJob:
    """Every chunk planned for one GPU (or, without a GPU, for the CPU), trained in turn in one process:
    the imports and CUDA start are paid once per GPU, not once per chunk. Each chunk keeps its Hydra
    envelope (`Chunk`) and its re-split to the GPU's actual free memory (`ChunkJob._train`); a chunk that
    raises fails its own runs only (its result is the exception; the launcher reads its runs from their
    folders) and the next chunk runs."""

    def __init__(self, chunks: List[ChunkJob]):
        self.chunks, self.singleton_state = list(chunks), Singleton.get_state()

    def __call__(self) -> List[Any]:
        from hydra.core.utils import setup_globals

        job_id = _job_id()
        if job_id is not None:
            Singleton.set_state(self.singleton_state)
            setup_globals()
        from rw_sweeps.core import trainer
        out: List[Any] = []
        for i, job in enumerate(self.chunks):
            if job_id is not None:
                job.chunk.job_id = job_id
            if i + 1 < len(self.chunks):  # the next chunk's data are drawn on the host while this one trains
                try:
                    nxt = [s.cfg for s in self.chunks[i + 1].chunk.specs if getattr(s, "cfg", None)]
                    if nxt:
                        trainer.of(nxt[0]).prefetch(nxt)
                except Exception:  # noqa: BLE001 - only an optimisation: the chunk draws its own data
                    pass
            try:
                out.append(job._train())
            except Exception as exc:  # noqa: BLE001 - one chunk's crash never takes its GPU's others down
                print(f"rw_sweeps: a chunk of {len(job.chunk.specs)} run(s) failed: {one_line(exc)}",
                      file=sys.stderr, flush=True)
                out.append(exc)
        _wait_for_writes()  # this process ends here: its results and wandb logging first
        return out


def _job_id() -> Optional[str]:
    """The submitit job id when running inside a submitit job, else None."""
    if "SUBMITIT_EXECUTOR" not in os.environ and "SUBMITIT_FOLDER" not in os.environ:
        return None
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------------------ the launcher
class RwLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.config = self.hydra_context = self.task_function = None
        self.record: Optional[dict] = None  # .rw_sweep.json, grown batch after batch
        self.planner = None
        self.skipped: set = set()  # output dirs of the runs found done (not trained again)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        p = self.params
        if p["backend"] not in ("local", "local_gpus", "slurm"):
            _bad("backend", p["backend"], "must be local, local_gpus or slurm")
        if p.get("gres") and p.get("gpus_per_node"):
            _bad("gres", p["gres"], "set gres or gpus_per_node, not both")
        if p["detach"] and p["backend"] != "slurm":
            _bad("detach", True, "needs the slurm backend (hydra/launcher=slurm or packed_slurm)")
        if p["memory_gb"] is not None and not p["memory_gb"] > 0:
            _bad("memory_gb", p["memory_gb"], "must be > 0")
        if p.get("max_runs_per_job") is not None and p["max_runs_per_job"] < 1:
            _bad("max_runs_per_job", p["max_runs_per_job"], "must be >= 1 or null")
        if p["backend"] == "slurm":
            check_script_values(p)

    @property
    def sweep_label(self) -> str:
        """The sweep folder as the sweeper's summary line prints it (resolved once: `${now:…}` and all)."""
        if getattr(self, "_label", None) is None:
            self._label = str(Path(str(self.config.hydra.sweep.dir)))
        return self._label

    @property
    def sweep_dir(self) -> Path:
        label = self.sweep_label
        if getattr(self, "_sweep_dir", (None,))[0] != label:
            self._sweep_dir = (label, Path(label).absolute())
        return self._sweep_dir[1]

    def batch_function(self) -> Optional[Callable]:
        from rw_sweeps.sweeps.app import batch_function

        return batch_function(self.task_function)

    # ---------------------------------------------------------------------------------------- launch
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Optional[Sequence[JobReturn]]:
        self._reset_logging()
        twin = self.batch_function()
        if twin is None:  # any other task: Hydra's own semantics, job by job
            return self._launch_jobs(job_overrides, initial_job_idx)
        from rw_sweeps.sweeps.planner import Planner

        if self.planner is None:
            self.planner = Planner(self.hydra_context.config_loader, self.config)
        return self.launch_specs(self.planner.plan(job_overrides, initial_job_idx), twin, self.planner)

    def _reset_logging(self) -> None:
        """As Hydra's basic launcher: the sweep's own logging, not the last job's (its log file may be gone)."""
        from hydra.core.utils import configure_log, setup_globals

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)

    def launch_specs(self, specs: list, twin: Callable, planner) -> Optional[Sequence[JobReturn]]:
        """The project's jobs, already planned by `planner` (the rw sweeper passes its validated specs)."""
        from rw_sweeps.sweeps import packing, status
        from rw_sweeps.sweeps.hydra_job import Chunk

        self._reset_logging()
        p = self.params
        done_idx = self.place(specs, planner)
        todo = [s for i, s in enumerate(specs) if i not in done_idx]
        done = [s for i, s in enumerate(specs) if i in done_idx]
        self.skipped |= {s.output_dir for s in done}
        cut = packing.plan(todo, p, p["pack"])
        jobs, per_device = cut.jobs, cut.per_device
        if p["dry_run"]:
            self._dry_run(specs, done, jobs)
            return None
        observed = observes_jobs(self.hydra_context.callbacks)  # only then are per-run DictConfigs built

        def chunk(group: list, finished: bool = False) -> Chunk:
            return Chunk(group, twin, self.hydra_context, self.task_function,
                         planner if observed else None, lean=p["lean"], finished=finished,
                         write_behind=p["write_behind"])

        def done_jobs() -> Dict[int, JobReturn]:  # done runs still go through their Hydra job, without training
            return dict(zip([s.num for s in done], chunk(done, finished=True)())) if done else {}

        if not todo and not os.access(self.sweep_dir, os.W_OK | os.X_OK):
            # a read-only sweep whose runs are all done: their Hydra jobs, and nothing written
            returns = done_jobs()
            log.info(f"{p['backend']} launcher: {len(specs)} runs, all already done; sweep folder {self.sweep_dir}")
            return [returns[s.num] for s in specs]
        self._lock()
        rec = self._record(specs, done, todo)
        log.info(f"{cut.line(len(specs), len(done), 'hydra.launcher.pack=false')}; sweep folder {self.sweep_dir}")
        returns: Dict[int, JobReturn] = done_jobs()
        ends = list(itertools.accumulate((len(j) for j in jobs), initial=len(done)))[1:]  # runs up to each job
        payloads = [ChunkJob(chunk(job), p["memory_gb"],
                             f"job {k + 1}/{len(jobs)}: {len(job)} run(s), runs {ends[k] - len(job) + 1}–{ends[k]} "
                             f"of {len(specs)}" + (f" ({len(done)} skipped, done)" if done and k == 0 else ""),
                             f"{ends[k]} of {len(specs)} runs finished" if len(jobs) > 1 else None)
                    if p["pack"] else HydraJob(self, job[0].overrides, job[0].num, True, job[0].output_dir)
                    for k, job in enumerate(jobs)]
        if per_device is not None:  # one GpuJob per device, its chunks in turn; a result per chunk again
            starts = [sum(len(d) for d in per_device[:g]) for g in range(len(per_device))]
            gpu_jobs = [GpuJob(payloads[a:a + len(d)]) if d else None for a, d in zip(starts, per_device)]
            per_gpu = self._dispatch(gpu_jobs, [[s for job in d for s in job] for d in per_device], rec, pinned=True)
            results = [r for d, res in zip(per_device, per_gpu)
                       for r in (res if isinstance(res, list) and len(res) == len(d) else [res] * len(d))]
        else:
            results = self._dispatch(payloads, jobs, rec)
        _wait_for_writes()  # the results and wandb logging of the chunks trained here
        if results is None:
            return None
        for job, res in zip(jobs, results):  # collect: a job that died is read from its run folders
            rets = res if isinstance(res, list) else [res] if isinstance(res, JobReturn) else None
            if rets is None or len(rets) != len(job):
                tracker = status.Sweep(self.sweep_dir, record=rec)
                rets = [_from_folder(s, res, tracker.summary(self._name(s))) for s in job]
            returns.update({s.num: r for s, r in zip(job, rets)})
        return [returns[s.num] for s in specs]

    def place(self, specs: list, planner) -> set:
        """Every spec's folder (`rw_sweeps.sweeps.placement`, once per spec: the rw sweeper places the whole grid
        before its first batch); the indices of the runs already done. A conflict is one line, exit 2."""
        from rw_sweeps.sweeps import placement
        if all(getattr(s, "placed", None) is not None for s in specs):
            return {i for i, s in enumerate(specs) if isinstance(s.placed, dict)}
        default_subdir = planner.subdir == "${hydra.job.num}"
        # FolderTaken: refused, in one line, before anything is written
        found = placement.place(specs, self.sweep_dir, default_subdir, self.params.get("overwrite", False))
        here = os.getpid()
        for i, s in enumerate(specs):
            s.placed, s.placed_in = found.done.get(i, False), here
        return set(found.done)

    def _launch_jobs(self, job_overrides, initial_job_idx) -> Optional[Sequence[JobReturn]]:
        """Any task, one Hydra job per job, as Hydra's basic launcher / hydra-submitit-launcher run it."""
        from hydra.core.utils import filter_overrides

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        from rw_sweeps.sweeps.app import NOT_DECLARED
        from rw_sweeps.sweeps.packing import plan

        cut = plan(list(job_overrides), self.params, pack=False)
        why = NOT_DECLARED if self.params["pack"] else "hydra.launcher.pack=false"
        log.info(f"{cut.line(len(job_overrides), 0, why)}; sweep folder {self.sweep_dir}")
        payloads, nums = [], []
        for i, ov in enumerate(job_overrides):
            num = initial_job_idx + i
            log.info(f"\t#{num} : {' '.join(filter_overrides(ov))}")
            payloads.append(HydraJob(self, list(ov), num, False))
            nums.append(num)
        results = self._dispatch(payloads, [[n] for n in nums], None)
        if results is None:
            return None
        out = []
        for ov, res in zip(job_overrides, results):
            if isinstance(res, JobReturn):
                out.append(res)
            else:  # the job's process died: a failed JobReturn with the reason
                ret = JobReturn(overrides=list(ov), task_name=str(self.config.hydra.job.name))
                ret.status, ret.return_value = JobStatus.FAILED, res
                out.append(ret)
        return out

    def _lock(self) -> None:
        """One launch per sweep folder (`rw_sweeps.sweeps.lock`), held until this process ends, also when a
        signal ends it (`rw_sweeps.sweeps.signals.on_stop`). Once it is held, the temp files that killed
        writes left in the folder are removed (no other launch can be writing them)."""
        import atexit

        from rw_sweeps.core.safefs import remove_stale_temps
        from rw_sweeps.core import signals
        from rw_sweeps.sweeps import lock
        if self.record is not None or getattr(self, "_locked", None) == self.sweep_dir:
            return  # a later batch of this sweep: already held
        lock.acquire(self.sweep_dir, wait=self.params["wait_for_lock"])  # SweepLocked: refused, in one line
        self._locked = sweep_dir = self.sweep_dir
        atexit.register(lock.release, sweep_dir)
        signals.on_stop(lambda: lock.release(sweep_dir))
        remove_stale_temps(sweep_dir)

    # ---------------------------------------------------------------------------------------- record
    def _record(self, specs, done, todo) -> dict:
        from rw_sweeps.sweeps import status
        if self.record is None:
            self.record = status.new_record(self.sweep_label, self.params["backend"], detached=self.params["detach"])
        rec = self.record
        names = {id(s): self._name(s) for s in specs}
        rec["runs"] += [names[id(s)] for s in specs]
        rec["skipped"] += [names[id(s)] for s in done]
        try:  # only a folder that is there can hold an old summary: one listing, not a stat per run
            present = set(os.listdir(self.sweep_dir))
        except OSError:
            present = set()
        rec["stale"].update({names[id(s)]: fp for s in todo if names[id(s)].split("/")[0] in present
                             and (fp := status.fingerprint(s.output_dir))})
        return rec

    def _name(self, spec) -> str:
        """A run's folder relative to the sweep folder (how .rw_sweep.json names it)."""
        root = str(self.sweep_dir) + os.sep
        if spec.output_dir.startswith(root) and os.sep + "." not in spec.output_dir[len(root) - 1:]:
            return spec.output_dir[len(root):].replace(os.sep, "/")  # the common case, without a path object
        return Path(os.path.relpath(spec.output_dir, self.sweep_dir)).as_posix()

    # ---------------------------------------------------------------------------------------- dispatch
    def _dispatch(self, payloads: list, jobs: list, rec: Optional[dict], pinned: bool = False) -> Optional[list]:
        """Run every payload on the backend; a result per payload (its return value, or the exception that
        ended it), or None when detached. `pinned` (local_gpus): payload i is GPU i's, all started at once."""
        from rw_sweeps.sweeps import status
        backend = self.params["backend"]
        names = [[self._name(s) if rec is not None else str(s) for s in job] for job in jobs]
        if backend == "slurm":
            return self._slurm(payloads, names, rec)
        if rec is not None:
            rec["jobs"].setdefault("local", []).extend(n for job in names for n in job)
            status.write_record(self.sweep_dir, rec)
        if backend == "local":
            out = []
            for payload in payloads:
                try:
                    out.append(payload())
                except Exception as exc:  # noqa: BLE001 - a crash of one job never takes the sweep down
                    out.append(exc)
            return out
        return self._local_gpus(payloads, pinned)

    def _local_gpus(self, payloads: list, pinned: bool = False) -> list:
        """At most one job per GPU at a time, each pinned to its device through CUDA_VISIBLE_DEVICES; with
        `pinned`, payload i runs on GPU i (packed: one process per GPU trains all of that GPU's chunks; a
        None payload, a GPU with nothing to do, starts no process and returns [])."""
        import submitit

        from rw_sweeps.sweeps.packing import visible_gpus

        gpus = visible_gpus()
        folder = self.params["submitit_folder"]
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

    def _slurm(self, payloads: list, names: list, rec: Optional[dict]) -> Optional[list]:
        import submitit

        from rw_sweeps.sweeps import status
        p = self.params
        ex = submitit.SlurmExecutor(folder=p["submitit_folder"], max_num_timeout=p["max_num_timeout"])
        ex.update_parameters(**slurm_parameters(p))
        limit = p["max_array_size"] or slurm_max_array_size()
        submitted = []
        for start in range(0, len(payloads), limit):  # no array larger than the cluster allows
            submitted += ex.submit_array(payloads[start:start + limit])
        if rec is None:  # any other task: wait as hydra-submitit-launcher does
            return [_result_or_error(j) for j in submitted]
        for j, job in zip(submitted, names):
            rec["jobs"][j.job_id] = job
        rec["arrays"] += sorted({j.job_id.split("_")[0] for j in submitted}, key=int)
        status.write_record(self.sweep_dir, rec)
        ids = _compact_ids([j.job_id for j in submitted])
        follow = f"python -m rw_sweeps.sweeps.status {shlex.quote(str(self.sweep_dir))} --wait"
        n = sum(len(job) for job in names)
        if p["detach"]:
            from rw_sweeps.sweeps import lock
            lock.hand_to_jobs(self.sweep_dir, rec["arrays"])
            print(f"submitted {n} run(s) ({len(rec['skipped'])} already done) as {len(submitted)} SLURM "
                  f"job(s): {ids or 'none'}\nsweep folder: {self.sweep_dir}\nfollow with: {follow}", flush=True)
            return None
        log.info(f"submitted {len(submitted)} SLURM job(s): {ids or 'none'}; waiting (Ctrl-C stops waiting, "
                 f"not the jobs; follow again with: {follow})")
        try:
            status.Sweep(self.sweep_dir, record=rec).follow(interval=p["poll_s"])
        except KeyboardInterrupt:  # the jobs go on: the lock is theirs until they have ended
            from rw_sweeps.sweeps import lock
            lock.hand_to_jobs(self.sweep_dir, rec["arrays"])
            raise Interrupted(f"\nstopped waiting; the jobs go on ({ids}). Follow them with: {follow}\n"
                              f"or cancel them with: scancel {' '.join(rec['arrays'])}") from None
        return [_result_or_error(j, wait=False) for j in submitted]

    def _dry_run(self, specs, done, jobs) -> None:
        p = self.params
        print(f"dry run: {len(specs)} runs ({len(done)} already done) in {len(jobs)} job(s)"
              f"{' (packed)' if p['pack'] else ''} on {p['backend']}; sweep folder {self.sweep_dir}", flush=True)
        for i, job in enumerate(jobs[:20]):
            names = [self._name(s) for s in job]
            shown = ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])} … {', '.join(names[-2:])}"
            print(f"  job {i}: {len(job)} run(s): {shown}")
        if len(jobs) > 20:
            print(f"  … and {len(jobs) - 20} more job(s)")
        if p["backend"] == "slurm":
            print(sbatch_scripts(p, len(jobs)), end="", flush=True)


def _result_or_error(job, wait: bool = True) -> Any:
    try:
        if not wait and not job.done():
            return RuntimeError(f"job {job.job_id} has not finished")
        return job.result()
    except Exception as exc:  # noqa: BLE001
        return exc


def _from_folder(spec, error: Any, summary: Optional[dict]) -> JobReturn:
    """A run whose job died or failed: its JobReturn from its folder (the source of truth)."""
    from rw_sweeps.sweeps.app import RunFailed, _result
    from rw_sweeps.sweeps.hydra_job import LazyJobReturn
    from rw_sweeps.sweeps.run import run_line

    ret = LazyJobReturn(spec, overrides=list(spec.overrides), working_dir=spec.output_dir, task_name=spec.name)
    if summary is not None and summary.get("status") in ("done", "diverged"):
        ret.status, ret.return_value = JobStatus.COMPLETED, _result(spec.cfg, summary)
    else:
        reason = summary.get("error") if summary else one_line(error) if isinstance(error, BaseException) \
            else "the job ended without writing a summary"
        ret.status = JobStatus.FAILED
        ret.return_value = RunFailed(run_line(summary) if summary else f"failed: {reason}")
    return ret


# ------------------------------------------------------------------------------------------ helpers
LOCAL_STOP_S = 300.0  # how long an interrupted launch waits for its local jobs to checkpoint and end


def _stop_local_jobs(jobs: list, exc: BaseException) -> None:
    """The launching process was interrupted while local submitit jobs ran: each job's task process (the
    child of submitit's controller) gets SIGINT, so that it checkpoints its runs at the end of the current
    step and ends, writing the results it has finished; the launch then ends once they have (at most
    LOCAL_STOP_S). Not the controller: it would SIGKILL its task a second later. Not SIGTERM: inside a
    submitit job it is only logged. A job left running would go on writing into the sweep after its lock
    is released."""
    from rw_sweeps.core import signals

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


def _wait_for_writes() -> None:
    """This process's results still being written (`rw_sweeps.sweeps.writer`), then its queued wandb logging
    (`rw_sweeps.sweeps.tracking`, which the writes feed), before its work counts as ended."""
    from rw_sweeps.sweeps import tracking, writer
    writer.flush()
    tracking.wait()


def slurm_max_array_size() -> int:
    """The cluster's MaxArraySize (an array holds at most that many tasks); SLURM's default is 1001."""
    import subprocess

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



