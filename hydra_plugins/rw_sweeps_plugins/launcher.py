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

Here: `RwLauncher`, the adapter every backend shares, and one subclass per backend, which only runs the
payloads (`hydra.launcher.backend` picks it when Hydra instantiates `RwLauncher`). `_schema.py` holds the
keys, `_payload.py` what a job runs in its process, `_backends.py` the local GPU pool and the sbatch side.
Hydra's plugin scan executes this module again (not the `_` ones): the subclasses live beside their base.
"""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import atexit
import itertools
from collections import Counter
import logging
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from omegaconf import OmegaConf

from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher

from rw_sweeps.core import layout, signals, store
from rw_sweeps.core.errors import ConfigError, Interrupted, one_line
from rw_sweeps.core.metrics import OBJECTIVES
from rw_sweeps.core import safefs
from rw_sweeps.core.console import counted
from rw_sweeps.sweeps import app, lock, packing, placement, status
from rw_sweeps.sweeps.hydra_adapter import observes_jobs
from rw_sweeps.sweeps.hydra_job import Chunk, LazyJobReturn
from rw_sweeps.sweeps.planner import Planner
from rw_sweeps.sweeps.run import run_line

from hydra_plugins.rw_sweeps_plugins._backends import (compact_ids, local_gpu_pool, result_or_error,
                                                       sbatch_scripts, slurm_max_array_size, slurm_parameters)
from hydra_plugins.rw_sweeps_plugins._payload import ChunkJob, GpuJob, HydraJob, wait_for_writes
from hydra_plugins.rw_sweeps_plugins._schema import RwLauncherConf, check_script_values, refuse, register

__all__ = ["RwLauncher", "InProcessLauncher", "LocalGpusLauncher", "SlurmLauncher", "BACKENDS", "RwLauncherConf",
           "HydraJob", "ChunkJob", "GpuJob", "slurm_parameters", "sbatch_scripts", "check_script_values"]
log = logging.getLogger(__name__)
register()  # at each plugin scan, as before the split (a scan after Hydra's singletons are restored stores it again)



# Hydra's sweepers that optimise the number a job returns: with `objective` null the task returns the run's summary
# (a dict), which each of them rejects trial after trial ("Return value must be float-castable").
OPTIMISERS = ("OptunaSweeper", "NevergradSweeper", "AxSweeper")


def _objective_given(config, specs: list) -> None:
    """Refused before any job starts: an optimising sweeper with a job whose `objective` is null."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    sweeper = target.rsplit(".", 1)[-1]
    if sweeper in OPTIMISERS and any(s.cfg.objective is None for s in specs):
        raise ConfigError("objective", None, f"{sweeper} optimises the number each job returns: name the summary "
                          f"field it optimises, objective=<{' | '.join(OBJECTIVES)}>")

def kept_line(kept, retry: tuple) -> str:
    """The one line for the runs a relaunch found ended, diverged (or failed, where `retry` does not name it),
    and keeps as they are; it names the switch that trains them again."""
    by = Counter(str(s.get("status")) for s in kept)
    what = ", ".join(f"{n} {state}" for state, n in sorted(by.items()))
    again = placement.retry_switch(sorted(set(retry) | set(by)))
    return (f"kept {sum(by.values())} run(s) as they ended ({what}): an ended run's outcome is final; "
            f"{again} trains them again")


class RwLauncher(Launcher):
    """plan → place → record → dispatch → collect, for every backend. A subclass declares what is its
    backend's own: how its jobs are cut (`cut_into_jobs`), whether they train on this machine
    (`trains_here`), and how its payloads run (`run_payloads`)."""
    backend: Optional[str] = None  # the subclass's `hydra.launcher.backend`
    backends: Dict[str, type] = {}  # every subclass by its backend (set below them: `BACKENDS`)
    detaches = False  # can submit and return (`hydra.launcher.detach`)
    # trains_here: bool, each backend's own: its jobs train on this machine, so the rw sweeper checks before
    # launching that every run can (its device is visible, it fits in memory)

    def __new__(cls, **params: Any) -> "RwLauncher":
        """Hydra instantiates this class: `backend` names the subclass made. A backend that names none makes
        this class itself, whose `setup` refuses it in one line (a refusal, never a default)."""
        if cls.backend is None and isinstance(params.get("backend"), str):
            cls = cls.backends.get(params["backend"], cls)
        return super().__new__(cls)

    def __init__(self, **params: Any) -> None:
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.config = self.hydra_context = self.task_function = None
        self.record: Optional[dict] = None  # .rw_sweep.json, grown batch after batch
        self.planner = None
        self.skipped: set = set()  # output dirs of the runs found done (not trained again)
        self.batches = 0  # the sweeper's batches launched so far (Optuna's trials, the adaptive rounds)
        self.launched = 0  # and their runs: a batch's console lines number its jobs and runs across the sweep

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        p, names = self.params, list(self.backends)
        if p["backend"] not in names:
            refuse("backend", p["backend"], f"must be {', '.join(names[:-1])} or {names[-1]}")
        if p.get("gres") and p.get("gpus_per_node"):
            refuse("gres", p["gres"], "set gres or gpus_per_node, not both")
        retry = p.get("retry", list(placement.RETRY))
        if not isinstance(retry, list) or any(o not in placement.OUTCOMES for o in retry):
            refuse("retry", retry, placement.RETRY_RULE)
        if p["detach"] and not self.detaches:
            refuse("detach", True, "needs the slurm backend (hydra/launcher=slurm or packed_slurm)")
        if p["memory_gb"] is not None and not p["memory_gb"] > 0:
            refuse("memory_gb", p["memory_gb"], "must be > 0")
        if p.get("max_runs_per_job") is not None and p["max_runs_per_job"] < 1:
            refuse("max_runs_per_job", p["max_runs_per_job"], "must be >= 1 or null")

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
        return app.batch_function(self.task_function)

    # ---------------------------------------------------------------------------------------- launch
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Optional[Sequence[JobReturn]]:
        self._reset_logging()
        twin = self.batch_function()
        if twin is None:  # any other task: Hydra's own semantics, job by job
            return self._launch_jobs(job_overrides, initial_job_idx)
        if self.planner is None:
            self.planner = Planner(self.hydra_context.config_loader, self.config)
        specs = self.planner.plan(job_overrides, initial_job_idx)
        _objective_given(self.config, specs)
        return self.launch_specs(specs, twin, self.planner)

    def _reset_logging(self) -> None:
        """As Hydra's basic launcher: the sweep's own logging, not the last job's (its log file may be gone)."""
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)

    def launch_specs(self, specs: list, twin: Callable, planner) -> Optional[Sequence[JobReturn]]:
        """The project's jobs, already planned by `planner` (the rw sweeper passes its validated specs)."""
        self._reset_logging()
        p = self.params
        done_idx = self.place(specs, planner)
        todo = [s for i, s in enumerate(specs) if i not in done_idx]
        done = [s for i, s in enumerate(specs) if i in done_idx]  # not trained: found done, or kept as they ended
        found = [s for s in done if s.placed.get("status") == "done"]
        self.skipped |= {s.output_dir for s in found}
        cut = self.cut_into_jobs(todo, p["pack"])
        jobs, per_device = cut.jobs, cut.per_device
        if p["dry_run"]:
            self._dry_run(specs, found, jobs)
            return None
        observed = observes_jobs(self.hydra_context.callbacks)  # only then are per-run DictConfigs built

        stored = self.stores(specs)

        def chunk(group: list, finished: bool = False) -> Chunk:
            return Chunk(group, twin, self.hydra_context, self.task_function,
                         planner if observed else None, lean=p["lean"], finished=finished,
                         write_behind=p["write_behind"], stored=stored)

        def done_jobs() -> Dict[int, JobReturn]:  # done runs still go through their Hydra job, without training
            return dict(zip([s.num for s in done], chunk(done, finished=True)())) if done else {}

        if not todo and not os.access(self.sweep_dir, os.W_OK | os.X_OK):
            # a read-only sweep whose runs are all done: their Hydra jobs, and nothing written
            returns = done_jobs()
            log.info(f"{p['backend']} launcher: {counted(len(specs), 'run')}, all already done; sweep folder {self.sweep_dir}")
            return [returns[s.num] for s in specs]
        self.take_lock()
        rec = self._record(specs, found, todo)
        log.info(f"{cut.line(len(specs), len(found), 'hydra.launcher.pack=false')}; sweep folder {self.sweep_dir}")
        returns: Dict[int, JobReturn] = done_jobs()
        before, batch = self.launched, self._batch_label()
        self.launched += len(specs)
        ends = list(itertools.accumulate((len(j) for j in jobs), initial=before + len(done)))[1:]  # runs up to each job
        of = f"of the sweep's {self.launched} so far" if batch else f"of {len(specs)}"
        payloads = [ChunkJob(chunk(job), p["memory_gb"],
                             f"{batch}job {k + 1}/{len(jobs)}: {len(job)} run(s), runs {ends[k] - len(job) + 1}–{ends[k]} "
                             f"{of}" + (f" ({len(found)} skipped, done)" if found and k == 0 else ""),
                             f"{batch}{ends[k] - before} of {len(specs)} runs finished" if len(jobs) > 1 else None)
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
        wait_for_writes()  # the results and wandb logging of the chunks trained here
        if results is None:
            return None
        for job, res in zip(jobs, results):  # collect: a job that died is read from its run folders
            rets = res if isinstance(res, list) else [res] if isinstance(res, JobReturn) else None
            if rets is None or len(rets) != len(job):
                tracker = status.Sweep(self.sweep_dir, record=rec)
                rets = [_from_folder(s, res, tracker.summary(self._name(s))) for s in job]
            returns.update({s.num: r for s, r in zip(job, rets)})
        return [returns[s.num] for s in specs]

    def _batch_label(self) -> str:
        """"batch N, " for a sweeper that launches in batches (Optuna's `n_trials`, the adaptive rounds, a
        `max_batch_size`; any sweep from its second launch on), counted here; "" for a grid launched at once."""
        self.batches += 1
        sweeper = self.config.hydra.get("sweeper") or {} if self.config is not None else {}
        asks = ("n_trials", "n_points", "loss_goal", "max_batch_size")  # a sweeper's keys of a search in batches
        batched = self.batches > 1 or any(sweeper.get(k) is not None for k in asks)
        return f"batch {self.batches}, " if batched else ""

    def stores(self, specs: list) -> bool:
        """Whether this launch writes its runs to the sweep's store (`rw_sweeps.core.store`), decided at its
        first batch: `hydra.launcher.store` where it is set; else a sweep that has a store keeps it, one that
        has run folders keeps them (a sweep of an earlier version is resumed as it was written), and a new sweep
        of `store.STORE_FROM` runs or more is stored. Only packed jobs write a store."""
        if getattr(self, "_stores", None) is None:
            p = self.params
            if not p["pack"]:
                if p.get("store"):
                    log.info("hydra.launcher.store=true: only packed jobs write a store; with "
                             "hydra.launcher.pack=false each run is written to its own folder")
                self._stores = False
            elif p.get("store") is not None:
                self._stores = bool(p["store"])
            elif store.present(self.sweep_dir):
                self._stores = True
            else:
                self._stores = not layout.run_folders(self.sweep_dir) and len(specs) >= store.STORE_FROM
        return self._stores

    def place(self, specs: list, planner) -> set:
        """Every spec's folder (`rw_sweeps.sweeps.placement`, once per spec: the rw sweeper places the whole grid
        before its first batch); the indices of the runs already done. A conflict is one line, exit 2."""
        if all(getattr(s, "placed", None) is not None for s in specs):
            return {i for i, s in enumerate(specs) if isinstance(s.placed, dict)}
        default_subdir = planner.subdir == "${hydra.job.num}"
        # FolderTaken: refused, in one line, before anything is written
        retry = tuple(self.params.get("retry", placement.RETRY))
        found = placement.place(specs, self.sweep_dir, default_subdir, self.params.get("overwrite", False), retry)
        if found.kept:
            log.info(kept_line(found.kept.values(), retry))
        here = os.getpid()
        for i, s in enumerate(specs):
            s.placed, s.placed_in = found.done.get(i) or found.kept.get(i) or False, here
        return set(found.done) | set(found.kept)

    def _launch_jobs(self, job_overrides, initial_job_idx) -> Optional[Sequence[JobReturn]]:
        """Any task, one Hydra job per job, as Hydra's basic launcher / hydra-submitit-launcher run it."""
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        cut = self.cut_into_jobs(list(job_overrides), pack=False)
        why = app.NOT_DECLARED if self.params["pack"] else "hydra.launcher.pack=false"
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

    def take_lock(self) -> None:
        """One launch per sweep folder (`rw_sweeps.sweeps.lock`), held until this process ends, also when a
        signal ends it (`rw_sweeps.core.signals.on_stop`). Once it is held, the temp files that killed
        writes left in the folder are removed (no other launch can be writing them)."""
        if self.record is not None or getattr(self, "_locked", None) == self.sweep_dir:
            return  # a later batch of this sweep: already held
        lock.claim(self.sweep_dir)  # NotASweep: someone else's folder, refused in one line
        try:  # every later path below it is reached through this handle
            safefs.hold(self.sweep_dir)
        except safefs.PlantedLink:
            raise ConfigError("hydra.sweep.dir", self.sweep_label,
                              f"is a symbolic link (to {os.path.realpath(self.sweep_dir)}); a sweep is written "
                              f"only into a real folder: give that folder instead") from None
        lock.acquire(self.sweep_dir, wait=self.params["wait_for_lock"])  # SweepLocked: refused, in one line
        self._locked = sweep_dir = self.sweep_dir
        atexit.register(lock.release, sweep_dir)
        signals.on_stop(lambda: lock.release(sweep_dir))
        # and in the store, a killed flush's or checkpoint's (its files are written only under a held lock)
        safefs.remove_stale_temps(sweep_dir, [*_recorded_runs(sweep_dir), *([store.STORE] if store.present(sweep_dir) else [])])
        for name in store.remove_orphans(sweep_dir) if store.present(sweep_dir) else ():  # a killed flush's body
            log.info(f"removed {sweep_dir / store.STORE / name}: a body whose head was never written (no record)")

    # ---------------------------------------------------------------------------------------- record
    def _record(self, specs, done, todo) -> dict:
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
        root, out = str(self.sweep_dir) + os.sep, spec.output_dir.rstrip(os.sep)  # a subdir may end in a slash
        if out.startswith(root) and os.sep + "." not in out[len(root) - 1:] and os.sep * 2 not in out:
            return out[len(root):].replace(os.sep, "/")  # the common case, without a path object
        return Path(os.path.relpath(out, self.sweep_dir)).as_posix()

    # ---------------------------------------------------------------------------------------- dispatch
    def cut_into_jobs(self, todo: list, pack: bool) -> packing.Plan:
        """The backend's own part: the jobs of the runs still to train (`rw_sweeps.sweeps.packing`, which
        plans for each place a launch runs); `pack` False: one job per run."""
        raise NotImplementedError(f"{type(self).__name__} plans no jobs: hydra.launcher.backend names its subclass")

    def _dispatch(self, payloads: list, jobs: list, rec: Optional[dict], pinned: bool = False) -> Optional[list]:
        """Run every payload on the backend; a result per payload (its return value, or the exception that
        ended it), or None when detached. `pinned` (local_gpus): payload i is GPU i's, all started at once."""
        names = [[self._name(s) if rec is not None else str(s) for s in job] for job in jobs]
        return self.run_payloads(payloads, names, rec, pinned)

    def run_payloads(self, payloads: list, names: list, rec: Optional[dict], pinned: bool) -> Optional[list]:
        """The backend's own part: `names` are each payload's runs (their folders, or the job numbers of any
        other task), `rec` the sweep's record (None for any other task)."""
        raise NotImplementedError(f"{type(self).__name__} runs no payloads: hydra.launcher.backend names its subclass")

    def _record_local(self, names: list, rec: Optional[dict]) -> None:
        """The local backends' jobs in the sweep's record: its runs are this launch's (`jobs.local`)."""
        if rec is not None:
            rec["jobs"].setdefault("local", []).extend(n for job in names for n in job)
            status.write_record(self.sweep_dir, rec)

    def _local_gpus(self, payloads: list, pinned: bool = False) -> list:
        """`_backends.local_gpu_pool` in this launcher's submitit folder (tests/test_gpus.py drives the pool
        through a launcher of the default backend)."""
        return local_gpu_pool(payloads, self.params["submitit_folder"], pinned)

    def _dry_run(self, specs, done, jobs) -> None:
        p = self.params
        print(f"dry run: {counted(len(specs), 'run')} ({len(done)} already done) in {len(jobs)} job(s)"
              f"{' (packed)' if p['pack'] else ''} on {p['backend']}; sweep folder {self.sweep_dir}", flush=True)
        for i, job in enumerate(jobs[:20]):
            names = [self._name(s) for s in job]
            shown = ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])} … {', '.join(names[-2:])}"
            print(f"  job {i}: {len(job)} run(s): {shown}")
        if len(jobs) > 20:
            print(f"  … and {len(jobs) - 20} more job(s)")
        self.show_scripts(len(jobs))

    def show_scripts(self, n_jobs: int) -> None:
        """The dry run's last part: what the backend would submit (slurm: its sbatch scripts); here, nothing."""


# ------------------------------------------------------------------------------------------ the backends
class InProcessLauncher(RwLauncher):
    """`local` (presets `rw`, `packed`): every payload in this process, one after the other."""
    backend = "local"
    trains_here = True

    def cut_into_jobs(self, todo: list, pack: bool) -> packing.Plan:
        return packing.plan_in_process(todo, self.params, pack)

    def run_payloads(self, payloads: list, names: list, rec: Optional[dict], pinned: bool) -> list:
        self._record_local(names, rec)
        out = []
        for payload in payloads:
            try:
                out.append(payload())
            except Exception as exc:  # noqa: BLE001 - a crash of one job never takes the sweep down
                out.append(exc)
        return out


class LocalGpusLauncher(RwLauncher):
    """`local_gpus` (presets `local_gpus`, `packed_gpus`): local submitit processes, one per visible GPU."""
    backend = "local_gpus"
    trains_here = True

    def cut_into_jobs(self, todo: list, pack: bool) -> packing.Plan:
        return packing.plan_local_gpus(todo, self.params, pack)

    def run_payloads(self, payloads: list, names: list, rec: Optional[dict], pinned: bool) -> list:
        self._record_local(names, rec)
        return self._local_gpus(payloads, pinned)


class SlurmLauncher(RwLauncher):
    """`slurm` (presets `slurm`, `packed_slurm`): SLURM job arrays through submitit, none larger than the
    cluster allows; waits for the jobs, or with `detach` hands them the sweep's lock and returns."""
    backend = "slurm"
    detaches = True
    trains_here = False  # its jobs run on the cluster's nodes: each checks its runs where it runs

    def cut_into_jobs(self, todo: list, pack: bool) -> packing.Plan:
        return packing.plan_slurm(todo, self.params, pack)

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        check_script_values(self.params)

    def show_scripts(self, n_jobs: int) -> None:
        print(sbatch_scripts(self.params, n_jobs), end="", flush=True)

    def run_payloads(self, payloads: list, names: list, rec: Optional[dict], pinned: bool) -> Optional[list]:
        import submitit  # submitit: only a SLURM launch submits; Hydra imports this module at every start-up

        p = self.params
        ex = submitit.SlurmExecutor(folder=p["submitit_folder"], max_num_timeout=p["max_num_timeout"])
        ex.update_parameters(**slurm_parameters(p))
        limit = p["max_array_size"] or slurm_max_array_size()
        submitted = []
        for start in range(0, len(payloads), limit):  # no array larger than the cluster allows
            submitted += ex.submit_array(payloads[start:start + limit])
        if rec is None:  # any other task: wait as hydra-submitit-launcher does
            return [result_or_error(j) for j in submitted]
        for j, job in zip(submitted, names):
            rec["jobs"][j.job_id] = job
        rec["arrays"] += sorted({j.job_id.split("_")[0] for j in submitted}, key=int)
        status.write_record(self.sweep_dir, rec)
        ids = compact_ids([j.job_id for j in submitted])
        follow = f"python -m rw_sweeps.sweeps.status {shlex.quote(str(self.sweep_dir))} --wait"
        n = sum(len(job) for job in names)
        if p["detach"]:
            lock.hand_to_jobs(self.sweep_dir, rec["arrays"])
            print(f"submitted {n} run(s) ({len(rec['skipped'])} already done) as {len(submitted)} SLURM "
                  f"job(s): {ids or 'none'}\nsweep folder: {self.sweep_dir}\nfollow with: {follow}", flush=True)
            return None
        log.info(f"submitted {len(submitted)} SLURM job(s): {ids or 'none'}; waiting (Ctrl-C stops waiting, "
                 f"not the jobs; follow again with: {follow})")
        try:
            status.Sweep(self.sweep_dir, record=rec).follow(interval=p["poll_s"])
        except KeyboardInterrupt:  # the jobs go on: the lock is theirs until they have ended
            lock.hand_to_jobs(self.sweep_dir, rec["arrays"])
            raise Interrupted(f"\nstopped waiting; the jobs go on ({ids}). Follow them with: {follow}\n"
                              f"or cancel them with: scancel {' '.join(rec['arrays'])}") from None
        return [result_or_error(j, wait=False) for j in submitted]


# On the class, not only here: a caller holding a class from before a plugin scan executed this module
# again gets that class's own subclasses.
BACKENDS = RwLauncher.backends = {cls.backend: cls for cls in (InProcessLauncher, LocalGpusLauncher, SlurmLauncher)}



def _recorded_runs(sweep_dir: Path) -> list:
    """The run folders the sweep's record names (where a killed write's temp files may be); none when there is
    no record or it cannot be read (status says why)."""
    try:
        rec = status.read_record(sweep_dir)
    except Exception:  # noqa: BLE001 - a broken record is status's to report; cleanup then touches no run folder
        return []
    return list(rec["runs"]) if rec else []


def _from_folder(spec, error: Any, summary: Optional[dict]) -> JobReturn:
    """A run whose job died or failed: its JobReturn from its folder (the source of truth)."""
    ret = LazyJobReturn(spec, overrides=list(spec.overrides), working_dir=spec.output_dir, task_name=spec.name)
    if summary is not None and summary.get("status") in ("done", "diverged"):
        ret.status, ret.return_value = JobStatus.COMPLETED, app.task_value(spec.cfg, summary)
    else:
        reason = summary.get("error") if summary else one_line(error) if isinstance(error, BaseException) \
            else "the job ended without writing a summary"
        ret.status = JobStatus.FAILED
        ret.return_value = app.RunFailed(run_line(summary) if summary else f"failed: {reason}")
    return ret

