"""`hydra/sweeper=adaptive` end to end: real Hydra processes, real runs, real python-adaptive learners.

The cheap metric with a boundary: success (test_acc ≥ OPT − 0.02) of zero init at p = 0.5 after 5 GD steps on
a tiny shape, over log lr ∈ [0.01, 0.3]: too small a step does not learn in 5 steps, and success starts near
lr ≈ 0.3 (further up, success comes and goes: the window is not clean there). A dense grid of the same runs
locates the boundary in the test itself.
"""
from __future__ import annotations

import json
import math
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import launch, start_launch, steps_lasting, summaries, wait_for_work

TINY = ["data.n_train=64", "data.n_test=64", "model.M=200", "wandb.mode=disabled"]
LR_AXIS = "optim.lr=tag(log,interval(0.01,0.3))"
WIDE = "optim.lr=tag(log,interval(0.01,100))"  # the window of success, both its edges
ADAPTIVE = ["hydra/sweeper=adaptive", *TINY]


def _record(sweep: Path) -> dict:
    return json.loads((sweep / "adaptive.json").read_text())


def _lr_points(sweep: Path) -> list[tuple[float, float]]:
    """(log10 lr, value) of every point the sweep sampled, by lr."""
    return sorted((math.log10(p["at"][0]), p["value"]) for p in _record(sweep)["points"])


def _boundaries(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The brackets (u_left, u_right) of adjacent sampled points on either side of success = 0.5."""
    return [(a[0], b[0]) for a, b in zip(points, points[1:]) if (a[1] >= 0.5) != (b[1] >= 0.5)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A dense grid over the same lr axis (33 log-spaced values: cells of 0.046 decade) and its boundaries."""
    sweep = tmp_path_factory.mktemp("dense") / "sweep"
    lrs = np.logspace(-2, math.log10(0.3), 33)
    r = launch("-m", *TINY, "optim.steps=5", "optim.lr=" + ",".join(repr(float(x)) for x in lrs),
               f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    runs = summaries(sweep)
    pts = sorted((math.log10(s["lr"]), float(s["test_acc"] >= s["opt_acc"] - 0.02)) for s in runs.values())
    return sweep, pts, _boundaries(pts)


@pytest.fixture(scope="module")
def adaptive_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("adaptive") / "sweep"
    r = launch("-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=14", "hydra.sweeper.batch=4",
               f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    return sweep, r


@pytest.mark.e2e
def test_the_sweeper_places_its_points_at_the_boundaries_a_dense_grid_finds(reference, adaptive_sweep):
    _, dense, dense_edges = reference
    sweep, r = adaptive_sweep
    assert len(dense_edges) == 1  # failure below, success above
    points = _lr_points(sweep)
    assert len(points) == 14 and len(summaries(sweep)) == 14
    edges = _boundaries(points)
    cell = math.log10(0.3 / 0.01) / 32  # the dense grid's cell
    uniform = math.log10(0.3 / 0.01) / 13  # the cell of a uniform grid of as many points (14)
    assert edges  # the sweep found the boundary, and placed its points around it
    for lo, hi in edges:
        # each adaptive bracket lies within one dense cell of the dense grid's, and is narrower than a dense cell
        # (a uniform grid of 14 points brackets it in 0.11 decade, 2.4 dense cells)
        (dlo, dhi), = dense_edges
        assert dlo - cell - 1e-9 <= lo and hi <= dhi + cell + 1e-9, (lo, hi, dlo, dhi)
        assert hi - lo < cell < uniform, (lo, hi)
    near = sum(dense_edges[0][0] - cell <= u <= dense_edges[0][1] + cell for u, _ in points)
    assert near >= 6  # of its 14 points, at least 6 within one dense cell of the boundary (a uniform grid: 1 or 2)
    # every point's value is its run's success, read from its folder
    by_lr = {round(math.log10(s["lr"]), 9): float(s["test_acc"] >= s["opt_acc"] - 0.02) for s in summaries(sweep).values()}
    assert {round(u, 9): v for u, v in points} == by_lr
    # one line per round, and the summary
    rounds = [ln for ln in r.stdout.splitlines() if ln.startswith("round ")]
    assert [ln.split(":")[0] for ln in rounds] == ["round 1", "round 2", "round 3", "round 4"]
    assert rounds[0].startswith("round 1: 4 points, 4 runs; loss ") and rounds[3].startswith("round 4: 2 points, 2 runs;")
    assert f"adaptive sweep {sweep}: 14 points in 4 round(s), 14 runs (14 trained, 0 found done)" in r.stdout
    assert f"sweep {sweep}: 14 runs: 14 done, 0 skipped, 0 failed, 0 diverged" in r.stdout


@pytest.mark.e2e
def test_a_relaunch_trains_nothing_and_a_grown_budget_adds_points(adaptive_sweep, tmp_path):
    sweep, _ = adaptive_sweep
    before = _lr_points(sweep)
    args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.batch=4", f"hydra.sweep.dir={sweep}"]
    again = launch(*args, "hydra.sweeper.n_points=14")
    assert again.returncode == 0, again.stderr
    assert "14 runs (0 trained, 14 found done)" in again.stdout and "training" not in again.stdout
    assert _lr_points(sweep) == before
    grown = launch(*args, "hydra.sweeper.n_points=18")
    assert grown.returncode == 0, grown.stderr
    assert "18 points in 5 round(s), 18 runs (4 trained, 14 found done)" in grown.stdout
    after = _lr_points(sweep)
    assert set(before) < set(after) and len(after) == 18 and len(summaries(sweep)) == 18


@pytest.mark.e2e
def test_an_interrupted_sweep_resumed_ends_with_the_points_and_values_of_an_uninterrupted_one(tmp_path):
    steps = steps_lasting(2.0)  # a round long enough to be interrupted in the middle of its training
    args = ["-m", *ADAPTIVE, f"optim.steps={steps}", LR_AXIS, "hydra.sweeper.n_points=10", "hydra.sweeper.batch=4"]
    whole = tmp_path / "whole"
    r = launch(*args, f"hydra.sweep.dir={whole}")
    assert r.returncode == 0, r.stderr

    cut = tmp_path / "cut"
    p = start_launch(*args, f"hydra.sweep.dir={cut}")
    seen = []
    while not any(ln.startswith("round 1:") for ln in seen):  # round 1 done, round 2 starts training
        line = p.stdout.readline()
        assert line, p.stderr.read()
        seen.append(line)
    while "training" not in (line := p.stdout.readline()):
        assert line, p.stderr.read()
    wait_for_work(p.pid, 0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert not (cut / "adaptive.json").exists() or len(_record(cut)["points"]) == 4  # round 2 was not recorded

    resumed = launch(*args, f"hydra.sweep.dir={cut}")
    assert resumed.returncode == 0, resumed.stderr
    assert "round 1: 4 points, 4 runs (4 found done)" in resumed.stdout
    assert _lr_points(cut) == _lr_points(whole)  # the same points, the same values
    assert {s["lr"]: s["test_acc"] for s in summaries(cut).values()} == \
        {s["lr"]: s["test_acc"] for s in summaries(whole).values()}


@pytest.mark.e2e
@pytest.mark.parametrize("args, line", [
    (["hydra.sweeper.metric=speed", LR_AXIS, "hydra.sweeper.n_points=8"],
     "error: invalid config: hydra.sweeper.metric='speed': must be success (the analysis's success rule) or a "
     "numeric summary field: test_acc,"),
    ([LR_AXIS], "error: invalid config: hydra.sweeper.n_points=None: give a budget of points"),
    ([LR_AXIS, "hydra.sweeper.loss_goal=0.1"],  # alone it ran on for hundreds of rounds on a noisy metric
     "error: invalid config: hydra.sweeper.n_points=None: give a budget of points a panel"),
    (["hydra.sweeper.n_points=8"], "error: invalid config: hydra.sweeper.params=None: no axis"),
    ([LR_AXIS, "hydra.sweeper.n_points=1"], "error: invalid config: hydra.sweeper.n_points=1: must be >= 2"),
    ([LR_AXIS, "hydra.sweeper.n_points=8", "hydra.sweeper.batch=0"],
     "error: invalid config: hydra.sweeper.batch=0: must be an integer >= 1 or null"),
    ([LR_AXIS, "hydra.sweeper.n_points=8", "hydra.sweeper.loss=curvature"],
     "error: invalid config: hydra.sweeper.loss='curvature': must be boundary or default"),
    ([LR_AXIS, "hydra.sweeper.n_points=8", "hydra.sweeper.budget=8"],
     "error: invalid config: hydra.sweeper.budget=8: unknown sweeper key; allowed: metric, n_points, loss_goal"),
    (["init.sigma=tag(log,interval(0,1))", "hydra.sweeper.n_points=8"],
     "error: invalid config: init.sigma='tag(log,interval(0,1))': a log axis needs bounds > 0"),
    (["data.p=interval(0,1.5)", "hydra.sweeper.n_points=8"], "error: invalid config: data.p=1.5: must be in [0, 1]"),
    (["init=interval(0,1)", "hydra.sweeper.n_points=8"],
     "error: invalid config: init='interval(0,1)': is a config group: an axis is a numeric key"),
    (["data.p=interval(0,1)", "data.p=0.5", "hydra.sweeper.n_points=8"],  # the last one given wins, as in Hydra
     "error: invalid config: hydra.sweeper.params=None: no axis"),
    ([LR_AXIS, "hydra.sweeper.n_points=8", "hydra/launcher=slurm", "hydra.launcher.detach=true"],
     "error: invalid config: hydra.launcher.detach=True: the adaptive sweeper asks each round's points"),
])
def test_a_bad_key_is_refused_in_one_line_before_any_job(args, line, tmp_path):
    sweep = tmp_path / "sweep"
    r = launch("-m", *ADAPTIVE, *args, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2
    assert r.stderr.startswith(line) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not sweep.exists()


@pytest.mark.e2e
def test_analysis_draws_the_adaptive_sweep_on_its_axes_and_grids_as_before(reference, adaptive_sweep, tmp_path):
    from analysis.__main__ import build
    from analysis.adaptive import adaptive_diagram, read_record
    from analysis import load_runs

    sweep, _ = adaptive_sweep
    dense, _, _ = reference
    rep = build([sweep, dense], tmp_path / "report")
    files = {f["file"] for f in rep.figures if "file" in f}
    assert "adaptive_success.png" in files and "phase_success.png" in files
    # the grid's diagram holds the grid's runs alone: 33 lr columns, none of the adaptive sweep's
    runs = load_runs(sweep)
    fig = adaptive_diagram(runs, read_record(sweep), [])
    pts = fig.phase_points
    drawn = np.array(sorted(zip(np.log10(pts["optim.lr"]), pts["value"])))
    assert drawn == pytest.approx(np.array(_lr_points(sweep)), abs=1e-12)
    assert (pts["runs"] == 1).all()


@pytest.mark.e2e
def test_a_two_axis_diagram_interpolates_on_the_learners_triangulation(tmp_path):
    """p × lr, seeds crossed: each point's value is the mean over its 2 seeds; the diagram's triangulation is
    Learner2D's own and its interpolation passes through every point's value."""
    import adaptive
    from matplotlib.tri import LinearTriInterpolator

    from analysis import add_success, load_runs
    from analysis.adaptive import adaptive_diagram, read_record, triangulation

    sweep = tmp_path / "sweep"
    r = launch("-m", *ADAPTIVE, "optim.steps=5", WIDE, "data.p=interval(0.5,0.9)", "seed=0,1",
               "hydra.sweeper.n_points=10", "hydra.sweeper.batch=5", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert "round 1: 5 points, 10 runs" in r.stdout
    runs, rec = add_success(load_runs(sweep)), read_record(sweep)
    assert len(runs) == 20 and rec["crossed"] == ["seed"]
    fig = adaptive_diagram(runs, rec, [])
    pts = fig.phase_points
    assert len(pts) == 10 and (pts["runs"] == 2).all()
    for _, row in pts.iterrows():  # the mean over seeds of success, from the runs themselves
        mine = runs[(runs["optim.lr"] == row["optim.lr"]) & (runs["data.p"] == row["data.p"])]
        assert row["value"] == pytest.approx(mine["success"].mean())
    tri = triangulation(pts, rec)
    u, v = np.log10(pts["optim.lr"].to_numpy()), pts["data.p"].to_numpy()
    learner = adaptive.Learner2D(None, [(-2.0, 2.0), (0.5, 0.9)])
    learner.tell_many(list(zip(u, v)), list(pts["value"]))
    assert sorted(map(sorted, tri.triangles.tolist())) == \
        sorted(map(sorted, learner.interpolator(scaled=True).tri.simplices.tolist()))
    assert LinearTriInterpolator(tri, pts["value"].to_numpy())(u, v).data == pytest.approx(pts["value"].to_numpy())


# ------------------------------------------------------------------ the rounds alone, on a known function
def _rounds(evaluate_point, n_points, batch, loss="boundary", told_runs=None, crossed=([],)):
    """`rw_sweeps.sweeps.adaptive.sweep` over σ × η (the escape cut's log axes), each job's value
    `evaluate_point(log10 σ, log10 η)` (`evaluate_point(log10 σ, log10 η, job)` with crossed keys); `told_runs`
    (a dict) is the run folders: jobs found there are not run. Returns the told values {panel: {point: value}}."""
    from rw_sweeps.sweeps import adaptive

    axes = [adaptive.Axis("init.sigma", 1e-8, 1e-1, True), adaptive.Axis("optim.lr", 0.3, 3.0, True)]
    runs = {} if told_runs is None else told_runs
    trained = []

    def evaluate(jobs):
        out = []
        for job in jobs:
            key = tuple(job)
            if key not in runs:
                values = dict(o.split("=") for o in job)
                at = math.log10(float(values["init.sigma"])), math.log10(float(values["optim.lr"]))
                runs[key] = evaluate_point(*at) if crossed == ([],) else evaluate_point(*at, values)
                trained.append(key)
            out.append(runs[key])
        return out, sum(tuple(j) in trained for j in jobs)

    told, rounds = adaptive.sweep(axes, list(crossed), batch=batch, n_points=n_points, loss_goal=None,
                                  evaluate=evaluate, level=0.5 if loss == "boundary" else None, say=lambda line: None)
    return axes, told, rounds, trained


def _escapes(u, v):  # a known boundary: escape above a line in log σ × log η, test_acc 1 above, 1/6 below
    return 1.0 if u > -4.5 + 1.5 * v else 1 / 6


def _agreement(axes, told, truth=None):
    from rw_sweeps.sweeps.adaptive import rebuilt

    learner = rebuilt(axes, told)  # python-adaptive's interpolation on its triangulation
    c = lambda lo, hi, n: lo + (hi - lo) * (np.arange(n) + 0.5) / n  # noqa: E731
    at = np.array([(u, v) for u in c(-8, -1, 16) for v in c(math.log10(0.3), math.log10(3), 16)])
    truth = np.array([(truth or _escapes)(u, v) >= 0.5 for u, v in at])
    scaled = (at - learner.xy_mean) / learner.xy_scale
    return ((learner.interpolator(scaled=True)(scaled).ravel() >= 0.5) == truth).mean()


def test_the_boundary_loss_resolves_a_known_boundary_better_than_the_default_loss_and_a_grid():
    axes, told, rounds, _ = _rounds(_escapes, 48, 8)
    told = told[()]
    assert len(told) == 48 and [len(r.points) for r in rounds] == [8] * 6
    near = sum(abs(u - (-4.5 + 1.5 * v)) < 0.7 for u, v in told)  # within a tenth of the σ axis of the line
    assert near >= 24  # half the points or more hug the boundary (a uniform 7×7 grid puts 7 of 49 there)
    boundary = _agreement(axes, told)
    _, default_told, _, _ = _rounds(_escapes, 48, 8, loss="default")
    assert boundary >= 0.95 and boundary > _agreement(axes, default_told[()])


def _escapes_later(u, v):  # the second panel's boundary: the same slope, two decades of σ lower
    return 1.0 if u > -6.5 + 1.5 * v else 1 / 6


def test_each_panel_of_crossed_keys_learns_its_own_boundary_and_only_the_seeds_are_averaged():
    """model.normalize=none,whole crossed with two seeds: two panels of 2 runs a point, each with a learner of
    its own. One learner over both learned their mean (1/6, 7/12 between the two lines, 1), whose level set
    0.5 is the lower line alone: the upper boundary got a grid's share of points."""
    crossed = [[f"model.normalize={n}", f"seed={s}"] for n in ("none", "whole") for s in (0, 1)]
    truth = {"none": _escapes, "whole": _escapes_later}
    axes, told, rounds, trained = _rounds(lambda u, v, job: truth[job["model.normalize"]](u, v), 48, 8,
                                          crossed=crossed)
    assert list(told) == [("model.normalize=none",), ("model.normalize=whole",)]
    assert all(len(mine) == 48 for mine in told.values()) and len(trained) == 2 * 48 * 2
    assert [len(r.points) for r in rounds] == [16] * 6 and [r.runs for r in rounds] == [32] * 6
    for (panel,), line in ((("model.normalize=none",), -4.5), (("model.normalize=whole",), -6.5)):
        mine = told[(panel,)]
        assert sum(abs(u - (line + 1.5 * v)) < 0.7 for u, v in mine) >= 24, panel  # half its points on its line
        assert _agreement(axes, mine, truth[panel.split("=")[1]]) >= 0.95, panel


def test_the_rounds_replayed_after_an_interrupt_ask_the_same_points():
    """Round 4 is cut after two of its jobs: the replay finds rounds 1–3 and those two jobs done, trains the
    rest, and ends where the uninterrupted sweep ends."""
    _, whole, _, _ = _rounds(_escapes, 40, 8)
    folders: dict = {}
    calls = []

    def cut(u, v):
        calls.append((u, v))
        if len(calls) == 27:
            raise KeyboardInterrupt
        return _escapes(u, v)

    with pytest.raises(KeyboardInterrupt):
        _rounds(cut, 40, 8, told_runs=folders)
    assert len(folders) == 26  # three rounds of 8 and two jobs of the fourth
    _, resumed, rounds, trained = _rounds(_escapes, 40, 8, told_runs=folders)
    assert resumed == whole and len(trained) == 14 and [r.trained for r in rounds] == [0, 0, 0, 6, 8]


@pytest.mark.e2e
def test_hydra_s_own_launcher_runs_the_same_rounds(tmp_path):
    """Under hydra/launcher=basic (one Hydra job a run) the rounds ask the same points and find the runs
    done on a relaunch, as under the rw launcher."""
    args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=6", "hydra.sweeper.batch=3"]
    ours, basic = tmp_path / "rw", tmp_path / "basic"
    assert launch(*args, f"hydra.sweep.dir={ours}").returncode == 0
    r = launch(*args, "hydra/launcher=basic", f"hydra.sweep.dir={basic}")
    assert r.returncode == 0, r.stderr
    assert _lr_points(basic) == _lr_points(ours) and len(summaries(basic)) == 6
    again = launch(*args, "hydra/launcher=basic", f"hydra.sweep.dir={basic}")
    assert "6 runs (0 trained, 6 found done)" in again.stdout, again.stdout + again.stderr


def test_rounds_stop_when_no_run_of_a_round_has_a_value():
    """A metric no run reaches (every run failed): the sweep stops after that round instead of asking on."""
    axes, told, rounds, trained = _rounds(lambda u, v: None, None, 4)
    assert len(rounds) == 1 and len(trained) == 4 and all(v is None for v in told[()].values())


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "adaptive.json has no list of axes"),
    ('{"axes": [{"key": "data.p", "lo": 1, "hi": 0, "log": false}]}', "an axis is not {key, lo < hi, log}"),
    ('{"axes": [{"key": "init.sigma", "lo": 0, "hi": 1, "log": true}]}', "an axis is not {key, lo < hi, log}"),
    ('{"axes": [{"key": "data.p", "lo": 0, "hi": 1, "log": false}], "metric": "__import__", "level": 0.5, "tol": 0}',
     "metric='__import__' is not one the sweeper learns"),
    ('{"axes": [{"key": "data.p", "lo": 0, "hi": 1, "log": false}], "metric": "success", "level": "half", "tol": 0}',
     "level is not a number"),
    ("{" * 100000, "adaptive.json"),
])
def test_a_planted_adaptive_record_is_refused_with_why(text, why, tmp_path):
    """The analysis reads `adaptive.json` as a file a stranger may write: a malformed one is Broken (the sweep is
    then drawn as a grid, with a note), never a traceback."""
    from analysis.adaptive import read_record
    from rw_sweeps.core.readers import Broken

    (tmp_path / "adaptive.json").write_text(text)
    with pytest.raises(Broken) as e:
        read_record(tmp_path)
    assert why in e.value.why
    assert read_record(tmp_path / "elsewhere") is None  # no record: a grid


# ------------------------------------------------------------------ found by attacking the sweeper
@pytest.mark.parametrize("n_points, batch", [(2, 16), (3, 16), (5, 8), (16, 16)])
def test_a_one_axis_sweep_smaller_than_its_batch_still_samples_both_ends_of_its_axis(n_points, batch):
    """Learner1D asks a fresh batch as a grid from lo up to hi; a budget below the batch took its first n and
    never sampled hi (lr ∈ [0.01, 0.3], 3 points: 0.0100, 0.0125, 0.0157, a learner of infinite loss), though
    the sweeper refuses n_points below 2 ** axes because "the learner starts at the corners"."""
    from rw_sweeps.sweeps import adaptive

    axes = [adaptive.Axis("optim.lr", 0.01, 0.3, True)]
    told, rounds = adaptive.sweep(axes, [[]], batch=batch, n_points=n_points, loss_goal=None, level=0.5,
                                  evaluate=lambda jobs: ([float(float(j[0].split("=")[1]) > 0.1) for j in jobs], len(jobs)),
                                  say=lambda line: None)
    lo, hi = axes[0].bounds
    assert list(told) == [()] and len(told[()]) == n_points and {(lo,), (hi,)} <= set(told[()])
    assert math.isfinite(rounds[-1].loss)


@pytest.mark.e2e
def test_the_diagram_draws_the_runs_of_the_last_sweep_not_those_another_config_left_at_its_points(tmp_path):
    """A relaunch into the same folder with another fixed key (data.p=0.5, then 1.0) asks the same corners;
    the diagram pooled both sweeps' runs there (2 runs a point, the mean of p = 0.5 and p = 1.0), though the
    record's learner learned the p = 1.0 runs alone."""
    from analysis import add_success, load_runs
    from analysis.adaptive import adaptive_diagram, read_record

    sweep = tmp_path / "sweep"
    args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.metric=test_acc", "hydra.sweeper.n_points=2",
            f"hydra.sweep.dir={sweep}"]
    for p in ("0.5", "1.0"):
        r = launch(*args, f"data.p={p}")
        assert r.returncode == 0, r.stderr
    runs, rec = add_success(load_runs(sweep)), read_record(sweep)
    assert len(runs) == 4
    pts = adaptive_diagram(runs, rec, []).phase_points
    last = runs[runs["data.p"] == 1.0].set_index("optim.lr")["test_acc"]
    assert (pts["runs"] == 1).all() and len(pts) == 2
    assert dict(zip(pts["optim.lr"], pts["value"])) == pytest.approx(last.to_dict())
    assert sorted(p["value"] for p in rec["points"]) == pytest.approx(sorted(last))


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["adaptive.json", "multirun.yaml"])
def test_a_folder_planted_where_the_sweeper_writes_its_record_is_refused_before_any_job(name, tmp_path):
    """A stranger's folder named adaptive.json in the sweep folder: the sweep trained round 1, then died with
    a traceback (IsADirectoryError) writing the record. It is refused in one line before any job."""
    sweep = tmp_path / "sweep"
    (sweep / name).mkdir(parents=True)
    r = launch("-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"error: invalid config: hydra.sweep.dir='{sweep}': {name} there is not a file")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in sweep.iterdir()) == [name]  # no run folder


@pytest.mark.e2e
@pytest.mark.parametrize("key, value", [("level", "nan"), ("level", "null"), ("tol", "inf"), ("loss_goal", "nan")])
def test_a_refusal_names_only_values_the_key_takes(key, value, tmp_path):
    """hydra.sweeper.level=nan was refused as "must be a finite number or null", and level=null then as "must be
    a number": a refusal's allowed values are ones the key accepts."""
    r = launch("-m", *ADAPTIVE, LR_AXIS, "hydra.sweeper.n_points=2", f"hydra.sweeper.{key}={value}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: invalid config: hydra.sweeper.{key}=")
    assert ("or null" in r.stderr) == (key == "loss_goal"), r.stderr


@pytest.mark.parametrize("n_axes", [1, 2])
def test_a_sweep_whose_every_run_diverged_is_drawn_with_its_points_and_says_so(n_axes):
    """lr ∈ [1e20, 1e30] (× p ∈ [0.2, 0.8]): every run diverges, no point has a test_acc. The diagram was titled
    "0 points, 0 runs" on empty axes around 0; it shows the sampled points, on the sweep's axes, and says why
    they have no value."""
    import pandas as pd

    from analysis.adaptive import adaptive_diagram

    axes = [{"key": "optim.lr", "lo": 1e20, "hi": 1e30, "log": True}, {"key": "data.p", "lo": 0.2, "hi": 0.8, "log": False}]
    at = [(1e20, 0.2), (1e20, 0.8), (1e30, 0.2), (1e30, 0.8)] if n_axes == 2 else [(1e20,), (1e25,), (1e30,)]
    rec = {"axes": axes[:n_axes], "crossed": [], "metric": "test_acc", "level": 0.5, "tol": 0.02,
           "points": [{"at": list(a), "value": None, "runs": [str(i)]} for i, a in enumerate(at)]}
    runs = pd.DataFrame([{**dict(zip(["optim.lr", "data.p"], a)), "status": "diverged", "test_acc": np.nan,
                          "opt_acc": 0.5, "steps": 5, "run": str(i), "sweep": "s"} for i, a in enumerate(at)])
    fig = adaptive_diagram(runs, rec, [])
    ax = fig.axes[0]
    assert ax.get_title() == f"{len(at)} points, {len(at)} runs; {len(at)} without a value (every run failed or diverged)"
    lo, hi = ax.get_xlim()
    assert lo <= 20 and hi >= 30
    if n_axes == 2:
        lo, hi = ax.get_ylim()
        assert lo <= 0.2 and hi >= 0.8
    shown = {tuple(np.round(xy, 6)) for line in ax.get_lines() for xy in line.get_xydata()}
    assert {(20.0,), (30.0,)} <= {xy[:1] for xy in shown}


@pytest.mark.e2e
def test_a_round_stopped_by_sigterm_resumes_its_runs_in_their_own_folders(tmp_path):
    """SIGTERM in round 2 checkpoints its runs ("run the same command again to resume"). The relaunch numbered
    round 2 above those checkpoint-only folders, trained its runs again from step 0 in new ones and left the
    checkpoints behind, unfinished for ever. It resumes them where they are: every folder ends done."""
    steps = steps_lasting(3.0)
    args = ["-m", *ADAPTIVE, f"optim.steps={steps}", LR_AXIS, "hydra.sweeper.n_points=6", "hydra.sweeper.batch=3"]
    sweep = tmp_path / "sweep"
    p = start_launch(*args, f"hydra.sweep.dir={sweep}")
    while not (line := p.stdout.readline()).startswith("round 1:"):
        assert line, p.stderr.read()
    while "training" not in (line := p.stdout.readline()):
        assert line, p.stderr.read()
    wait_for_work(p.pid, 0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert "stopped by SIGTERM" in err, out + err
    interrupted = sorted(d.name for d in sweep.iterdir() if d.is_dir() and not (d / "summary.json").exists())
    assert interrupted == ["3", "4", "5"] and all((sweep / d / "checkpoint.pt").exists() for d in interrupted)
    kept = {d: (sweep / d / "checkpoint.pt").read_bytes() for d in interrupted}

    # another sweep into the folder first (other bounds): its new run never lands on those checkpoints
    other = launch(*[a if a != LR_AXIS else "optim.lr=tag(log,interval(0.02,0.3))" for a in args],
                   "hydra.sweeper.n_points=2", "hydra.sweeper.batch=2", f"hydra.sweep.dir={sweep}")
    assert other.returncode == 0, other.stderr
    assert {d: (sweep / d / "checkpoint.pt").read_bytes() for d in interrupted} == kept
    assert sorted(d.name for d in sweep.iterdir() if d.is_dir()) == ["0", "1", "2", "3", "4", "5", "6"]

    resumed = launch(*args, f"hydra.sweep.dir={sweep}")
    assert resumed.returncode == 0, resumed.stderr
    assert "6 runs (3 trained, 3 found done)" in resumed.stdout
    assert all(f"resuming {sweep / d} from its checkpoint" in resumed.stdout for d in interrupted), resumed.stdout
    folders = sorted(d.name for d in sweep.iterdir() if d.is_dir())
    assert folders == ["0", "1", "2", "3", "4", "5", "6"], folders  # no run trained again elsewhere
    assert all(s["status"] == "done" and s["steps"] == steps for s in summaries(sweep).values())


@pytest.mark.e2e
@pytest.mark.parametrize("level", ["0", "1", "5", "-0.5"])
def test_a_success_level_no_success_rate_can_cross_is_refused(level, tmp_path):
    """metric=success is a rate in [0, 1]: at level 5 (or 0, or 1) no triangle's corners straddle the level, so the
    boundary loss spent every point on exploring and the diagram drew no boundary, all without a word."""
    r = launch("-m", *ADAPTIVE, LR_AXIS, "hydra.sweeper.n_points=2", f"hydra.sweeper.level={level}",
               f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: invalid config: hydra.sweeper.level={float(level)}: metric=success is a rate: "
                               "the level must be in (0, 1)"), r.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_numbered_link_or_file_planted_in_the_sweep_folder_is_stepped_over(planted, tmp_path):
    """A stranger's link `0 -> elsewhere` (or a file `0`): the first round numbered its runs from 0, so the run
    sent there failed ("the run folder is a symbolic link") and its point had no value. Rounds number their
    runs above every numbered entry, whatever it is; the planted entry and its target are left alone."""
    sweep, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    sweep.mkdir()
    elsewhere.mkdir()
    if planted == "link":
        (sweep / "0").symlink_to(elsewhere)
    else:
        (sweep / "0").write_text("not a run\n")
    r = launch("-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert "2 runs: 2 done" in r.stdout and all(p["value"] is not None for p in _record(sweep)["points"])
    assert list(elsewhere.iterdir()) == [] and ((sweep / "0").is_symlink() if planted == "link"
                                                 else (sweep / "0").read_text() == "not a run\n")


@pytest.mark.e2e
def test_a_batch_above_the_budget_is_refused_at_once(tmp_path):
    """n_points=4 with batch=1000000: every round asks the learner for a whole batch, and Learner2D spent minutes
    placing a million points before any job (a dry run was still asking after 60 s). One line, at once."""
    r = launch("-m", *ADAPTIVE, LR_AXIS, "data.p=interval(0.2,0.8)", "hydra.sweeper.n_points=4",
               "hydra.sweeper.batch=1000000", f"hydra.sweep.dir={tmp_path / 'sweep'}", timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: invalid config: hydra.sweeper.batch=1000000: must be at most "
                               "hydra.sweeper.n_points=4"), r.stderr


# ------------------------------------------------------------------ found by attacking the panels
def test_a_config_group_crossed_is_drawn_one_panel_per_recorded_panel():
    """optim=gd,adam crossed with an lr axis: two panels in the record, but the runs table's column is
    optim.name, not optim, so the diagram dropped the facet and drew the mean of gd and adam at every point
    (0.230 = (0.1016 + 0.3594) / 2). It draws each recorded panel from its own runs."""
    import pandas as pd

    from analysis.adaptive import adaptive_diagram

    axes = [{"key": "optim.lr", "lo": 0.01, "hi": 0.3, "log": True}]
    lrs, acc = [0.01, 0.3], {"gd": 0.1016, "adam": 0.3594}
    entries, rows = [], []
    for name in ("gd", "adam"):
        for lr in lrs:
            names = [str(len(rows) + s) for s in range(2)]
            entries.append({"at": [lr], "panel": [f"optim={name}"], "value": acc[name], "runs": names})
            rows += [{"optim.lr": lr, "optim.name": name, "seed": s, "status": "done", "test_acc": acc[name],
                      "opt_acc": 0.5, "steps": 5, "run": r, "sweep": "s"} for s, r in enumerate(names)]
    rec = {"axes": axes, "crossed": ["optim", "seed"], "metric": "test_acc", "level": 0.5, "tol": 0.02,
           "points": entries}
    fig = adaptive_diagram(pd.DataFrame(rows), rec, [])
    assert [ax.get_title() for ax in fig.axes] == ["optim=adam: 2 points, 4 runs", "optim=gd: 2 points, 4 runs"]
    assert sorted(fig.phase_points["value"]) == [0.1016, 0.1016, 0.3594, 0.3594]


def test_panels_are_named_by_the_keys_that_vary_and_a_job_given_twice_counts_once():
    """A panel was named by every fixed override of its jobs (data.n_train=64 … model.normalize=none); the
    sweeper's jobs are deduplicated (seed=0,0,1 trained seed 0 twice and weighted it twice in the mean)."""
    from rw_sweeps.sweeps.adaptive import panels

    fixed = ["data.n_train=64", "optim.steps=5"]
    crossed = [[*fixed, f"model.normalize={n}", f"seed={s}"] for n in ("none", "whole") for s in (0, 1)]
    got = panels(crossed)
    assert list(got) == [("model.normalize=none",), ("model.normalize=whole",)]
    assert got[("model.normalize=none",)] == crossed[:2]
    assert list(panels([[*fixed, "seed=0"], [*fixed, "seed=1"]])) == [()]


@pytest.mark.e2e
def test_a_crossed_value_given_twice_is_one_job(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "model.normalize=none,none", "seed=0,0,1",
               "hydra.sweeper.n_points=3", "hydra.sweeper.batch=3", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert "3 points in 1 round(s), 6 runs (6 trained, 0 found done)" in r.stdout, r.stdout
    assert all(len(p["runs"]) == 2 and len(set(p["runs"])) == 2 for p in _record(sweep)["points"])
