"""Adaptive phase diagrams: runs placed where the outcome changes (`hydra/sweeper=adaptive`).

A sweep over continuous axes (`'init.sigma=tag(log,interval(1e-8,1e-1))'`, `data.p=interval(0,1)`) is a
function of a few parameters, and python-adaptive's learners (`Learner1D`, `Learner2D`, `LearnerND`) sample
such a function where it varies. The sweep's other swept keys are crossed with every point: its seeds
(`seed=range(0,8)`) are averaged into the point's value (the mean of the sweep's `metric` over them: a
success rate), and every combination of the others (`init=zero,gaussian`, `model.normalize=none,whole`) is a
panel of the phase diagram with a learner of its own, which places that panel's points where its own
outcome changes (one learner over both would learn their mean, whose boundary is neither's). A round asks
every panel's learner for its points and launches them all at once. A log axis is learned in log10 space.

The sweep is a replay. Round k's learner is built afresh from the values of the points that rounds
1 … k−1 asked, and asks the next `batch` points; the runs of those points are found in the sweep folder by
their config (`rw_sweeps.sweeps.placement`, judged by `rw_sweeps.core.contract`) and only the missing ones
are trained, in one ordinary launch. So a relaunch of the same command into the same folder asks the same
points in the same rounds, trains only what an interrupt left unfinished and ends with the same points and
values as a sweep never interrupted; a grown `n_points` replays the finished rounds and goes on. The
learner's own coordinates are the ones it asked (a point's value is told to it at the point it asked, never
at one read back from a config file), so the replay is exact.

`adaptive.json` in the sweep folder records the axes, the metric, the level whose set is the boundary and
each point's panel and run folders, sealed with the user's key (`rw_sweeps.core.seal`), for the analysis
(`python -m analysis` draws an adaptive sweep as a phase diagram over its axes, from those runs alone; an
unsealed record is ignored); the values are always read from the run folders.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from hydra.core.override_parser.types import Override, ValueType

from rw_sweeps.core import contract, seal
from rw_sweeps.core.errors import ConfigError
from rw_sweeps.core.metrics import OBJECTIVES, SUCCESS, metric_value
from rw_sweeps.core.safefs import atomic_write

RECORD = "adaptive.json"
DEFAULT_BATCH = 16  # points a round when neither hydra.sweeper.batch nor the launcher's job size says


def refuse(key: str, value: Any, allowed: str) -> None:
    """A bad sweeper key: one line before any job (`invalid config: hydra.sweeper.<key>=<value>: …`)."""
    raise ConfigError(f"hydra.sweeper.{key}", value, allowed)


@dataclass(frozen=True)
class Axis:
    """A continuous axis of the sweep: a config key over [lo, hi], learned in log10 space if `log`."""
    key: str
    lo: float
    hi: float
    log: bool

    @property
    def bounds(self) -> tuple[float, float]:
        """The axis in the learner's coordinates."""
        return (math.log10(self.lo), math.log10(self.hi)) if self.log else (self.lo, self.hi)

    def value(self, u: float) -> float:
        """The config value at learner coordinate `u` (clipped into [lo, hi]: 10**log10(hi) may exceed hi)."""
        x = 10.0 ** u if self.log else float(u)
        return min(self.hi, max(self.lo, x))


def parse_axes(overrides: Sequence[Override]) -> tuple[list[Axis], list[Override]]:
    """The sweep's axes (its `interval` overrides, `tag(log, …)` for a log axis) and every other override
    (fixed values and the swept keys crossed with every point). A key given twice is the last one given, as
    Hydra's grid sweeper reads `hydra.sweeper.params` and then the command line (`optim.lr=1.0` after a
    preset's lr axis fixes it). ConfigError for an axis it cannot learn."""
    last = {o.get_key_element(): o for o in overrides}
    axes, rest = [], []
    for o in last.values():
        if not (o.is_sweep_override() and o.value_type == ValueType.INTERVAL_SWEEP):
            rest.append(o)
            continue
        sweep = o.value()
        tags = set(sweep.tags or ())
        lo, hi = float(sweep.start), float(sweep.end)
        shown = o.input_line.partition("=")[2]
        if tags - {"log"}:
            raise ConfigError(o.key_or_group, shown, f"unknown tag(s) {', '.join(sorted(tags - {'log'}))}; an axis "
                              "is interval(a,b) or tag(log,interval(a,b))")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ConfigError(o.key_or_group, shown, "an axis needs finite bounds a < b")
        if "log" in tags and lo <= 0:
            raise ConfigError(o.key_or_group, shown, "a log axis needs bounds > 0")
        axes.append(Axis(o.key_or_group, lo, hi, "log" in tags))
    return axes, rest


def check_keys(metric: Any, n_points: Any, loss_goal: Any, batch: Any, level: Any, tol: Any, axes: list,
               loss: Any = "boundary") -> None:
    """Every sweeper key, and the axes, before any job: the first bad one is one line."""
    if loss not in LOSSES:
        refuse("loss", loss, f"must be {' or '.join(LOSSES)}")
    allowed = f"{SUCCESS} (the analysis's success rule) or a numeric summary field: {', '.join(OBJECTIVES)}"
    if metric != SUCCESS and metric not in OBJECTIVES:
        refuse("metric", metric, f"must be {allowed}")
    for key, v in (("n_points", n_points), ("batch", batch)):
        if v is not None and (type(v) is not int or v < 1):
            refuse(key, v, "must be an integer >= 1 or null")
    for key, v in (("loss_goal", loss_goal), ("level", level), ("tol", tol)):
        if v is not None and (type(v) not in (int, float) or not math.isfinite(v)):
            refuse(key, v, "must be a finite number" + (" or null" if key == "loss_goal" else ""))
    if metric == SUCCESS and level is not None and not 0 < level < 1:  # no rate's corners straddle it
        refuse("level", level, "metric=success is a rate: the level must be in (0, 1), e.g. 0.5")
    if loss_goal is not None and loss_goal <= 0:
        refuse("loss_goal", loss_goal, "must be > 0 or null")
    if tol is not None and tol < 0:
        refuse("tol", tol, "must be >= 0")
    if n_points is None:  # a goal alone may never be met: a noisy metric, or a corner without a value (inf)
        refuse("n_points", None, "give a budget of points a panel (hydra.sweeper.n_points=48), with or without "
               "hydra.sweeper.loss_goal: a loss goal alone may never be reached (a noisy metric, or a corner "
               "whose every run failed, keeps the learner's loss up)")
    if not axes:
        refuse("params", None, "no axis: give at least one key as interval(a,b) or tag(log,interval(a,b)), e.g. "
               "'init.sigma=tag(log,interval(1e-8,1e-1))'")
    if batch is not None and n_points is not None and batch > n_points:  # each round asks a whole batch
        refuse("batch", batch, f"must be at most hydra.sweeper.n_points={n_points}: a round never takes more "
               "points than the budget, and each asks the learner for a whole batch")
    if n_points is not None and n_points < 2 ** len(axes):
        refuse("n_points", n_points, f"must be >= {2 ** len(axes)}: the learner starts at the {2 ** len(axes)} "
               f"corners of its {len(axes)} axis(es)")


# ------------------------------------------------------------------------------------------ the learner
def _no_function(_x):
    raise RuntimeError("the adaptive sweeper evaluates points by launching runs, not by calling a function")


LOSSES = ("boundary", "default")
EXPLORE = 0.1  # the boundary loss's weight of a triangle the level set does not cross (it may hide an island)


def boundary_loss(level: float, explore: float = EXPLORE):
    """Learner2D's loss per triangle for a boundary: its linear size (√area in the unit square the learner
    scales the axes to), in full where the metric's level set crosses it (its corners' values straddle the
    level), `explore` of it elsewhere. The learner then splits the largest triangles on the boundary first,
    and the largest elsewhere once the boundary's are `explore` times smaller: it resolves the level set,
    not every slope of the metric (python-adaptive's default loss spends points on both)."""
    # adaptive: see new_learner
    from adaptive.learner.learner2D import areas

    def loss(ip) -> np.ndarray:
        values = np.asarray(ip.values)[:, 0][ip.tri.simplices]  # (triangles, 3)
        crossed = (values.min(axis=1) <= level) & (values.max(axis=1) >= level)
        return np.sqrt(areas(ip)) * np.where(crossed, 1.0, explore)
    return loss


def new_learner(axes: list[Axis], level: float | None = None):
    """A fresh python-adaptive learner over the axes (in their learner coordinates); with a `level`, two axes
    learn with the boundary loss (`boundary_loss`), one or more than two with python-adaptive's default."""
    # adaptive (scipy, sympy underneath): only an adaptive sweep needs it; Hydra imports the plugins at start-up
    import adaptive

    bounds = [a.bounds for a in axes]
    if len(axes) == 1:
        return adaptive.Learner1D(_no_function, bounds[0])
    if len(axes) == 2:
        return adaptive.Learner2D(_no_function, bounds, loss_per_triangle=None if level is None else boundary_loss(level))
    return adaptive.LearnerND(_no_function, bounds)


def _key(point) -> tuple:
    return tuple(float(u) for u in (point if hasattr(point, "__len__") else (point,)))


def _arg(point: tuple, ndim: int):
    """A point as the learner takes it: a float for Learner1D, a tuple otherwise."""
    return point[0] if ndim == 1 else point


def rebuilt(axes: list[Axis], told: dict, level: float | None = None):
    """The learner that has been told `told` ({point: value, or None for a point without any value}); a point
    without a value is pending (never asked again, interpolated by the learner)."""
    learner = new_learner(axes, level)
    known = {p: v for p, v in told.items() if v is not None}
    if known:
        learner.tell_many([_arg(p, len(axes)) for p in known], list(known.values()))
    for p, v in told.items():
        if v is None:
            learner.tell_pending(_arg(p, len(axes)))
    return learner


def loss(learner) -> float:
    try:
        return float(learner.loss())
    except (ValueError, ZeroDivisionError):  # too few points for a triangulation yet
        return math.inf


# ------------------------------------------------------------------------------------------ a run's value
def run_value(verdict: contract.Verdict, metric: str, tol: float) -> Optional[float]:
    """A run folder's value of the metric (`rw_sweeps.core.metrics.metric_value`): None unless the contract
    finds it done, failed or diverged."""
    if verdict.summary is None or verdict.state not in contract.STATUSES:
        return None
    return metric_value(verdict.summary, metric, tol)


AVERAGED = "seed"  # the one crossed key averaged into a point's value; every other one makes panels


def panels(crossed: list[list[str]]) -> dict[tuple, list[list[str]]]:
    """The crossed jobs grouped by panel, a panel named by its overrides of the keys that vary between the jobs
    but the seed (`("model.normalize=none",)`; `()` for every job when only seeds vary)."""
    keyed = [[(o.partition("=")[0].lstrip("+~"), o) for o in job] for job in crossed]
    seen: dict[str, set] = {}
    for job in keyed:
        for k, o in job:
            seen.setdefault(k, set()).add(o)
    varying = {k for k, values in seen.items() if len(values) > 1 and k != AVERAGED}
    out: dict[tuple, list[list[str]]] = {}
    for job, pairs in zip(crossed, keyed):
        out.setdefault(tuple(o for k, o in pairs if k in varying), []).append(job)
    return out


def point_value(values: list[Optional[float]]) -> Optional[float]:
    """A point's value: the mean over its runs (the panel's seeds) that have one."""
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else None


# ------------------------------------------------------------------------------------------ the sweep
@dataclass
class Round:
    """What one round did: its (panel, point)s, how many runs it asked for and how many of those it trained,
    and the learners' loss after it (the worst panel's)."""
    number: int
    points: list
    runs: int
    trained: int
    loss: float


def jobs_at(axes: list[Axis], crossed: list[list[str]], point: tuple) -> list[list[str]]:
    """The Hydra job overrides of a point: every crossed job with the axes' values (written as `repr`, so
    the value Hydra reads is the float the learner's coordinate gives)."""
    here = [f"{a.key}={a.value(u)!r}" for a, u in zip(axes, point)]
    return [[*job, *here] for job in crossed]


def _ask(axes: list[Axis], learner, told: dict, batch: int, n: int) -> list:
    """The next n new points of a panel's learner."""
    # always a whole batch asked, the last round taking its first n: a grown budget asks the same batch
    # there and finds those n among it, done
    asked, _ = learner.ask(batch)
    points = []
    for p in map(_key, asked):
        if p not in told and p not in points:
            points.append(p)
    # a cut batch keeps the axes' corners it asks first: Learner1D asks a fresh batch as a grid from lo up
    # to hi, and its first n alone would never reach hi (the learner's loss stays infinite)
    corners = {_key(c) for c in itertools.product(*(a.bounds for a in axes))}
    return sorted(points, key=lambda p: p not in corners)[:n]


def shown_panel(panel: tuple) -> str:
    return " ".join(panel) or "the sweep"


def sweep(axes: list[Axis], crossed: list[list[str]], *, batch: int, n_points: Optional[int],
          loss_goal: Optional[float], level: Optional[float] = None, evaluate: Callable[[list[list[str]]], Optional[tuple]],
          say: Callable[[str], None] = print,
          on_round: Optional[Callable[[dict], None]] = None) -> tuple[Optional[dict], list[Round]]:
    """Run the rounds: each asks every panel's learner (`panels`) for up to `batch` points, until the panel
    has `n_points` or reaches `loss_goal`. `evaluate(jobs)` launches the jobs (or finds them done) and returns
    (each job's value, how many of them it trained), or None when nothing ran (a dry run: the sweep stops
    there). `on_round` gets the values after each round. Returns ({panel: {point: value}}, the rounds), or
    (None, …) after a dry run."""
    groups = panels(crossed)
    told: dict = {panel: {} for panel in groups}
    active = list(groups)
    rounds: list[Round] = []
    several = len(groups) > 1
    where = lambda panel: f" ({shown_panel(panel)})" if several else ""  # noqa: E731
    while active:
        number = len(rounds) + 1
        asked: list = []  # (panel, point)
        for panel in list(active):
            mine = told[panel]
            learner = rebuilt(axes, mine, level)
            if (n_points is not None and len(mine) >= n_points) or (loss_goal is not None and loss(learner) <= loss_goal):
                active.remove(panel)
                continue
            n = batch if n_points is None else min(batch, n_points - len(mine))
            points = _ask(axes, learner, mine, batch, n)
            if not points:  # the learner asks nothing new: its domain is resolved as far as it can go
                say(f"round {number}: the learner asks no new point{where(panel)}; stopping"
                    + (" there" if several else ""))
                active.remove(panel)
                continue
            asked += [(panel, p) for p in points]
        if not asked:
            break
        jobs = [jobs_at(axes, groups[panel], p) for panel, p in asked]
        got = evaluate([j for js in jobs for j in js])
        if got is None:
            return None, rounds
        values, trained = got
        k = 0
        for (panel, p), js in zip(asked, jobs):
            told[panel][p] = point_value(values[k:k + len(js)])
            k += len(js)
        worst = max(loss(rebuilt(axes, told[panel], level)) for panel in groups)
        r = Round(number, asked, sum(len(js) for js in jobs), trained, worst)
        rounds.append(r)
        found = f" ({r.runs - r.trained} found done)" if r.trained < r.runs else ""
        spread = len({panel for panel, _ in asked})
        spread = f" in {spread} panel{'s' if spread > 1 else ''}" if several else ""
        say(f"round {r.number}: {len(asked)} points{spread}, {r.runs} runs{found}; loss {r.loss:.4g}"
            + (" (the worst panel's)" if several else ""))
        if on_round is not None:
            on_round(told)
        for panel in {panel for panel, _ in asked}:
            if all(told[panel][p] is None for q, p in asked if q == panel):  # more rounds would fail too
                say(f"round {r.number}: no run of this round has a value of the metric{where(panel)}; stopping"
                    + (" there" if several else ""))
                active.remove(panel)
    return told, rounds


def summary_line(sweep_dir: Any, told: dict, rounds: list[Round], metric: str) -> str:
    runs = sum(r.runs for r in rounds)
    trained = sum(r.trained for r in rounds)
    last = rounds[-1].loss if rounds else math.inf
    values = [v for mine in told.values() for v in mine.values()]
    empty = sum(v is None for v in values)
    several = f" over {len(told)} panels" if len(told) > 1 else ""
    return (f"adaptive sweep {sweep_dir}: {len(values)} points{several} in {len(rounds)} round(s), {runs} runs "
            f"({trained} trained, {runs - trained} found done); {metric} learned to loss {last:.4g}"
            + (" (the worst panel's)" if several else "")
            + (f"; {empty} point(s) without a value (every run failed or diverged)" if empty else ""))


def write_record(sweep_dir: Path, axes: list[Axis], crossed_keys: list[str], metric: str, level: float,
                 tol: float, told: dict, runs: Optional[dict] = None) -> None:
    """`adaptive.json`: what the analysis needs to draw the sweep (its values it reads from the run folders).
    `told` is {panel: {point: value}}; `runs` ({(panel, point): its run folders' names}): the analysis draws
    those runs alone, not others a relaunch with another fixed key left at the same point."""
    def entry(panel, p, v) -> dict:
        e = {"at": [a.value(u) for a, u in zip(axes, p)], "panel": list(panel), "value": v}
        if runs is not None and (panel, p) in runs:
            e["runs"] = list(runs[(panel, p)])
        return e
    record = {"version": 2, "axes": [asdict(a) for a in axes], "crossed": crossed_keys, "metric": metric,
              "level": level, "tol": tol,
              "points": [entry(panel, p, v) for panel, mine in told.items() for p, v in mine.items()]}
    # sealed as it will be read back (plain JSON values): a record someone else put in a sweep folder does not
    # verify, and the analysis ignores it (a planted one replaced a grid's phase diagrams)
    plain = json.loads(json.dumps(record, allow_nan=False, default=lambda v: None))
    atomic_write(Path(sweep_dir) / RECORD, json.dumps(seal.seal_record(RECORD, plain), indent=1) + "\n")
