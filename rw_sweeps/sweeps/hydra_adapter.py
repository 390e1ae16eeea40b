"""Every private name of Hydra, OmegaConf and submitit that the project relies on, in one place, each with
the reason no public API serves. `tests/test_hydra_adapter.py` exercises each one, so an upgrade that moves
or changes any of them fails there, loudly, and not somewhere in a sweep.

Everything else in the project uses the libraries' public API only.
"""
from __future__ import annotations

import os
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from hydra._internal.core_plugins import basic_sweeper as hydra_basic_sweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path, get_args_parser, run_and_report
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf._utils import OmegaConfDumper

from rw_sweeps.core.errors import Refused

from .writer import on_writer_thread

__all__ = ["basic_sweeper", "split_arguments", "command_line", "job_value", "yaml_str_representer",
           "sbatch_script", "SUBMITIT_ENTRY", "observes_jobs", "WrittenLater", "errors_reach_caller"]

# The module submitit's generated job scripts run (`python -u -m submitit.core._submit FOLDER`): the dry
# run prints the same script a submission writes.
SUBMITIT_ENTRY = "submitit.core._submit"


def basic_sweeper() -> type:
    """Hydra's grid sweeper class: the rw sweeper extends it (batching, `hydra.sweeper.params`, its override
    expansion: comma lists, range(), glob()); Hydra exposes no public grid-expansion function. Looked up
    on its module when asked, not taken at import: Hydra's plugin scan re-executes that module, and a class
    taken before the scan is no longer the one its own `super(BasicSweeper, self)` names."""
    return hydra_basic_sweeper.BasicSweeper


def split_arguments(overrides: list, max_batch_size: Optional[int]) -> list:
    """The grid's jobs (lists of override strings), in batches, as Hydra's basic sweeper expands them."""
    return basic_sweeper().split_arguments(overrides, max_batch_size)


def command_line(argv: list[str], calling_file: str, config_path: str, config_name: str):
    """Hydra's own reading of a command line, before `@hydra.main` runs it: (args, a Hydra instance on the
    same search path, `--config-dir` included, and the config name), or None for --help/--cfg/--info and
    shell completion, which Hydra answers itself. `hydra.main` has no public hook that composes without
    running the task (the Compose API does not read argv or `--config-dir`)."""
    args, _ = get_args_parser().parse_known_args(argv)
    given = [name for name, on in (("--run", args.run), ("--multirun", args.multirun), ("--cfg", args.cfg),
                                   ("--info", args.info), ("--shell-completion", args.shell_completion)) if on]
    if len(given) > 1:  # Hydra raises a bare ValueError for it, after the pre-check: a trace
        raise Refused(f"{' and '.join(given)} cannot be combined: Hydra runs one of --run, --multirun, --cfg, --info "
                      "and --shell-completion; to print one job's config, drop -m and give each key one value "
                      "(--cfg job data.p=0.5)")
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        return None
    search_path = create_automatic_config_search_path(calling_file, None, args.config_path or config_path)
    if args.config_dir is not None:
        search_path.prepend(provider="command-line", path=f"file://{os.path.abspath(args.config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    hydra = Hydra.create_main_hydra2(task_name="preflight", config_search_path=search_path)
    return args, hydra, args.config_name or config_name


def job_value(ret: Any) -> Any:
    """A JobReturn's value or, for a FAILED job, its exception: `JobReturn.return_value` raises that
    exception instead of returning it, and a sweeper must read it to report the job and go on."""
    return ret._return_value


def job_folder(ret: Any) -> Any:
    """A JobReturn's run folder: its job's `hydra.runtime.output_dir`. (`working_dir` is the job process's
    working directory, which is the run folder only under `hydra.job.chdir=true`: Hydra's own run_job, the
    unpacked path, leaves it at the launch's folder.)"""
    # the instance's own field: a packed run's return builds its DictConfigs only when asked (~10 ms each), and
    # its working_dir is its run folder already
    cfg = vars(ret).get("hydra_cfg")
    try:
        out = cfg.hydra.runtime.output_dir if cfg is not None else None
    except Exception:  # noqa: BLE001 - a JobReturn without that node (a job that died before run_job)
        out = None
    return str(out) if out is not None else ret.working_dir


class WrittenLater(JobReturn):
    """A JobReturn whose status and value are set on the writer thread (`rw_sweeps.sweeps.writer`), once its
    chunk's results are written, and read only then. JobReturn keeps them in the dataclass fields `status`
    and `_return_value` (its public `return_value` property reads the latter), so both become properties
    that wait for the writes; every other field, and pickling once written, are JobReturn's own."""

    def written_by(self, written: Future) -> None:
        """Its status and value are set by `written` (its chunk's results)."""
        self.__dict__["_written"] = written

    def _ready(self) -> dict:
        written = self.__dict__.get("_written")
        if written is not None and not on_writer_thread():
            exc = written.exception()  # waits; the chunk's writing sets this return before it ends
            self.__dict__["_written"] = None
            if exc is not None and self.__dict__.get("_st", JobStatus.UNKNOWN) == JobStatus.UNKNOWN:
                self.__dict__.update(_st=JobStatus.FAILED, _rv=exc)
        return self.__dict__

    status = property(lambda self: self._ready().get("_st", JobStatus.UNKNOWN),  # type: ignore[assignment]
                      lambda self, v: self.__dict__.__setitem__("_st", v))
    _return_value = property(lambda self: self._ready().get("_rv"),  # type: ignore[assignment]
                             lambda self, v: self.__dict__.__setitem__("_rv", v))

    def __getstate__(self) -> dict:  # a submitit job's result: pickled once written, without its future
        state = dict(self._ready())
        state.pop("_written", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def yaml_str_representer():
    """OmegaConf's rule for YAML strings (quote what would read back as a bool, a number or null), so that
    `.hydra/*.yaml` written with libyaml are byte for byte what `OmegaConf.to_yaml` writes."""
    return OmegaConfDumper.str_representer


def sbatch_script(**params: Any) -> str:
    """The sbatch script submitit writes for these SlurmExecutor parameters (the dry run prints it)."""
    # submitit: only a dry run of the slurm backend prints a script; the launcher plugin imports this
    # module, and Hydra imports the plugins at every start-up (--help included)
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(**params)


def observes_jobs(callbacks: Any) -> bool:
    """Does any configured Hydra callback define a per-job hook (`on_job_start`, `on_job_end`)? Only then
    must the packed launcher build each job's DictConfig for it. Hydra's `Callbacks` holds its instances in
    `.callbacks`; a callback that keeps the base class's hooks cannot observe a job."""
    for cb in getattr(callbacks, "callbacks", None) or []:
        if any(getattr(type(cb), hook) is not getattr(Callback, hook) for hook in ("on_job_start", "on_job_end")):
            return True
    return False


@contextmanager
def errors_reach_caller() -> Iterator[None]:
    """Around `@hydra.main`'s function: its exceptions reach the caller (the front door, which decides the
    exit code of the errors it knows) instead of being printed by Hydra, which then exits 1. `hydra.main`
    re-raises only under HYDRA_FULL_ERROR=1, its documented switch, so it is set for the call; any other
    exception is then reported as Hydra reports it (its `run_and_report`: the message of a compact error,
    a trace without Hydra's frames, exit 1), or re-raised whole if the user had set HYDRA_FULL_ERROR."""
    users = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as Hydra would
        _restore(users)
        if users == "1":
            raise

        def again() -> None:
            raise exc
        run_and_report(again)
        raise  # run_and_report exits; only a changed Hydra gets here
    finally:
        _restore(users)


def _restore(users: Optional[str]) -> None:
    if users is None:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    else:
        os.environ["HYDRA_FULL_ERROR"] = users
