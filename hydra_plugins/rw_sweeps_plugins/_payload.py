"""What a job runs, wherever it runs (this process, a local submitit process, a SLURM array task): one Hydra
job through `run_job` (`HydraJob`), a packed chunk (`ChunkJob`), or every chunk planned for one GPU
(`GpuJob`). Each carries the launching process's Hydra state; `Payload.__call__` restores it and Hydra's
globals once inside a submitit job, the one start-up all three share, before the payload's own `run`.

A module of `launcher.py`'s, named with `_` so that Hydra's plugin scan leaves it alone: the scan executes
every other module of the package again, and a payload's class must stay the one pickled by name."""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import open_dict

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals

from rw_sweeps.core import trainer
from rw_sweeps.core.errors import one_line
from rw_sweeps.core.safefs import hold, refuse_links
from rw_sweeps.sweeps import packing, tracking, writer
from rw_sweeps.sweeps.hydra_adapter import job_folder, job_value


def current_job_id() -> Optional[str]:
    """The submitit job id when running inside a submitit job, else None."""
    if "SUBMITIT_EXECUTOR" not in os.environ and "SUBMITIT_FOLDER" not in os.environ:
        return None
    try:
        # submitit: only inside a submitit job (where it is loaded already); the launcher imports this module,
        # and Hydra imports the plugins at every start-up
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # noqa: BLE001
        return None


def wait_for_writes() -> None:
    """This process's results still being written (`rw_sweeps.sweeps.writer`), then its queued wandb logging
    (`rw_sweeps.sweeps.tracking`, which the writes feed), before its work counts as ended."""
    writer.flush()
    tracking.wait()


class Payload:
    """The common start-up: the Hydra state (ConfigStore, plugins, HydraConfig…) taken when the payload is
    made, and restored with Hydra's globals (`${now:}`, `${hydra:}`) in a submitit job's own process."""

    def __init__(self) -> None:
        self.singleton_state = Singleton.get_state()

    def __call__(self) -> Any:
        jid = current_job_id()
        if jid is not None:
            Singleton.set_state(self.singleton_state)
            setup_globals()
        return self.run(jid)

    def run(self, job_id: Optional[str]) -> Any:
        """The payload's work; `job_id` is the submitit job's, or None in the launching process."""
        raise NotImplementedError


class Requeued:
    """On submitit's preemption/timeout signal: the same payload again (its runs resume from checkpoints)."""
    requeue_note = False  # say so on stderr

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit  # submitit: submitit calls this only inside its job (see current_job_id)

        if self.requeue_note:
            print(f"rw_sweeps: job interrupted, requeued (pid {os.getpid()})", file=sys.stderr, flush=True)
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class HydraJob(Requeued, Payload):
    """One job through Hydra's `run_job`, wherever it runs (what hydra-submitit-launcher's `__call__` does)."""

    def __init__(self, launcher: Any, overrides: List[str], num: int, project: bool,
                 output_dir: Optional[str] = None):
        self.hydra_context, self.task_function = launcher.hydra_context, launcher.task_function
        self.config, self.overrides, self.num, self.project = launcher.config, list(overrides), num, project
        self.output_dir = output_dir  # the project's runs: checked for planted links before run_job writes
        self.sweep_dir = str(launcher.sweep_dir) if output_dir is not None else None  # absolute
        super().__init__()

    def run(self, job_id: Optional[str]) -> JobReturn:
        if self.output_dir is not None:  # Hydra's run_job writes `.hydra/` and the log with plain open()
            hold(self.sweep_dir, anew=False)  # the project's own writes: through the sweep's handle
            refuse_links(Path(self.output_dir), self.config.hydra.output_subdir)
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, self.overrides)
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = job_id or str(self.num)  # as Hydra's basic launcher, or submitit's job id
            cfg.hydra.job.num = self.num
        ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        if job_id is not None and self.project and ret.status == JobStatus.FAILED:
            raise job_value(ret)  # the scheduler records the job FAILED; its folder says why
        return ret


class ChunkJob(Requeued, Payload):
    """A packed chunk, wherever it runs (this process, a process pinned to a GPU, a SLURM array task)."""
    requeue_note = True

    def __init__(self, chunk, memory_gb: Optional[float] = None, label: Optional[str] = None,
                 finished_after: Optional[str] = None):
        self.chunk, self.memory_gb = chunk, memory_gb
        self.label = label  # "job 2/3: 4 run(s), runs 5–8 of 12", said when it starts
        self.finished_after = finished_after  # "8 of 12 runs finished", said when it ends in this process
        super().__init__()

    def run(self, job_id: Optional[str]) -> List[JobReturn]:
        if job_id is not None:
            self.chunk.job_id = job_id
        elif self.finished_after:  # the jobs of this process run in turn: the count is true
            self.chunk.said_after = f"{self.finished_after} so far"
        returns = self._train()
        if job_id is not None:  # this job's own process ends here: its results and wandb logging first
            wait_for_writes()
        failed = [job_folder(r) for r in returns if r.status == JobStatus.FAILED]
        if failed and job_id is not None:  # after every result is written: the scheduler says FAILED
            raise packing.RunsFailed(f"{len(failed)} run(s) failed: " + ", ".join(failed[:5]))
        return returns

    def _train(self) -> List[JobReturn]:
        """The chunk, in pieces that fit this process's GPU when it has one (a SLURM job's allocated GPU)."""
        if self.label:
            print(self.label, flush=True)
        budget = packing.gpu_budget_gb(self.memory_gb) if self.chunk.specs and current_job_id() is not None else None
        if budget is None:
            return self.chunk()
        return [r for part in packing.chunks(self.chunk.specs, budget) for r in replace(self.chunk, specs=part)()]


class GpuJob(Payload):
    """Every chunk planned for one GPU (or, without a GPU, for the CPU), trained in turn in one process:
    the imports and CUDA start are paid once per GPU, not once per chunk. Each chunk keeps its Hydra
    envelope (`Chunk`) and its re-split to the GPU's actual free memory (`ChunkJob._train`); a chunk that
    raises fails its own runs only (its result is the exception; the launcher reads its runs from their
    folders) and the next chunk runs."""

    def __init__(self, chunks: List[ChunkJob]):
        self.chunks = list(chunks)
        super().__init__()

    def run(self, job_id: Optional[str]) -> List[Any]:
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
        wait_for_writes()  # this process ends here: its results and wandb logging first
        return out
