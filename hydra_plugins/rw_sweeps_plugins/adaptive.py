"""`hydra/sweeper=adaptive`: a phase diagram whose runs are placed where the outcome changes, by
python-adaptive's learners (`rw_sweeps.sweeps.adaptive` holds the sweep; this is its Hydra adapter).

    python launch.py -m hydra/sweeper=adaptive 'init.sigma=tag(log,interval(1e-8,1e-1))' \
        'optim.lr=tag(log,interval(0.3,3))' seed='range(0,2)' hydra.sweeper.metric=test_acc hydra.sweeper.n_points=48

Each round is one ordinary launch through the configured launcher (`launch_specs` for the rw launchers, so
packing, placement, faults, wandb and `rw-status` work as for a grid; `launch` for any other launcher).
Every key is checked, and the axes' corners planned and validated, before any job starts.
"""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import logging
import os
import stat
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper

from rw_sweeps.core import contract, layout, results
from rw_sweeps.core.errors import ConfigError, Refused, one_line
from rw_sweeps.core.metrics import SUCCESS_TOL
from rw_sweeps.core.resources import problems
from rw_sweeps.core.safefs import atomic_write, ensure_dir
from rw_sweeps.sweeps import adaptive, placement
from rw_sweeps.sweeps.app import batch_function, note_failed
from rw_sweeps.sweeps.grid_count import MAX_RUNS, refuse_large_grid
from rw_sweeps.sweeps.hydra_adapter import job_folder, split_arguments
from rw_sweeps.sweeps.planner import Planner
from rw_sweeps.sweeps.status import summary_line

log = logging.getLogger(__name__)


@dataclass
class AdaptiveSweeperConf:
    """`hydra.sweeper.*` of `hydra/sweeper=adaptive` (conf/hydra/sweeper/adaptive.yaml holds its deltas)."""
    _target_: str = "hydra_plugins.rw_sweeps_plugins.adaptive.AdaptiveSweeper"
    metric: str = "success"  # what is learned: `success` (a point's success rate) or a numeric summary field
    n_points: Optional[int] = None  # the budget: points a panel (a point is one run per seed of its panel)
    loss_goal: Optional[float] = None  # and stop a panel before its budget once its learner's loss is at most this
    batch: Optional[int] = None  # points a round and panel (null: max_runs_per_job ÷ crossed jobs, else 16)
    level: float = 0.5  # the metric's level set that is the boundary (success: half a point's runs succeed)
    max_runs: int = MAX_RUNS  # the most jobs the grid crossed with each point may have (the grid sweeper's key)
    loss: str = "boundary"  # boundary: 2 axes resolve the level set first; default: python-adaptive's own loss
    tol: float = SUCCESS_TOL  # metric=success: test_acc >= OPT - tol
    params: Optional[Dict[str, str]] = None  # axes and crossed keys, as a preset declares them


ConfigStore.instance().store(group="schema/hydra/sweeper", name="adaptive", node=AdaptiveSweeperConf,
                             provider="rw_sweeps")


def _interrupted(folder: str) -> bool:
    """The contract's judgement of a run a signal stopped: unfinished (no summary yet) with a checkpoint that is
    a regular file, whatever else its folder holds (its `wandb/`, its log, its `.hydra`): it resumes in place.
    Whose run it is, `load_checkpoint` decides (its seal and config)."""
    try:
        regular = stat.S_ISREG(os.lstat(os.path.join(folder, contract.CHECKPOINT)).st_mode)
    except OSError:
        return False
    return regular and contract.judge(Path(folder)).state == "unfinished"


def _resume_in_place(specs: list, sweep_dir: Path) -> None:
    """Each run an interrupt stopped goes back to its own folder (where its checkpoint is: a replayed round
    asks it again, and it resumes there rather than starting over above every folder). A folder is taken by
    the run whose checkpoint it holds (`rw_sweeps.core.results.load_checkpoint`: its seal and config). Run
    folders are found as every reader finds them (`rw_sweeps.core.layout`: `3/run` under a nested subdir), never
    through a link."""
    stopped = [n for n in layout.run_folders(sweep_dir)
               if layout.problem(sweep_dir, n) is None and _interrupted(os.path.join(sweep_dir, n))]
    for s in specs:
        if not stopped:
            return
        mine = next((n for n in stopped
                     if results.load_checkpoint(s.cfg.to_dict(), Path(sweep_dir, n), None) is not None), None)
        if mine is not None:
            stopped.remove(mine)
            num = contract.job_number(mine.split("/")[0])
            s.relocate(s.num if num is None else num, os.path.join(s.sweep_dir or str(sweep_dir), mine))


class NotWritten(Exception):
    """A file of the sweep's own (its record, multirun.yaml) could not be written: a full disk, a quota. The
    sweep stops there in one line and exits as a sweep with failed runs does; every finished run is in its
    folder, and the same command again replays the rounds from them and writes the record."""

    def __init__(self, path: Path, exc: OSError):
        why = exc.strerror or one_line(exc)
        super().__init__(f"{path}: not written ({why}); every finished run is kept in its folder: free space "
                         "(or make the folder writable) and run the same command again to go on")

    @staticmethod
    @contextmanager
    def where(path: Path):
        try:
            yield
        except OSError as exc:
            raise NotWritten(path, exc) from exc


class AdaptiveSweeper(Sweeper):
    def __init__(self, metric: str = "success", n_points: Optional[int] = None, loss_goal: Optional[float] = None,
                 batch: Optional[int] = None, level: float = 0.5, tol: float = SUCCESS_TOL, loss: str = "boundary",
                 params: Optional[Dict[str, str]] = None, max_runs: int = MAX_RUNS):
        self.metric, self.n_points, self.loss_goal, self.batch = metric, n_points, loss_goal, batch
        self.level, self.tol, self.loss, self.max_runs = level, tol, loss, max_runs
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.config = self.hydra_context = self.task_function = self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # ------------------------------------------------------------------------------------ checks
    def _parse(self, arguments: List[str]):
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        axes, rest = adaptive.parse_axes(overrides)
        repository = self.hydra_context.config_loader.repository  # as the planner asks it what a group is
        for a in axes:
            if "." not in a.key and repository.group_exists(a.key):
                raise ConfigError(a.key, f"interval({a.lo:g},{a.hi:g})", "is a config group: an axis is a numeric "
                                  f"key; a group's options are crossed with every point ({a.key}=a,b)")
        adaptive.check_keys(self.metric, self.n_points, self.loss_goal, self.batch, self.level, self.tol, axes,
                            self.loss)
        if OmegaConf.select(self.config, "hydra.launcher.detach", default=False):
            raise ConfigError("hydra.launcher.detach", True, "the adaptive sweeper asks each round's points from "
                              "the last round's values, so it waits for its jobs; drop detach")
        # the grid the points are crossed with, counted before it is listed (a slip such as
        # seed='range(0,10000000)' is one line, not minutes of growing memory)
        refuse_large_grid(rest, self.max_runs)
        # a value given twice (seed=0,0,1) is one job, as a grid trains a run it names twice once
        crossed = [list(job) for job in dict.fromkeys(tuple(job) for b in split_arguments(rest, None) for job in b)]
        crossed_keys = sorted({o.key_or_group for o in rest if o.is_sweep_override()})
        return axes, crossed, crossed_keys

    def _batch(self, crossed: list) -> int:
        if self.batch is not None:
            return self.batch
        per_job = OmegaConf.select(self.config, "hydra.launcher.max_runs_per_job", default=None)
        return max(1, int(per_job) // len(crossed)) if per_job else adaptive.DEFAULT_BATCH

    # ------------------------------------------------------------------------------------ the sweep
    def sweep(self, arguments: List[str]) -> Any:
        twin = batch_function(self.task_function)
        planner = None
        try:
            axes, crossed, crossed_keys = self._parse(arguments)
            if twin is not None:  # every value of the axes' corners (and of each crossed job) checked now
                planner = Planner(self.hydra_context.config_loader, self.config)
                corners = [tuple(b[(i >> d) & 1] for d, b in enumerate(a.bounds for a in axes))
                           for i in range(2 ** len(axes))]
                specs = planner.plan([j for c in corners for j in adaptive.jobs_at(axes, crossed, c)])
                if getattr(self.launcher, "trains_here", True):
                    problem = next((p for p in problems([s.cfg for s in specs], [s.shape for s in specs])
                                    if p is not None), None)
                    if problem is not None:
                        raise problem
        except Refused:
            raise
        except Exception as exc:  # noqa: BLE001 - a composition error of one job: refused in one line
            raise Refused(one_line(exc)) from exc

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        dry_run = bool(OmegaConf.select(self.config, "hydra.launcher.dry_run", default=False))
        if not placement.writable(sweep_dir):  # FolderTaken: refused, in one line
            raise ConfigError("hydra.sweep.dir", str(sweep_dir), "not writable: an adaptive sweep records each round")
        for name in (adaptive.RECORD, "multirun.yaml"):  # replaced atomically: a link is replaced, a folder not
            there = sweep_dir / name
            if os.path.lexists(there) and not there.is_symlink() and not there.is_file():
                raise ConfigError("hydra.sweep.dir", str(sweep_dir), f"{name} there is not a file: the adaptive "
                                  "sweep writes it after each round; move it away")
        counts: Counter = Counter()
        returns: list = []
        try:
            return self._rounds(axes, crossed, crossed_keys, planner, twin, sweep_dir, dry_run, counts, returns)
        except NotWritten as e:  # a full disk (or a quota, a folder gone read-only): one line, the runs kept
            print(f"error: {e}", file=sys.stderr, flush=True)
            print(summary_line(str(sweep_dir), counts), flush=True)
            note_failed()  # the exit status of a sweep whose runs failed
            return returns

    def _rounds(self, axes, crossed, crossed_keys, planner, twin, sweep_dir: Path, dry_run: bool, counts: Counter,
                returns: list) -> Any:
        if not dry_run:
            if hasattr(self.launcher, "take_lock"):
                self.launcher.take_lock()
            with NotWritten.where(sweep_dir / "multirun.yaml"):
                ensure_dir(sweep_dir)
                atomic_write(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))
        where: dict = {}  # a job's overrides -> its run folder's name, for the record's runs of each point

        groups = adaptive.panels(crossed)

        def record(told: dict) -> None:
            runs = {(panel, p): [where[tuple(j)] for j in adaptive.jobs_at(axes, groups[panel], p) if tuple(j) in where]
                    for panel, mine in told.items() for p in mine}
            with NotWritten.where(sweep_dir / adaptive.RECORD):
                adaptive.write_record(sweep_dir, axes, crossed_keys, self.metric, self.level, self.tol, told, runs)

        def evaluate(jobs: list) -> Optional[tuple]:
            # the lowest free numbers, one by one where the rw launcher runs specs in Hydra's default subdir;
            # else the lowest free block, as Hydra's own launchers number a launch's jobs from one start
            own = twin is not None and hasattr(self.launcher, "launch_specs") and planner.subdir == "${hydra.job.num}"
            numbers = placement.free_numbers(sweep_dir, len(jobs), consecutive=not own)
            start = numbers[0]
            if twin is not None:
                specs = planner.plan(jobs, start)
                for s, num in zip(specs, numbers) if own else ():
                    if s.num != num:
                        s.relocate(num, os.path.join(planner.sweep_dir, str(num)))
                _resume_in_place(specs, sweep_dir)
                if hasattr(self.launcher, "place"):
                    done = self.launcher.place(specs, planner)
                else:  # any other launcher: the runs already done are found as the rw launcher finds them
                    done = set(placement.place(specs, sweep_dir, planner.subdir == "${hydra.job.num}").done)
                todo = [s for i, s in enumerate(specs) if i not in done]
                for i in done:  # found done: skipped; kept as it ended (a diverged run): counted as it ended
                    placed = getattr(specs[i], "placed", None)
                    counts[placed["status"] if isinstance(placed, dict) and placed["status"] != "done" else "skipped"] += 1
                folders = [s.output_dir for s in specs]
                if todo and hasattr(self.launcher, "launch_specs"):
                    res = self.launcher.launch_specs(todo, twin, planner)
                elif todo:  # Hydra's own launchers number the jobs from `start`: read each one's folder back
                    res = self.launcher.launch([s.overrides for s in todo], initial_job_idx=start)
                    if res is not None:
                        back = iter(job_folder(r) for r in res)
                        folders = [f if i in done else next(back) for i, f in enumerate(folders)]
                if todo:
                    if res is None:
                        return None
                    returns.append(res)
                fresh = {f for i, f in enumerate(folders) if i not in done}
            else:
                res = self.launcher.launch(jobs, initial_job_idx=start)
                if res is None:
                    return None
                returns.append(res)
                folders = [job_folder(r) for r in res]
                fresh = set(folders)
            # each run by its name in the sweep folder (`0/run` under hydra.sweep.subdir=${hydra.job.num}/run)
            where.update((tuple(j), name) for j, f in zip(jobs, folders)
                         if f and (name := layout.name_of(sweep_dir, f)) is not None)
            values = []
            for f in folders:
                verdict = contract.judge(Path(f)) if f else contract.Verdict("unfinished")
                if f in fresh:
                    counts[verdict.state if verdict.state in contract.STATUSES else "failed"] += 1
                    if verdict.state not in ("done", "diverged"):
                        why = (verdict.summary or {}).get("error") or verdict.why
                        print(f"failed {f}: {why}", file=sys.stderr, flush=True)
                values.append(adaptive.run_value(verdict, self.metric, self.tol))
            return values, len(fresh)

        def say(line: str) -> None:
            print(line, flush=True)

        told, rounds = adaptive.sweep(axes, crossed, batch=self._batch(crossed), n_points=self.n_points,
                                      loss_goal=self.loss_goal, evaluate=evaluate, say=say,
                                      level=self.level if self.loss == "boundary" else None,
                                      on_round=None if dry_run else record)
        if told is None:  # a dry run: the first round's plan was printed
            print("dry run: later rounds are asked from the values of this one", flush=True)
            return None
        say(adaptive.summary_line(sweep_dir, told, rounds, self.metric))
        say(summary_line(str(sweep_dir), counts))
        if counts["failed"]:
            note_failed()
        return returns
