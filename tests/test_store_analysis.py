"""analysis on a sweep whose runs are stored (`rw_sweeps.core.store`): the table, histories and report of a
stored sweep are those of the same grid launched with run folders, read from the verified heads and bodies.

Each grid is launched once per module, for real (launch.py), twice: with `hydra.launcher.store=true` and
with `false`. Expected values come from the folder twin, read as always.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import load as load_module
from analysis.load import load_history, load_runs, load_snapshots
from analysis.phase import add_success, phase_diagram
from analysis.report import counts
from rw_sweeps.core import store
from rw_sweeps.core.store import shard

from .conftest import SMALL, launch, python

pytestmark = pytest.mark.e2e  # the sweeps are made by launch.py

GRID = ["data.p=0,0.5,1", "init=zero,gaussian", *SMALL, "wandb.mode=disabled", "wandb.group=twins"]
# what two launches of one grid differ in: where the runs are, how long they took, their ids
PLACE = ["path", "sweep", "wall_s", "run_id"]


def _launch(folder: Path, *overrides: str) -> Path:
    r = launch("-m", *overrides, f"hydra.sweep.dir={folder}", cwd=folder.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> tuple[Path, Path]:
    """(the grid stored, the grid in run folders)."""
    root = tmp_path_factory.mktemp("twins")
    return (_launch(root / "stored", *GRID, "hydra.launcher.store=true"),
            _launch(root / "folders", *GRID, "hydra.launcher.store=false"))


def _copy(sweep: Path, tmp_path: Path) -> Path:
    out = tmp_path / sweep.name
    shutil.copytree(sweep, out, symlinks=True)
    return out


def _head_of(sweep: Path, run: str) -> Path:
    sid = store.index(sweep).runs[run][0]
    return sweep / store.STORE / (sid + shard.HEAD)


# ---------------------------------------------------------------------------------------------
# the runs table

def test_a_stored_sweep_loads_as_its_folder_twin(twins):
    stored, folders = twins
    assert not any(p.is_dir() for p in stored.iterdir() if p.name != store.STORE)  # no run folder there
    a, b = load_runs(stored), load_runs(folders)
    assert len(a) == 6 and a["run"].tolist() == [str(i) for i in range(6)]
    assert list(a.columns) == list(b.columns)
    assert a.dtypes.astype(str).to_dict() == b.dtypes.astype(str).to_dict()
    assert a.attrs["config_keys"] == b.attrs["config_keys"] and a.attrs["skipped"] == b.attrs["skipped"] == []
    pd.testing.assert_frame_equal(a.drop(columns=PLACE), b.drop(columns=PLACE))
    assert a["path"].tolist() == [str(stored / r) for r in a["run"]] and set(a["sweep"]) == {str(stored)}
    assert not (stored / load_module.CACHE_NAME).exists()   # the heads are the table: no cache written there
    assert (folders / load_module.CACHE_NAME).exists()


def test_columns_are_read_from_the_heads_alone(twins, monkeypatch):
    stored, folders = twins
    store.index(stored, bodies=False)   # the index (cached by listing) is built before the reads are watched
    asked = []
    real = shard.read_head
    monkeypatch.setattr(shard, "read_head", lambda raw, columns=None: asked.append(columns) or real(raw, columns))
    want = ["data.p", "init", "test_acc", "status", "no.such.key"]
    a = load_runs(stored, columns=want)
    assert asked and all(set(c) <= {"_run", "data.p", "init", "test_acc", "status"} for c in asked)
    assert set(a.columns) == {"data.p", "init", "test_acc", "status", "path", "sweep", "run"}
    assert a.attrs["config_keys"] == ["data.p", "init"]
    b = load_runs(folders, columns=want)
    pd.testing.assert_frame_equal(a.drop(columns=["path", "sweep"]), b[a.columns].drop(columns=["path", "sweep"]))
    full = load_runs(stored)
    pd.testing.assert_frame_equal(a, full[a.columns])


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_refused_head_is_skipped_and_its_runs_are_no_rows(twins, tmp_path, damage):
    sweep = _copy(twins[0], tmp_path)
    head = _head_of(sweep, "0")
    lost = {r for r, (sid, _, _) in store.index(sweep).runs.items() if sid + shard.HEAD == head.name}
    raw = bytearray(head.read_bytes())
    if damage == "flipped":
        raw[64] ^= 0x01   # in the first column's data: the footer reads, the seal does not verify
    else:
        raw = raw[: len(raw) - 100]
    head.write_bytes(bytes(raw))
    df = load_runs(sweep)
    assert set(df["run"]) == {str(i) for i in range(6)} - lost and len(lost) == 3
    skipped = df.attrs["skipped"]
    # the shard, and its runs as the launch's record names them: not done (a relaunch trains them again)
    assert sorted((s["path"], s["status"]) for s in skipped) == sorted(
        [(str(head), "corrupt"), *((str(sweep / r), "unfinished") for r in lost)])
    why = next(s["reason"] for s in skipped if s["status"] == "corrupt")
    assert why.startswith({"flipped": "its seal does not verify: edited, copied from another name or another sweep, or another user's",
                           "truncated": "not a whole Parquet file"}[damage])
    assert {s["reason"] for s in skipped if s["status"] == "unfinished"} == {load_module.NOT_STORED}
    c = counts(add_success(df), skipped)   # the report counts them against their sweep, not against `store/`
    assert c[["sweep", "runs", "unfinished", "corrupt"]].values.tolist() == [[str(sweep), 3, 3, 1]]


# ---------------------------------------------------------------------------------------------
# histories and snapshots

def test_stored_histories_and_snapshots_equal_the_folders(twins):
    stored, folders = twins
    a, b = load_runs(stored), load_runs(folders)
    ha, hb = load_history(a, columns=["data.p", "seed"]), load_history(b, columns=["data.p", "seed"])
    assert len(ha) == 6 * 11 and ha["path"].nunique() == 6
    pd.testing.assert_frame_equal(ha.drop(columns="path"), hb.drop(columns="path"))
    assert ha["path"].tolist() == [str(stored / Path(p).name) for p in hb["path"]]
    one = load_history([str(stored / "4")])   # a run's path, as the paper figures pass it
    pd.testing.assert_frame_equal(one.drop(columns="path"), load_history([str(folders / "4")]).drop(columns="path"))
    sa, sb = load_snapshots(a), load_snapshots(b)
    assert len(sa) == len(sb) > 6 and sa["step"].tolist() == sb["step"].tolist()
    for key in ("V", "attention"):
        assert all(np.array_equal(x, y) for x, y in zip(sa[key], sb[key]))


def test_a_body_that_does_not_verify_holds_no_row_and_is_named(twins, tmp_path):
    sweep = _copy(twins[0], tmp_path)
    head = _head_of(sweep, "0")
    lost = {r for r, (sid, _, _) in store.index(sweep).runs.items() if sid + shard.HEAD == head.name}
    body = head.with_name(head.name[: -len(shard.HEAD)] + shard.BODY)
    raw = bytearray(body.read_bytes())
    raw[len(raw) // 2] ^= 0x01   # the same size: only its hash tells
    body.write_bytes(bytes(raw))
    df = load_runs(sweep)  # as the launcher and rw-status judge it: its runs are not done
    assert len(lost) == 3 and set(df["run"]) == {str(i) for i in range(6)} - lost
    skipped = {s["path"]: s for s in df.attrs["skipped"]}
    assert skipped[str(body)]["status"] == "corrupt"
    assert "it is not the body its head was sealed with" in skipped[str(body)]["reason"]
    assert {p: s["status"] for p, s in skipped.items() if p != str(body)} == \
        {str(sweep / r): "unfinished" for r in lost}  # the runs its record names, stored by no shard that verifies
    hist = load_history(df)
    assert {Path(p).name for p in hist["path"]} == {str(i) for i in range(6)} - lost


# ---------------------------------------------------------------------------------------------
# a sweep of run folders and stored runs

@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Two zero-init runs in folders (an earlier launch), then the whole grid stored: 2 folders, 4 stored."""
    folder = tmp_path_factory.mktemp("mixed") / "sweep"
    _launch(folder, "data.p=0,0.5", "init=zero", *SMALL, "wandb.mode=disabled", "wandb.group=twins",
            "hydra.launcher.store=false")
    return _launch(folder, *GRID, "hydra.launcher.store=true")


def test_a_sweep_of_folders_and_stored_runs_is_one_table(mixed, twins):
    df = load_runs(mixed)
    folders = {p.name for p in mixed.iterdir() if p.is_dir() and p.name != store.STORE}
    assert folders == {"0", "1"} and set(store.index(mixed).runs) == {"2", "3", "4", "5"}
    assert df["run"].tolist() == [str(i) for i in range(6)] and df.attrs["skipped"] == []
    twin = load_runs(twins[1])   # the same six configs, numbered otherwise
    key = ["data.p", "init"]
    other = [*PLACE, "run", "wandb.name"]   # and the run's name, made of its launch's overrides
    mine = df.drop(columns=other).sort_values(key).reset_index(drop=True)
    theirs = twin.drop(columns=other).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, theirs)
    hist = load_history(df)
    assert hist.groupby("path").size().to_dict() == {str(mixed / str(i)): 11 for i in range(6)}
    assert not (mixed / load_module.CACHE_NAME).exists()


def test_a_run_in_a_folder_and_in_the_store_is_counted_once(mixed, twins, tmp_path):
    sweep = _copy(mixed, tmp_path)
    stored = load_runs(sweep).set_index("run").loc["3"]
    twin = load_runs(twins[1])
    same = twin[(twin["data.p"] == stored["data.p"]) & (twin["init"] == stored["init"])].iloc[0]
    # the same run in a folder at the stored run's name (trained elsewhere): the folder is the run, as `judge` says
    shutil.copytree(same["path"], sweep / "3")
    df = load_runs(sweep)
    assert df["run"].tolist() == [str(i) for i in range(6)] and df.attrs["skipped"] == []
    row = df.set_index("run").loc["3"]
    assert (row["run_id"], row["wall_s"]) == (same["run_id"], same["wall_s"]) != (stored["run_id"], stored["wall_s"])
    assert row["path"] == str(sweep / "3")
    hist = load_history(df)
    assert hist.groupby("path").size().to_dict() == {str(sweep / str(i)): 11 for i in range(6)}


# ---------------------------------------------------------------------------------------------
# the report

def test_the_phase_diagram_reads_no_body(twins, monkeypatch):
    df = load_runs(twins[0])

    def refuse(*_):
        raise AssertionError("a table-level figure read a body")

    monkeypatch.setattr(store, "body_rows", refuse)
    fig = phase_diagram(add_success(df), "data.p", "init")
    plt.close(fig)
    assert fig.phase_table["n"].sum() == 6 and len(fig.phase_table) == 6


def test_the_report_of_a_stored_sweep_equals_its_folder_twin(twins, tmp_path):
    stored, folders = twins
    env = {**os.environ, "MPLBACKEND": "Agg"}
    for sweep in twins:
        r = python("-m", "analysis", str(sweep), "--out", str(tmp_path / sweep.name), env=env)
        assert r.returncode == 0, r.stderr
        assert "runs 6, done 6" in r.stdout
    pngs = {p.name for p in (tmp_path / "stored").glob("*.png")}
    assert {"phase_success.png", "phase_success_step.png", "curves_test_acc.png"} <= pngs
    assert pngs == {p.name for p in (tmp_path / "folders").glob("*.png")}
    a = pd.read_parquet(tmp_path / "stored" / "runs.parquet")
    b = pd.read_parquet(tmp_path / "folders" / "runs.parquet")
    pd.testing.assert_frame_equal(a.drop(columns=PLACE), b.drop(columns=PLACE))
    assert a["success_step"].notna().any()   # read from the stored bodies
    def run_cells(name):   # the first cell of each line of the report's per-run table
        page = (tmp_path / name / "index.html").read_text()
        return re.findall(r"<tr><td>(.*?)</td>", page.split("id='runs'")[1].split("</table>")[0])

    # a stored run has no folder to link to: its name, with the command that prints it as its folder would
    assert run_cells("stored") == [f"<span title='rw-show {stored} {i}'>{i}</span>" for i in range(6)]
    assert all(c.startswith("<a href=") for c in run_cells("folders"))
    assert not (stored / load_module.CACHE_NAME).exists()
