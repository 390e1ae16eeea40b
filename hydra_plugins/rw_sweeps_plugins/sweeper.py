"""`hydra/sweeper=rw` (the default): Hydra's basic grid sweeper, plus three things users need.

1. For the project's own task, every run of the grid is validated before anything is created or launched
   (`rw_sweeps.sweeps.planner.Planner`), so a bad value is one line and an untouched disk; validation costs one
   composition per group choice rather than Hydra's one per job. The validated specs go to the rw
   launcher explicitly (`launch_specs`); any other launcher gets Hydra's `launch(overrides, idx)`.
2. Failed runs never stop the sweep: every job runs, one line counts the done, skipped, failed and
   diverged runs, and the exit status is non-zero if any failed. The exit comes from the front door
   after Hydra is done, so `on_multirun_end` always fires first.
3. The sweep's JobReturns are returned, batch by batch, as Hydra's sweepers return them.
4. A grid is counted before Hydra lists its jobs (`grid_size`, without building one): one of more than
   `hydra.sweeper.max_runs` runs is refused in one line, before anything is written.
The sweep's analysis run is not the sweeper's: `conf/config.yaml` attaches it as a Hydra callback
(`analysis.callback.WandbAnalysis`, on `on_multirun_end`).

`hydra/sweeper=optuna` is hydra-optuna-sweeper's own; one thing is added to it here (`_optuna_without_a_best`):
a study in which no trial completed (every run diverged or failed) ends with one line and exit 2, its runs
kept, instead of Optuna's `ValueError: No trials are completed yet` and a traceback.
"""

import functools
import itertools
import logging
import os
import sys
from collections import Counter
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.core.utils import JobStatus

from rw_sweeps.core.errors import ConfigError, Refused, one_line
from rw_sweeps.core.resources import problems
from rw_sweeps.core.results import read_summary
from rw_sweeps.core.safefs import atomic_write, ensure_dir
from rw_sweeps.sweeps import placement, writer
from rw_sweeps.sweeps.app import batch_function, note_failed, note_varies
from rw_sweeps.sweeps.hydra_adapter import basic_sweeper, job_folder, job_value
from rw_sweeps.sweeps.grid_count import MAX_RUNS, refuse_large_grid
from rw_sweeps.sweeps.planner import Planner
from rw_sweeps.sweeps.status import summary_line

log = logging.getLogger(__name__)



@dataclass
class RwSweeperConf:
    _target_: str = "hydra_plugins.rw_sweeps_plugins.sweeper.RwSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None
    # The most runs a grid may have. Every job of a grid is expanded, validated and placed in this process's
    # memory before any starts, ~2 KB a run (a 100,000-run dry run held 180 MB more than a 10-run one, this VM,
    # 2026-12-07): a million runs ~2 GB, which one machine holds; ten million ~20 GB, which most do not, and a
    # slip such as seed='range(0,10000000)' would fill the memory for minutes before anything is said. So the
    # grid is counted first (`grid_size`) and one over the limit refused in one line; a larger grid raises it.
    max_runs: int = MAX_RUNS


ConfigStore.instance().store(group="hydra/sweeper", name="rw", node=RwSweeperConf, provider="rw_sweeps")


def outcome(ret, skipped: bool = False) -> str:
    """A job's outcome: `failed` for a FAILED JobReturn, else the run's status from its summary."""
    if ret.status != JobStatus.COMPLETED:
        return "failed"
    if skipped:
        return "skipped"
    value = job_value(ret)
    if isinstance(value, dict) and "status" in value:
        # a run found done is skipped; one kept as it ended (diverged, `hydra.launcher.retry`) counts as it ended
        return "skipped" if value.get("skipped") and value["status"] == "done" else str(value["status"])
    summary = read_summary(Path(job_folder(ret))) if job_folder(ret) else None
    return str(summary.get("status", "done")) if isinstance(summary, dict) else "done"


def typed_grid(parsed: list) -> list:
    """The grid's jobs as `split_arguments` lists them, each comma list's values as typed (`optim.lr=5e-1`
    where the job says `optim.lr=0.5`); any other override as Hydra writes it."""
    lists: Dict[str, list] = {}
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
            continue
        values = list(o.sweep_string_iterator())
        texts = _top_level(o.input_line.partition("=")[2]) if o.value_type == ValueType.SIMPLE_CHOICE_SWEEP else []
        lists[key] = [f"{key}={v}" for v in (texts if len(texts) == len(values) else values)]
    return [list(x) for x in itertools.product(*lists.values())]


def _top_level(text: str) -> list:
    """`a,[b,c],'d,e'` → ['a', '[b,c]', "'d,e'"]: a comma list split at its own commas."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


class RwSweeper(basic_sweeper()):
    def __init__(self, max_batch_size: Optional[int], params: Optional[Dict[str, str]] = None,
                 max_runs: int = MAX_RUNS) -> None:
        super().__init__(max_batch_size, params)
        self.max_runs = max_runs

    def _once_each(self, jobs: list, specs: list, planner, typed: list) -> list:
        """A grid that names one run twice (`optim.lr=1,1.0`, `seed=0,0`) trains it once, and says so in one
        line, each point as typed (`typed`: Hydra's jobs read `5e-1` and `0.5` alike); the jobs left are
        numbered as Hydra numbers a grid without the repeats."""
        again = placement.repeats(specs)
        if not again:
            return specs
        def differ(a, b):
            return " ".join(o for o in a if o not in b) or " ".join(a)

        shown = ", ".join(f"{differ(typed[i], typed[j])} = {differ(typed[j], typed[i])}" for i, j in list(again.items())[:3])
        more = f", … ({len(again)} in all)" if len(again) > 3 else ""
        print(f"grid: {len(again)} point(s) name a run already in it, each trained once: {shown}{more}", flush=True)
        kept = [job for i, job in enumerate(jobs) if i not in again]
        n = self.max_batch_size or len(kept)
        self.overrides = [kept[i:i + n] for i in range(0, len(kept), n)]
        return planner.plan(kept)

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.task_function = task_function

    def sweep(self, arguments: List[str]) -> Any:
        params_conf = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides(params_conf)
        refuse_large_grid(parsed, self.max_runs)  # counted before Hydra lists it: a huge grid is one line
        self.overrides = self.split_arguments(parsed, self.max_batch_size)
        twin = batch_function(self.task_function)
        specs = planner = None
        if twin is not None:
            jobs = [job for batch in self.overrides for job in batch]
            try:
                planner = Planner(self.hydra_context.config_loader, self.config)
                specs = planner.plan(jobs)
                specs = self._once_each(jobs, specs, planner, typed_grid(parsed))
                note_varies(specs)  # for Hydra's launchers that run the jobs in this process
                # runs that cannot work here fail now, in one line, not after training, where the launcher's
                # jobs train on this machine (the rw launcher's backend declares it; SLURM's jobs check in the
                # job; any other launcher's are taken to run here)
                if getattr(self.launcher, "trains_here", True):
                    problem = next((p for p in problems([s.cfg for s in specs], [s.shape for s in specs]) if p is not None), None)
                    if problem is not None:
                        raise problem
                    here = os.getpid()
                    for s in specs:  # checked once: the packed task does not ask again in this process
                        s.checked_in = here
            except Refused:
                raise  # before any job: nothing to report to on_multirun_end
            except Exception as exc:  # noqa: BLE001 - a composition error of one job: refused in one line
                raise Refused(one_line(exc)) from exc

        sweep_dir = Path(self.config.hydra.sweep.dir)
        dry_run = OmegaConf.select(self.config, "hydra.launcher.dry_run", default=False)
        if specs is not None and hasattr(self.launcher, "place"):
            # the folder is usable, the lock is taken, then every run of the grid finds its folder, before
            # anything else is written; a read-only sweep whose runs are all done is reported, untouched
            can_write = placement.writable(sweep_dir)  # FolderTaken: refused, in one line
            if can_write and not dry_run:
                self.launcher.take_lock()
            done = self.launcher.place(specs, planner)
            if not can_write and len(done) < len(specs):
                raise ConfigError("hydra.sweep.dir", str(sweep_dir),
                                  f"not writable, and {len(specs) - len(done)} of its {len(specs)} runs are not done")
            dry_run = dry_run or not can_write
        if not dry_run:
            ensure_dir(sweep_dir)
            try:
                atomic_write(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))  # what OmegaConf.save writes
            except OSError as exc:  # a full disk, a quota: before any job, one line, every finished run kept
                raise Refused(f"{sweep_dir / 'multirun.yaml'}: not written ({exc.strerror or one_line(exc)}); every "
                              f"finished run is kept in its folder: free space and run the same command again") from exc
        counts: Counter = Counter()
        returns, idx, detached = [], 0, False
        by_specs = specs is not None and hasattr(self.launcher, "launch_specs")
        while not self.is_done():
            batch = self.get_job_batch()
            if by_specs:
                results = self.launcher.launch_specs(specs[idx:idx + len(batch)], twin, planner)
            else:
                results = self.launcher.launch(batch, initial_job_idx=idx)
            idx += len(batch)
            if results is None:  # submitted and detached (or a dry run): nothing to count here
                detached = True
                continue
            skipped = getattr(self.launcher, "skipped", set())
            for r in results:
                st = outcome(r, job_folder(r) in skipped)
                counts[st] += 1
                if st == "failed":
                    err = job_value(r)
                    print(f"failed {job_folder(r)}: {one_line(err)}",
                          file=sys.stderr, flush=True)
            returns.append(results)
        if detached:
            return None
        print(summary_line(str(sweep_dir), counts), flush=True)
        if counts["failed"]:
            note_failed()
        return returns


# ------------------------------------------------------------------------------ hydra/sweeper=optuna
OPTUNA_IMPL = "hydra_plugins.hydra_optuna_sweeper._impl"  # the sweep itself; imported on the first study only


def _optuna_without_a_best(impl) -> None:
    """Wrap hydra-optuna-sweeper's `OptunaSweeperImpl.sweep`: a study with no completed trial, whose best
    trial Optuna cannot name, is refused in one line (`error: every trial of the study failed or diverged (N
    trials): no best value; …`, exit 2 at the front door); the trials' run folders are kept, and written first
    if written behind. Any other error is the sweeper's own."""
    cls = getattr(impl, "OptunaSweeperImpl", None)
    if cls is None or getattr(cls.sweep, "_rw_sweeps", False):
        return
    sweep = cls.sweep

    @functools.wraps(sweep)
    def wrapped(self, arguments):
        counts: Counter = Counter()
        where = OmegaConf.select(self.config, "hydra.sweep.dir", default=None) if self.config else None
        launch = self.launcher.launch

        def counted(job_overrides, initial_job_idx):  # the trials' outcomes, for the grid sweeper's last line
            results = launch(job_overrides, initial_job_idx)
            skipped = getattr(self.launcher, "skipped", set())
            counts.update(outcome(r, job_folder(r) in skipped) for r in results or ())
            return results

        self.launcher.launch = counted
        try:
            best = sweep(self, arguments)
            if counts:
                print(summary_line(str(where), counts), flush=True)
            return best
        except ValueError as exc:
            if "No trials are completed yet" not in str(exc):
                raise
            writer.flush()
            print(summary_line(str(where), counts), flush=True)
            raise Refused(f"every trial of the study failed or diverged ({self.n_trials} trials): no best value"
                          + (f"; their runs are in {where}" if where else "")) from None
        finally:
            del self.launcher.launch  # the launcher's own method again

    wrapped._rw_sweeps = True
    cls.sweep = wrapped


class _OptunaImplFinder:
    """Finds hydra-optuna-sweeper's `_impl` as Python would, and wraps its sweep once it is loaded. Plugin
    modules are executed again by Hydra's plugin scan (which skips `_impl`, and imports it only when a study
    starts), so the wrap is applied to the module a study uses, whatever the order of the scan."""
    _rw_sweeps = True

    def find_spec(self, name, path=None, target=None):
        if name != OPTUNA_IMPL:
            return None
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _optuna_without_a_best(module)

        spec.loader.exec_module = exec_module
        return spec


if OPTUNA_IMPL in sys.modules:
    _optuna_without_a_best(sys.modules[OPTUNA_IMPL])
elif not any(getattr(f, "_rw_sweeps", False) for f in sys.meta_path):
    sys.meta_path.insert(0, _OptunaImplFinder())
