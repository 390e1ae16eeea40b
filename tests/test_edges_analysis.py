"""The analysis at the edges of a shared folder, each case reproduced as a named test:

- the report was written by path: `--out` a link sent index.html, the PNGs and runs.parquet to the link's target,
  and the sweep-end analysis wrote `<sweep>/wandb_analysis/report` by path (a co-worker's swap for a link sent
  its files outside the sweep); every file now goes through `safefs`, and a link at the report's place is refused;
- the analysis of a folder that is no sweep replaced the user's own `runs.parquet` (and added a seal beside it);
- a sealed `adaptive.json` copied from another sweep of the user's into a grid's folder replaced the grid's
  phase diagrams by a failed adaptive one;
- a run folder's name printed raw: its escape codes reached the terminal and its newline forged a line.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import launch, python

TINY = ["data.n_train=64", "data.n_test=64", "model.M=200", "wandb.mode=disabled", "optim.steps=5"]
PLANTED = "X\x1b]0;pwned\x07\x1b[2J\nsweep fake: 99 runs"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished two-run grid over optim.lr (each test damages a copy of it)."""
    grid = tmp_path_factory.mktemp("made") / "grid"
    r = launch("-m", *TINY, "optim.lr=0.05,0.2", f"hydra.sweep.dir={grid}")
    assert r.returncode == 0, r.stderr
    return grid


@pytest.fixture
def grid(made, tmp_path) -> Path:
    """A fresh copy of the finished grid, without the analysis cache."""
    return Path(shutil.copytree(made, tmp_path / "grid", symlinks=True,
                                ignore=shutil.ignore_patterns("runs.parquet", ".runs.parquet.seal")))


def _pngs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.png"))


# ------------------------------------------------------------------------------------------ the report's folder
@pytest.mark.e2e  # it launches
def test_a_report_folder_that_is_a_link_is_refused_in_one_line(grid, tmp_path):
    target = tmp_path / "out5"
    target.mkdir()
    (grid / "report").symlink_to(target)
    r = python("-m", "analysis", grid, "--out", grid / "report")
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip() == (f"error: --out {grid / 'report'}: is a symbolic link; give a folder that is not a "
                                "link (the report is never written through one)")
    assert list(target.iterdir()) == []


@pytest.mark.e2e  # it launches
def test_the_sweep_end_report_folder_at_a_link_is_refused_not_followed(grid, tmp_path):
    from analysis.__main__ import build
    from rw_sweeps.core import safefs

    outside = tmp_path / "outside"
    outside.mkdir()
    (grid / "wandb_analysis").mkdir()
    (grid / "wandb_analysis" / "report").symlink_to(outside)
    with pytest.raises(safefs.PlantedLink, match="is a symbolic link; refusing to write through it"):
        build([grid], grid / "wandb_analysis" / "report")
    assert list(outside.iterdir()) == []


@pytest.mark.e2e  # it launches
def test_the_report_folder_swapped_for_a_link_mid_analysis_is_never_written_through(grid, tmp_path, monkeypatch):
    """A co-worker swaps the sweep-end report folder for a link while the analysis reads the runs: the next file
    written there is refused (reached from the sweep's handle, one folder at a time), none lands outside."""
    import analysis.__main__ as cli
    from rw_sweeps.core import safefs

    report, outside = grid / "wandb_analysis" / "report", tmp_path / "outside"
    outside.mkdir()
    real_load = cli.load_runs

    def load_then_swap(*a, **k):  # the real load; the swap comes after it, as a co-worker's would
        runs = real_load(*a, **k)
        os.rename(report, grid / "wandb_analysis" / "moved")
        report.symlink_to(outside)
        return runs

    monkeypatch.setattr(cli, "load_runs", load_then_swap)
    with pytest.raises(safefs.PlantedLink, match="is a symbolic link; refusing to write through it"):
        cli.build([grid], report)
    assert list(outside.iterdir()) == []


@pytest.mark.e2e  # it launches
def test_the_report_is_written_through_the_held_folder(grid, tmp_path):
    r = python("-m", "analysis", grid, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    assert "phase_success.png" in _pngs(tmp_path / "rep")
    assert (tmp_path / "rep" / "index.html").read_text().startswith("<!doctype html>")
    import pandas as pd

    assert sorted(pd.read_parquet(tmp_path / "rep" / "runs.parquet")["run"]) == ["0", "1"]
    assert not [p.name for p in (tmp_path / "rep").iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------------ the user's own files
@pytest.mark.e2e  # it launches
def test_a_users_own_runs_parquet_in_a_folder_that_is_no_sweep_is_left_as_it_is(grid, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine\n")
    mine = b"PAR1 the user's own data, not a cache"
    (home / "runs.parquet").write_bytes(mine)
    shutil.copytree(grid / "0", home / "0", symlinks=True)  # a copy of a run folder: a row to cache
    for _ in range(2):  # and again: still uncached, still the one line
        r = python("-m", "analysis", home, "--out", tmp_path / "rep")
        assert r.returncode == 0, r.stderr
        assert "runs 1, done 1" in r.stdout, r.stdout
        said = [line for line in r.stderr.splitlines() if "runs.parquet" in line]
        assert said == [f"note: {home / 'runs.parquet'} is not this project's cache (no sweep folder, and no seal "
                        "of yours): left as it is; the runs are read uncached"], r.stderr
        assert (home / "runs.parquet").read_bytes() == mine and not (home / ".runs.parquet.seal").exists()
    assert sorted(p.name for p in home.iterdir()) == ["0", "notes.txt", "runs.parquet"]


@pytest.mark.e2e  # it launches
def test_a_folder_without_a_runs_parquet_gets_the_sealed_cache(grid, tmp_path):
    from analysis.load import _read_cache

    home = tmp_path / "home"
    shutil.copytree(grid / "0", home / "0", symlinks=True)
    r = python("-m", "analysis", home, "--out", tmp_path / "rep")
    assert r.returncode == 0 and "runs.parquet" not in r.stderr, r.stderr
    cached, _ = _read_cache(home)
    assert cached["_run"].tolist() == ["0"]  # written, and its seal verifies


# ------------------------------------------------------------------------------------------ a copied adaptive record
@pytest.mark.e2e
def test_a_sealed_adaptive_json_copied_from_another_sweep_is_ignored_in_one_line(grid, tmp_path):
    adaptive = tmp_path / "adaptive"
    r = launch("-m", "hydra/sweeper=adaptive", *TINY, "optim.lr=tag(log,interval(0.01,0.3))",
               "hydra.sweeper.n_points=2", "hydra.sweeper.batch=2", f"hydra.sweep.dir={adaptive}")
    assert r.returncode == 0, r.stderr
    own = python("-m", "analysis", adaptive, "--out", tmp_path / "own")
    assert own.returncode == 0, own.stderr
    assert "adaptive_success.png" in _pngs(tmp_path / "own")  # its own sweep's record is still drawn by
    clean = python("-m", "analysis", grid, "--out", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    shutil.copy2(adaptive / "adaptive.json", grid / "adaptive.json")  # sealed by this user, another sweep's
    rec = json.loads((grid / "adaptive.json").read_text())
    assert {r for p in rec["points"] for r in p.get("runs", [])} <= {"0", "1"}  # the grid's names
    copied = python("-m", "analysis", grid, "--out", tmp_path / "copied")
    assert copied.returncode == 0, copied.stderr
    assert copied.stderr.splitlines() == [f"note: {grid / 'adaptive.json'} names none of the sweep's runs; "
                                          "ignored: drawn as a grid", *clean.stderr.splitlines()], copied.stderr
    assert _pngs(tmp_path / "copied") == _pngs(tmp_path / "clean") and "phase_success.png" in _pngs(tmp_path / "copied")
    assert copied.stdout.split(":", 1)[1] == clean.stdout.split(":", 1)[1]  # the same figures and counts


# ------------------------------------------------------------------------------------------ names printed
@pytest.mark.e2e  # it launches
def test_a_run_folder_named_with_escape_codes_is_printed_escaped(grid, tmp_path):
    shutil.copytree(grid / "0", grid / PLANTED, symlinks=True)  # a copy of a run folder, under a planted name
    r = python("-m", "analysis", grid, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "\x1b" not in out and "\x07" not in out
    assert not any(line.startswith("sweep fake") for line in out.splitlines()), out
    copy = [line for line in r.stderr.splitlines() if "a copy of 0" in line]
    assert len(copy) == 1 and copy[0].startswith(
        f"note: {grid}/X\\x1b]0;pwned\\x07\\x1b[2J\\x0asweep fake: 99 runs: a copy of 0 (the same run_id "), r.stderr
    assert r.stdout.startswith(f"{tmp_path / 'rep' / 'index.html'}: ") and "copies 1" in r.stdout
