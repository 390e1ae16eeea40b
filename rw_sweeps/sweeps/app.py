"""The project's Hydra app: the single-run task (`train`), its batched twin (`train_batch`), the pre-check.

Hydra's launchers call the task once per job through Hydra's `run_job`, as for any app. The rw launchers
instead train many same-shape jobs at once through the twin that the task declares (`@batched(train_batch)`
under `@hydra.main`): the declaration says the task is `train(cfg)`, and the launcher trusts it. A task
that does more than `train(cfg)` drops the declaration (or a launch sets `hydra.launcher.pack=false`), and
its jobs run one by one through `run_job`, with the edit. The launcher's first line says which.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rw_sweeps.core import env_vars, seal, signals
from rw_sweeps.core.config import ConfigError, from_dict, wandb_group
from rw_sweeps.core.errors import Interrupted, Refused, one_line
from rw_sweeps.core.keys import describe, groups
from rw_sweeps.core.resources import check, problems

from . import run, tracking, writer
from .hydra_adapter import command_line, errors_reach_caller
from .hydra_errors import one_line_errors
from .placement import check_run_folder
from .planner import has_interpolation, no_group_deleted, packaged_conf

log = logging.getLogger(__name__)


class RunFailed(CompactHydraException):
    """The run ended `failed` (its summary says why): the job's status is FAILED, as for any task that raises."""


class _Prechecked:
    """The single run the pre-check composed, validated and resource-checked in this process: (its resolved
    config, its RunConfig). `train` takes it for the same config rather than doing all of it again."""
    run: Optional[tuple] = None


class _Varies:
    """The keys the sweep varies, per job (its overrides → its overrides of those keys), noted by the rw
    sweeper (`note_varies`): a job that Hydra's launcher runs in this process through `run_job` (`train`)
    is named as the packed launcher names it. A job in another process (submitit) finds none."""
    by_job: dict = {}


def note_varies(specs: Sequence) -> None:
    _Varies.by_job = {tuple(s.overrides): list(s.varies) for s in specs}


class _Outcome:
    """Whether any run of this process failed: the exit status, set once Hydra is done (after
    `on_multirun_end`), never by `sys.exit` inside a sweep."""
    failed = False


def exit_status() -> int:
    return 1 if _Outcome.failed else 0


def note_failed() -> None:
    _Outcome.failed = True


def task_value(cfg, summary: dict) -> Any:
    """What the task returns for a run with this summary, the value of its Hydra job wherever the summary
    was read (the run just trained, or its folder when its job died): the run's summary, or the value of
    its `objective`. The objective is undefined (None) unless the run is done with a finite value: a
    diverged run's last finite evaluation is not its result. None, not NaN: hydra-optuna-sweeper then
    records the trial as failed and the study goes on (Optuna rejects a NaN value, and the sweeper's retry
    of `tell` for it raises)."""
    if cfg.objective is None:
        return summary
    value = summary.get(cfg.objective)
    if summary.get("status") != "done" or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _finish(cfg, summary: dict, tag: str = "") -> tuple[Any, list[str]]:
    line = run.run_line(summary, tag)
    if summary["status"] == "failed":
        return RunFailed(line), [line]
    return task_value(cfg, summary), [line]


def named(rc, folder: str, overrides: Sequence[str]):
    """The run's config with wandb's `group` (null: the sweep folder, resolved, `${now:…}` and all) and `name`
    (null: `overrides`, the job's values of the keys its sweep varies, without wandb's own keys) filled
    in, as a wandb script passes them to `wandb.init`; config.yaml records them, so a replay
    (`rw_sweeps.sweeps.wandb_export`) names the run alike."""
    w, changes = rc.wandb, {}
    if w.group is None:
        changes["group"] = wandb_group(folder)
    tag = tracking.name_of(list(overrides))
    if w.name is None and tag:
        changes["name"] = tag
    return dataclasses.replace(rc, wandb=dataclasses.replace(w, **changes)) if changes else rc


def train(cfg: DictConfig) -> Any:
    """One run of eq. 2.1 (or F.1) for the composed config; returns its summary (or its objective)."""
    hc = HydraConfig.get()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    known = _Prechecked.run
    if hc.mode.name == "RUN" and known is not None and known[0] == resolved:
        rc = known[1]  # the pre-check composed, validated and resource-checked this very config
    else:
        rc = from_dict(resolved, complete=True)
        try:
            check(rc)  # its device is visible here and it fits in memory
        except ConfigError as exc:
            if hc.mode.name == "RUN":
                raise  # the pre-check said it already, before anything was written
            summary = run.failed_summary(rc, Path(hc.runtime.output_dir), str(exc))
            value, lines = _finish(rc, summary)
            for line in lines:
                log.info(line)
            note_failed()
            raise value
    # named by what its sweep varies where the rw sweeper said so in this process; else (a single run, a job
    # in a process of its own) by its overrides
    job = tuple(hc.overrides.task)
    rc = named(rc, hc.sweep.dir if hc.mode.name == "MULTIRUN" else hc.run.dir, _Varies.by_job.get(job) or job)
    trained = run.train([rc], [Path(hc.runtime.output_dir)])
    with signals.deferred():  # a signal while its results are written: raised once they are
        summary = trained.write()[0]
    if hc.mode.name == "RUN":  # a single run ends here: its wandb run first (a multirun's launcher waits)
        tracking.wait()
    value, lines = _finish(rc, summary)
    if hc.mode.name == "RUN":
        lines.append(f"run folder: {hc.runtime.output_dir}")
    for line in lines:
        log.info(line)
    if isinstance(value, BaseException):
        note_failed()
        raise value
    return value


def train_batch(specs: Sequence) -> "run.Pending":
    """`train` for many jobs (`rw_sweeps.sweeps.planner.Spec`s) at once. Trains them (runs of one shape are
    one batched program); the returned Pending writes their results and gives, per job, what `train` would
    have returned (or raised) and the lines it would have logged."""
    out: list = [None] * len(specs)
    valid = []
    for i, s in enumerate(specs):
        try:
            rc = s.cfg if s.cfg is not None else from_dict(s.resolved, complete=True)
        except ConfigError as exc:
            out[i] = (exc, [f"error: {exc}"])
            continue
        if isinstance(getattr(s, "placed", None), dict):  # found done when its folder was placed: not read again
            out[i] = _finish(rc, {**s.placed, "skipped": True}, getattr(s, "tag", ""))
            continue
        valid.append((i, rc))
    todo = []
    # its device is visible here and a run fits in memory; if not, the folder says why, as for any run
    # that failed where it ran (the rw sweeper checked the specs of this process already: not again)
    here = os.getpid()
    unchecked = [(i, rc) for i, rc in valid if getattr(specs[i], "checked_in", None) != here]
    found = dict(zip((i for i, _ in unchecked), problems([rc for _, rc in unchecked])))
    for (i, rc), problem in ((v, found.get(v[0])) for v in valid):
        if problem is not None:
            out[i] = _finish(rc, run.failed_summary(rc, Path(specs[i].output_dir), str(problem)))
            continue
        # named by what varies in its batch; a batch of one job (an Optuna trial at n_jobs=1, a sweep of one)
        # by its overrides, as a single run is
        overrides = getattr(specs[i], "varies", None) or getattr(specs[i], "overrides", [])
        todo.append((i, named(rc, specs[i].sweep_dir, overrides)))  # sweep_dir: resolved
    # done-checked by placement in this very process (a SLURM job, requeued after some of its runs finished,
    # asks their folders again)
    placed = all(getattr(specs[i], "placed", None) is False and getattr(specs[i], "placed_in", None) == here
                 for i, _ in todo)
    trained = run.train([rc for _, rc in todo], [Path(specs[i].output_dir) for i, _ in todo], done_checked=placed)

    def write() -> list[tuple[Any, list[str]]]:
        for (i, rc), summary in zip(todo, trained.write()):
            out[i] = _finish(rc, summary, getattr(specs[i], "tag", ""))
        if any(isinstance(v, BaseException) for v, _ in out):
            note_failed()
        return out
    return run.Pending(write)


# ------------------------------------------------------------------------------------ the declaration
@dataclasses.dataclass(frozen=True)
class _Twin:
    task: Callable
    batch: Callable


def batched(batch: Callable) -> Callable[[Callable], Callable]:
    """Declare `batch` as the batched twin of the decorated task (put it under `@hydra.main`)."""
    def declare(task: Callable) -> Callable:
        task.__rw_batched__ = _Twin(task, batch)
        return task
    return declare


def batch_function(task: Optional[Callable]) -> Optional[Callable]:
    """The batched twin the task declares (`@batched(...)`), trusted as declared; None without one. A
    wrapper (`functools.wraps` copies the attribute) is not the task the declaration was made for."""
    twin = getattr(task, "__rw_batched__", None)
    return twin.batch if isinstance(twin, _Twin) and twin.task is task else None


NOT_DECLARED = ("the task declares no batched twin (put `@batched(train_batch)` from rw_sweeps.sweeps.app "
                "under `@hydra.main` to pack a task that returns `train(cfg)`)")


# ------------------------------------------------------------------------------------ the pre-check
def preflight(argv: list[str], calling_file: str, config_path: str, config_name: str = "config") -> None:
    """Compose the command line as Hydra will (its search path, `--config-dir`, every override syntax),
    before Hydra creates any folder; in single-run mode also check every value. A multirun's values are
    checked run by run by the rw sweeper, still before any job starts. Raises ConfigError (one line)."""
    try:
        with one_line_errors():
            env_vars.check()  # every RW_SWEEPS_* variable a job reads (rw_sweeps.core.env_vars)
            read = command_line(argv, calling_file, config_path, config_name)
            if read is None:
                return
            # every launch may seal (a stop checkpoints the running chunk, a relaunch verifies checkpoints, the
            # sweep's analysis seals its cache): a key that cannot be used is one line now, not a traceback per run
            seal.check()
            args, hydra_app, name = read
            overrides = list(args.overrides)
            # `-m` is a multirun whatever the config's hydra.mode says: its composition (~0.2 s) is not needed then
            mode = RunMode.MULTIRUN if args.multirun else (hydra_app.get_mode(config_name=name, overrides=overrides)
                                                           or RunMode.RUN)
            cfg = hydra_app.compose_config(config_name=name, overrides=overrides + [f"hydra.mode={mode.name}"],
                                           run_mode=mode, with_log_configuration=False)
            # a job's environment: env_set as written; a value that interpolates (`${hydra:job.num}`) is the job's
            # own, resolved as Hydra resolves it and checked by the planner for each job of a multirun
            env_set = OmegaConf.to_container(cfg.hydra.job, resolve=False).get("env_set") or {}
            plain = {str(k): str(v) for k, v in env_set.items() if not has_interpolation(v)}
            env_vars.check({**os.environ, **plain})
            no_group_deleted(overrides)
            if mode == RunMode.RUN:
                HydraConfig.instance().set_config(cfg)
                task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
                resolved = OmegaConf.to_container(task, resolve=True)
                rc = from_dict(resolved, complete=True)
                check(rc)
                check_run_folder(Path(str(cfg.hydra.run.dir)).absolute(), rc.to_dict(),
                                 bool(OmegaConf.select(cfg, "hydra.launcher.overwrite", default=False)))
                _Prechecked.run = (resolved, rc)
    finally:
        GlobalHydra.instance().clear()


def _register_resolvers() -> None:
    """`${rw_keys:${hydra.runtime.choices}}` and `${rw_groups:${hydra.runtime.choices}}`, for `--help`
    (`conf/hydra/help/rw.yaml`): the keys of the options this command composes (the defaults, or the ones it
    names), each at its default with its comment, and every group's options, this command's choice marked."""
    if not OmegaConf.has_resolver("rw_keys"):
        def keys_text(choices=None) -> str:
            return describe(tuple(sorted(_choices(choices).items())))

        def groups_text(choices=None) -> str:
            return groups(packaged_conf(), _choices(choices))

        OmegaConf.register_new_resolver("rw_keys", keys_text)
        OmegaConf.register_new_resolver("rw_groups", groups_text)


def _choices(choices) -> dict:
    """Hydra's `hydra.runtime.choices` as {group: option}, without Hydra's own groups (`hydra/launcher`)."""
    plain = OmegaConf.to_container(choices) if OmegaConf.is_config(choices) else (choices or {})
    return {str(g): str(o) for g, o in plain.items() if o is not None and not str(g).startswith("hydra/")}


def run_front_door(main: Callable, argv: list[str], calling_file: str, config_path: str) -> None:
    """launch.py's and `rw-launch`'s `__main__`: the pre-check, Hydra, then the exit status. A launch the
    project refuses (`rw_sweeps.core.errors.Refused`, raised by the pre-check, the sweeper or the launcher
    before any job starts) is one line and exit 2. Ctrl-C, SIGTERM and SIGHUP take one path
    (`rw_sweeps.sweeps.signals`): what is in flight is checkpointed or written, one line, the lock released,
    exit 130, 143 or 129."""
    # The modules imported so far (torch, Hydra, …: ~10⁵ objects) live as long as the process: kept out of
    # every later collection, which would otherwise walk them all each time (~0.2 CPU s of a small launch)
    gc.freeze()
    signals.install()
    _register_resolvers()
    try:
        try:
            preflight(argv, calling_file, config_path)
        except Refused:  # as raised: its cause (Hydra's or OmegaConf's error) stays its own
            raise
        except Exception as exc:  # noqa: BLE001 - any composition error: refused before anything is written
            raise Refused(one_line(exc)) from exc
        with errors_reach_caller():
            main()
        signals.unanswered()  # a signal held for after the last results were written, or one Python ignored
    except Refused as exc:  # one line, no traceback, before any job started
        signals.finishing()
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            # Hydra's switch for the complete stack trace, as Hydra honours it: the error raised whole, with
            # the Hydra or OmegaConf error it was made from, and Python's exit 1
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: one line; finished runs are on disk
        _stopped(exc, exc.message if isinstance(exc, Interrupted) else None)
    except SystemExit:  # Hydra's own exits (--help, --cfg, an error it reports)
        signals.finishing()
        raise
    signals.finishing()  # a signal from here on ends the process at once, with its code
    sys.exit(exit_status())


def _stopped(exc: BaseException, message: Optional[str]) -> None:
    """The orderly end after a signal: later signals raise nothing (`signals.stopping`); the results of a
    chunk that finished before it are written; one line; the queued wandb logging; the lock released; exit
    with the signal's code. `message`: the line (waiting for SLURM: the jobs go on), else the default one."""
    code = signals.stopping(exc)
    try:
        writer.flush()  # the results of a chunk that finished before the signal
    except BaseException:  # noqa: BLE001 - the line and the exit code still follow
        pass
    print(message if message is not None else signals.line(code), file=sys.stderr, flush=True)
    signals.said()
    try:
        tracking.wait()  # their wandb runs and markers, before the lock goes
    except BaseException:  # noqa: BLE001
        pass
    signals.cleanup()  # the sweep's lock
    sys.exit(code)


def cli() -> None:
    """`rw-launch`: launch.py, from any folder, with the configs packaged beside the code."""
    conf = packaged_conf()

    @hydra.main(config_path=conf, config_name="config", version_base="1.3")
    @batched(train_batch)
    def rw_launch(cfg: DictConfig) -> Any:
        return train(cfg)

    run_front_door(rw_launch, sys.argv[1:], __file__, conf)
