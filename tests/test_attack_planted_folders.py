"""Attacks on a shared sweep folder that README "Faults" / "Results" say are harmless (found by a hostile review).

Each test asserts the promised behaviour; each failed on the tree it was written against:

- a folder whose name is a Unicode digit that int() cannot read ('²') holding a copy of a run crashes both
  analysis and the launcher with a ValueError traceback ("Analysis never crashes on a damaged folder");
- a run folder that is a symbolic link (to another run, inside or outside the sweep) is judged `done` by
  `contract.judge` and counted done by status, while analysis counts it corrupt and the launcher fails it
  ("Nothing in a sweep folder is ... followed"; "they agree on every run");
- a planted `.rw_sweep.json` whose run names are absolute paths or climb out with '..' makes status judge
  runs of another sweep and report an empty sweep "2 done";
- a 3 GiB sparse `runs.parquet` (no disk used) makes analysis allocate over 3 GiB before its seal is checked
  ("nothing ... allowed to ... exhaust a reader").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, launch
from ._hostile import run_measured

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

GRID = ("data.p=0.5,1", "data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("attack") / "sweep"
    r = launch("-m", *GRID, f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def _copy(sweep: Path, dst: Path) -> Path:
    shutil.copytree(sweep, dst, symlinks=True, ignore=shutil.ignore_patterns("runs.parquet", ".runs.parquet.seal"))
    return dst


def _status(d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rw_sweeps.sweeps.status", str(d)], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


@pytest.mark.parametrize("name", ["²", "①"])
def test_a_folder_named_by_a_digit_int_cannot_read_crashes_neither_analysis_nor_the_launcher(sweep, tmp_path, name):
    d = _copy(sweep, tmp_path / "s")
    shutil.copytree(d / "0", d / name)   # a stranger's copy of run 0 under a name str.isdigit() accepts
    from analysis import load_runs

    load_runs(str(d))                    # ValueError: invalid literal for int() with base 10: '²'
    r = launch("-m", *GRID, f"hydra.sweep.dir={d}")
    assert "Traceback" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-1500:]
    assert r.returncode == 0, (r.stdout + r.stderr)[-1500:]


@pytest.mark.parametrize("target", ["inside", "outside"])
def test_a_run_folder_that_is_a_link_is_not_judged_done_by_anyone(sweep, tmp_path, target):
    d = _copy(sweep, tmp_path / "s")
    shutil.rmtree(d / "1")
    (d / "1").symlink_to(d / "0" if target == "inside" else sweep / "1")
    from rw_sweeps.core.contract import judge

    v = judge(d / "1")
    assert v.state != "done", f"judge follows the planted link {d / '1'} and finds it done"
    st = _status(d)
    assert "2 done" not in st.stdout, st.stdout


def test_status_never_judges_run_folders_outside_its_sweep_that_a_planted_record_names(sweep, tmp_path):
    d = _copy(sweep, tmp_path / "s")
    shutil.rmtree(d / "0")
    shutil.rmtree(d / "1")               # the sweep folder holds no run at all
    rec = json.loads((d / ".rw_sweep.json").read_text())
    rec["runs"] = [str(sweep / "0"), os.path.relpath(sweep / "1", d)]
    rec["jobs"] = {j: rec["runs"] for j in rec["jobs"]}
    (d / ".rw_sweep.json").write_text(json.dumps(rec))
    st = _status(d)
    assert " done," not in st.stdout.replace("0 done,", ""), f"status judged runs of another sweep: {st.stdout}"


def test_a_huge_sparse_runs_parquet_does_not_exhaust_analysis(sweep, tmp_path):
    d = _copy(sweep, tmp_path / "s")
    with open(d / "runs.parquet", "wb") as f:
        f.truncate(3 << 30)              # sparse: no disk, no time to plant
    r, peak_mb = run_measured("analysis", str(d), "--out", str(tmp_path / "r"), timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    assert peak_mb < 1024, f"analysis peaked at {peak_mb:.0f} MB reading a planted 3 GiB sparse runs.parquet"
