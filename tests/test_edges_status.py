"""One function maps a run to its folder for every `hydra.sweep.subdir`
(`rw_sweeps.core.layout`), and `rw-status SWEEP` counts the sweep folder's runs by the contract, every launch
and sweeper included, naming the folder as it was given.

Each case of the issue is a named test on real launches (`launch.py`, `python -m analysis`, `rw-status` as a
user runs them); the layout's rules (links never followed, a record's names kept inside the folder, wandb's
folders no runs) are tested on folders made here.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rw_sweeps.core import layout
from rw_sweeps.sweeps import status

from .conftest import ROOT, launch, python, status_cmd

GRID = ["data.p=0,0.5", "optim.steps=5", "data.n_test=200"]
NESTED = "hydra.sweep.subdir=${hydra.job.num}/run"
ADAPTIVE = ["hydra/sweeper=adaptive", "optim.steps=5", "data.n_test=200", "data.p=interval(0,1)",
            "hydra.sweeper.metric=test_acc", "hydra.sweeper.batch=2", NESTED]


def ok(r):
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def analysed(sweep: Path, out: Path) -> str:
    """`python -m analysis SWEEP`'s last line (its counts of the sweep's runs)."""
    r = ok(python("-m", "analysis", str(sweep), "--out", str(out)))
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def nested(tmp_path_factory) -> Path:
    """A finished 2-run grid under `hydra.sweep.subdir=${hydra.job.num}/run`."""
    sweep = tmp_path_factory.mktemp("nested") / "S"
    ok(launch("-m", *GRID, f"hydra.sweep.dir={sweep}", NESTED))
    return sweep


@pytest.fixture(scope="module")
def adaptive_relaunched(tmp_path_factory) -> Path:
    """An adaptive sweep of 4 points under a nested subdir, relaunched to 6 (4 found done, 2 trained)."""
    sweep = tmp_path_factory.mktemp("adaptive") / "S"
    ok(launch("-m", *ADAPTIVE, "hydra.sweeper.n_points=4", f"hydra.sweep.dir={sweep}"))
    ok(launch("-m", *ADAPTIVE, "hydra.sweeper.n_points=6", f"hydra.sweep.dir={sweep}"))
    return sweep


# ------------------------------------------------------------------------- every subdir
@pytest.mark.e2e
def test_a_nested_subdir_job_num_run_is_found_by_analysis_and_status(nested, tmp_path):
    assert sorted(p.relative_to(nested).as_posix() for p in nested.glob("*/*/summary.json")) == [
        "0/run/summary.json", "1/run/summary.json"]
    assert "runs 2, done 2, failed 0, diverged 0, unfinished 0, corrupt 0" in analysed(nested, tmp_path / "report")
    r = status_cmd(str(nested), timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"sweep {nested}: 2 runs: 2 done, 0 skipped, 0 failed"), r
    assert layout.run_folders(nested) == ["0/run", "1/run"]


@pytest.mark.e2e
def test_analysis_names_a_nested_run_by_its_folder_inside_the_sweep(nested):
    from analysis import load_runs

    df = load_runs(nested, cache=False)
    assert df["run"].tolist() == ["0/run", "1/run"] and df["status"].tolist() == ["done", "done"]
    assert df["path"].tolist() == [str(nested / "0" / "run"), str(nested / "1" / "run")]
    assert sorted(df["data.p"].tolist()) == [0.0, 0.5]


@pytest.mark.e2e
def test_a_relaunch_of_a_nested_subdir_grows_the_grid_and_finds_the_old_runs(tmp_path):
    sweep = tmp_path / "S"
    ok(launch("-m", *GRID, f"hydra.sweep.dir={sweep}", NESTED))
    r = ok(launch("-m", "data.p=0,0.5,1", "optim.steps=5", "data.n_test=200", f"hydra.sweep.dir={sweep}", NESTED))
    assert "3 runs: 1 done, 2 skipped" in r.stdout
    assert "runs 3, done 3" in analysed(sweep, tmp_path / "report")
    assert status_cmd(str(sweep), timeout=120).stdout.startswith(f"sweep {sweep}: 3 runs: 1 done, 2 skipped, 0 failed")


@pytest.mark.e2e
def test_a_subdir_named_by_a_key_is_found(tmp_path):
    sweep = tmp_path / "S"
    ok(launch("-m", *GRID, f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=p${data.p}"))
    assert layout.run_folders(sweep) == ["p0.0", "p0.5"]
    assert "runs 2, done 2, failed 0" in analysed(sweep, tmp_path / "report")
    assert status_cmd(str(sweep), timeout=120).stdout.startswith(f"sweep {sweep}: 2 runs: 2 done, 0 skipped")


@pytest.mark.e2e
def test_the_default_subdir_is_found(tmp_path):
    sweep = tmp_path / "S"
    ok(launch("-m", *GRID, f"hydra.sweep.dir={sweep}"))
    assert layout.run_folders(sweep) == ["0", "1"]
    assert "runs 2, done 2, failed 0" in analysed(sweep, tmp_path / "report")
    assert status_cmd(str(sweep), timeout=120).stdout.startswith(f"sweep {sweep}: 2 runs: 2 done, 0 skipped")


@pytest.mark.e2e
def test_adaptive_json_names_each_point_s_runs_by_their_folder(adaptive_relaunched, tmp_path):
    """Until hydra_plugins/rw_sweeps_plugins/adaptive.py records `layout.name_of(sweep_dir, folder)` (not the
    folder's last part), every point names `run` and the analysis draws no adaptive diagram."""
    rec = json.loads((adaptive_relaunched / "adaptive.json").read_text())
    named = sorted(r for p in rec["points"] for r in p["runs"])
    assert named == [f"{n}/run" for n in range(6)], named
    r = ok(python("-m", "analysis", str(adaptive_relaunched), "--out", str(tmp_path / "report")))
    assert "adaptive_test_acc not drawn" not in r.stdout + r.stderr
    assert (tmp_path / "report" / "adaptive_test_acc.png").exists()


# ------------------------------------------------------------------------- rw-status SWEEP
@pytest.mark.e2e
def test_status_after_a_relaunch_of_an_adaptive_sweep_counts_all_its_runs(adaptive_relaunched):
    rec = status.read_record(adaptive_relaunched)
    assert len(rec["runs"]) == 2  # the last launch trained only the 2 new points' runs
    r = status_cmd(str(adaptive_relaunched), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sweep {adaptive_relaunched}: 6 runs: 6 done, 0 skipped, 0 failed, 0 diverged, "
                               "0 running, 0 pending"), r.stdout


@pytest.mark.e2e
def test_status_after_a_relaunch_of_part_of_a_grid_counts_the_whole_grid(tmp_path):
    sweep = tmp_path / "S"
    ok(launch("-m", *GRID, f"hydra.sweep.dir={sweep}"))
    ok(launch("-m", "data.p=0", "optim.steps=5", "data.n_test=200", f"hydra.sweep.dir={sweep}"))
    assert status.read_record(sweep)["runs"] == ["0"]  # the relaunch asked for one run and found it done
    r = status_cmd(str(sweep), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sweep {sweep}: 2 runs: 1 done, 1 skipped, 0 failed, 0 diverged, 0 running, "
                               "0 pending"), r.stdout
    r = status_cmd(str(sweep), "--wait", "--interval", "0.1", timeout=120)
    assert r.returncode == 0 and r.stdout == f"sweep {sweep}: 2 runs: 1 done, 1 skipped, 0 failed, 0 diverged\n"


@pytest.mark.e2e
def test_status_of_a_finished_run_folder_is_its_verdict(nested):
    run = nested / "0" / "run"
    r = status_cmd(str(run), timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"run {run}: done\n", "")


@pytest.mark.e2e
def test_status_of_a_damaged_run_folder_says_why_and_fails(nested, tmp_path):
    run = tmp_path / "R"
    shutil.copytree(nested / "1" / "run", run)
    (run / "history.jsonl").write_text("")
    r = status_cmd(str(run), timeout=120)
    assert r.returncode == 1 and r.stdout.startswith(f"run {run}: corrupt: "), r.stdout
    (run / "summary.json").unlink()
    r = status_cmd(str(run), timeout=120)
    assert (r.returncode, r.stdout) == (0, f"run {run}: unfinished: no summary.json\n")


@pytest.mark.e2e
def test_status_names_the_folder_as_given_not_the_records_path(nested, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(nested, moved, symlinks=True)  # its record still says the old path
    assert status.read_record(moved)["sweep"] == str(nested)
    r = status_cmd("./" + os.path.relpath(moved, ROOT) + "/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sweep ./{os.path.relpath(moved, ROOT)}/: 2 runs: 2 done"), r.stdout
    assert str(nested) not in r.stdout + r.stderr


@pytest.mark.e2e
def test_a_run_an_earlier_launch_left_unfinished_is_counted_and_waited_past(nested, tmp_path):
    sweep = tmp_path / "S"
    shutil.copytree(nested, sweep, symlinks=True)
    (sweep / "7" / "run").mkdir(parents=True)
    shutil.copy(nested / "0" / "run" / "config.yaml", sweep / "7" / "run" / "config.yaml")  # stopped: no summary
    r = status_cmd(str(sweep), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"sweep {sweep}: 3 runs: 2 done, 0 skipped, 0 failed, 0 diverged, 0 running, "
                               "0 pending, 1 unfinished"), r.stdout
    r = status_cmd(str(sweep), "--wait", "--interval", "0.1", timeout=120)  # nothing will finish it: no hang
    assert r.stdout == f"sweep {sweep}: 3 runs: 2 done, 0 skipped, 0 failed, 0 diverged, 1 unfinished\n"


@pytest.mark.e2e
def test_a_link_on_a_recorded_run_s_path_is_not_followed(nested, tmp_path):
    victim = tmp_path / "victim"
    shutil.copytree(nested / "0", victim)  # a finished run that is not the sweep's
    sweep = tmp_path / "S"
    shutil.copytree(nested, sweep, symlinks=True)
    shutil.rmtree(sweep / "0")
    os.symlink(victim, sweep / "0")
    r = status_cmd(str(sweep), timeout=120)
    assert r.returncode == 1
    assert r.stdout.startswith(f"sweep {sweep}: 2 runs: 1 done, 0 skipped, 1 failed"), r.stdout
    assert f"failed {sweep}/0/run: corrupt: 0 on its path is a symbolic link; it is not followed" in r.stderr


# ------------------------------------------------------------------------- the layout's rules
def _run(folder: Path, files=("config.yaml",)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f).write_text("x")


def test_layout_finds_runs_at_every_depth_and_stops_at_a_run_folder(tmp_path):
    _run(tmp_path / "0" / "run")
    _run(tmp_path / "p0.5")
    _run(tmp_path / "a" / "b" / "c", ("summary.json",))
    _run(tmp_path / "p0.5" / "inner")  # inside a run folder: its own business
    (tmp_path / "3").mkdir()  # a job's folder with nothing in it yet
    (tmp_path / "4" / "run").mkdir(parents=True)  # a folder of run folders, none written yet: no run
    (tmp_path / "notes").mkdir()
    assert layout.run_folders(tmp_path) == ["0/run", "3", "a/b/c", "p0.5"]
    # with a record, an empty numbered folder it does not name is no run (a planted `007` is not counted)
    assert layout.run_folders(tmp_path, ["4/run"]) == ["0/run", "4/run", "a/b/c", "p0.5"]


def test_with_a_record_planted_links_files_and_empty_folders_are_no_runs(tmp_path):
    _run(tmp_path / "0")
    _run(tmp_path / "1")
    (tmp_path / ("9" * 255)).write_text("x")  # a file named with 255 digits
    os.symlink(tmp_path / "0", tmp_path / "latest")  # a convenience link
    os.symlink(tmp_path / "0", tmp_path / "7")
    for n in ("007", "5099", "1" * 29):
        (tmp_path / n).mkdir()
    assert layout.run_folders(tmp_path, ["0", "1"]) == ["0", "1"]
    assert layout.runs(tmp_path, ["0", "1", "7"])["7"] == layout.LINK  # named by the record: judged, not followed
    assert len(layout.run_folders(tmp_path)) > 2  # no record (Hydra's own launcher): every candidate is judged


def test_layout_orders_runs_by_job_number_part_by_part(tmp_path):
    for name in ("10/run", "2/run", "x", "1"):
        _run(tmp_path / name)
    assert layout.run_folders(tmp_path) == ["1", "2/run", "10/run", "x"]


def test_layout_takes_no_wandb_folder_for_a_run(tmp_path):
    for name in ("wandb_jobs/j1/wandb/offline-run-1/files", "wandb_analysis/wandb/offline-run-2/files",
                 "x/wandb/offline-run-3/files", "0/wandb/offline-run-4/files"):
        _run(tmp_path / name)  # each `files/` holds a config.yaml of wandb's
    (tmp_path / ".hidden").mkdir()
    _run(tmp_path / ".hidden" / "x")
    assert layout.run_folders(tmp_path) == ["0"]  # a job's folder whose run had started wandb alone: unfinished


def test_layout_names_a_link_and_never_enters_it(tmp_path):
    outside = tmp_path / "outside"
    _run(outside / "run")
    sweep = tmp_path / "S"
    sweep.mkdir()
    os.symlink(outside, sweep / "0")
    os.symlink(outside, sweep / "elsewhere")
    (sweep / "5").write_text("a file at a run's place")
    assert layout.runs(sweep) == {"0": layout.LINK, "5": layout.NOT_A_FOLDER, "elsewhere": layout.LINK}
    # with a record, what it does not name and is no run folder (the file 5, the link elsewhere) is not counted
    assert layout.runs(sweep, ["0/run"]) == {"0/run": "0 on its path is a symbolic link; it is not followed"}
    assert layout.problem(sweep, "0") == layout.LINK
    assert layout.problem(sweep, "0/run") == "0 on its path is a symbolic link; it is not followed"
    assert layout.problem(sweep, "5") == layout.NOT_A_FOLDER
    assert layout.problem(sweep, "9/run") is None  # not made yet


@pytest.mark.parametrize("name", ["../x", "/etc", "a//b", "a/../../b", "./0", "", "a\0b", 7])
def test_layout_refuses_a_recorded_name_outside_the_folder(tmp_path, name):
    assert not layout.valid_name(name)
    assert layout.run_folders(tmp_path, [name]) == []


def test_layout_names_a_run_by_its_path_inside_the_sweep(tmp_path):
    assert layout.name_of(tmp_path, tmp_path / "0" / "run") == "0/run"
    assert layout.name_of(tmp_path, tmp_path / "p0.5") == "p0.5"
    assert layout.name_of(tmp_path, tmp_path.parent / "x") is None
    assert layout.name_of(tmp_path, tmp_path) is None
