"""The trust corpus: one named test per hostile case of the issue, each asserting what really happens.

Every case starts from one real finished sweep (`data.p=0.5,1`, made once for the module), copies it, plants
one thing, and asks the judge, analysis (`load_runs`, or `python -m analysis` where the issue says so) and a
relaunch of the same command. Run folder 0 is p = 0.5, folder 1 is p = 1. Subprocess timeouts are hang guards
only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from analysis.load import load_runs
from rw_sweeps.core import contract

from . import _hostile as H
from .conftest import launch, python

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

S = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled"]
GRID = ["data.p=0.5,1"]
HANG_S = 120   # a hang guard: every command here takes seconds


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus") / "S"
    r = launch("-m", *GRID, *S, f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stderr
    assert [contract.judge(d / n).state for n in "01"] == ["done", "done"]
    return d


@pytest.fixture
def s(sweep, tmp_path) -> Path:
    """A fresh copy of the finished sweep, for this test to damage."""
    return H.copy_sweep(sweep, tmp_path / "S")


def relaunch(sweep: Path, *extra: str, grid=GRID, timeout: float = HANG_S) -> subprocess.CompletedProcess:
    r = launch("-m", *grid, *S, f"hydra.sweep.dir={sweep}", *extra, timeout=timeout)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r


def analysis_cli(sweep: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict[str, int]]:
    """`python -m analysis SWEEP --out OUT` and its counts line (runs, done, …, corrupt)."""
    r = python("-m", "analysis", sweep, "--out", out, timeout=HANG_S)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r, _counts(r.stdout)


def _counts(stdout: str) -> dict[str, int]:
    m = re.search(r"runs (\d+), done (\d+), failed (\d+), diverged (\d+), unfinished (\d+), corrupt (\d+)", stdout)
    assert m, stdout
    return dict(zip(("runs", "done", "failed", "diverged", "unfinished", "corrupt"), map(int, m.groups())))


def skipped_of(df) -> dict[str, dict]:
    return {Path(x["path"]).name: x for x in df.attrs["skipped"]}


def assert_corrupt_then_retrained(sweep: Path, run: str, why: str) -> None:
    """The judge says corrupt with `why` in its reason, analysis lists the folder corrupt with that reason and keeps
    the other run's row, and one relaunch retrains exactly that run with one `retraining` line saying the judge's
    reason; afterwards both runs are done."""
    v = contract.judge(sweep / run)
    assert v.state == "corrupt" and why in v.why, v.why
    df = load_runs(sweep, cache=False, progress=False)
    assert df["run"].tolist() == [o for o in "01" if o != run] and set(df["status"]) == {"done"}
    assert skipped_of(df)[run]["status"] == "corrupt" and why in skipped_of(df)[run]["reason"]
    r = relaunch(sweep)
    assert r.returncode == 0, r.stderr[-3000:]
    assert H.retraining_lines(r.stdout) == {str(sweep / run): v.why}
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 1 done, 1 skipped, 0 failed, 0 diverged"
    assert [contract.judge(sweep / n).state for n in "01"] == ["done", "done"]
    assert [json.loads(ln)["step"] for ln in (sweep / run / "history.jsonl").read_text().splitlines()] == list(range(6))


# ------------------------------------------------------------------------------ histories
def test_a_shortened_history_is_not_done_analysis_lists_it_corrupt_and_a_relaunch_retrains_it(s):
    h = s / "0" / "history.jsonl"
    h.write_text("".join(h.read_text().splitlines(keepends=True)[:3]))   # steps 0, 1, 2 of 5
    assert_corrupt_then_retrained(s, "0", "history.jsonl ends at step 2; summary.json says 5 steps")


def test_another_runs_history_copied_in_is_not_done_and_is_retrained(s):
    shutil.copyfile(s / "1" / "history.jsonl", s / "0" / "history.jsonl")
    assert_corrupt_then_retrained(s, "0", "history.jsonl's last row has")


@pytest.mark.parametrize("content,why", [(b"", "history.jsonl is empty"),
                                         (None, "history.jsonl line 1 is not valid JSON")],
                         ids=["empty", "NUL-filled"])
def test_an_empty_or_nul_filled_history_is_not_done_and_is_retrained(s, content, why):
    h = s / "1" / "history.jsonl"
    h.write_bytes(content if content is not None else b"\0" * h.stat().st_size)
    assert_corrupt_then_retrained(s, "1", why)


# ------------------------------------------------------------------------------ summaries
@pytest.mark.parametrize("bad", ["Infinity", "1e999", "NaN"])
def test_a_non_finite_test_acc_in_a_summary_is_not_done_and_is_retrained(s, bad):
    f = s / "0" / "summary.json"
    f.write_text(f.read_text().replace(f'"test_acc": {json.loads(f.read_text())["test_acc"]}', f'"test_acc": {bad}'))
    assert f'"test_acc": {bad}' in f.read_text()
    assert_corrupt_then_retrained(s, "0", "summary.json is not valid JSON")


@pytest.mark.parametrize("name,key", [("summary.json", "steps"), ("summary.json", "seed"), ("summary.json", "wall_s"),
                                      ("config.yaml", "seed"), ("config.yaml", "optim.steps"),
                                      ("config.yaml", "data.n_train")])
def test_a_30_digit_integer_in_a_summary_or_config_is_listed_corrupt_by_analysis(s, tmp_path, name, key):
    f = s / "1" / name
    text = f.read_text()
    f.write_text(H._set_json_field(text, key, H.HUGE_INT) if name == "summary.json"
                 else H.set_config_value(text, key, H.HUGE_INT))
    assert H.HUGE_INT in f.read_text()
    r, counts = analysis_cli(s, tmp_path / "report")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (counts["done"], counts["corrupt"]) == (1, 1), f"{name}: {key}={H.HUGE_INT}: {counts}"
    assert os.path.realpath(s / "1") in (tmp_path / "report" / "index.html").read_text()


def test_a_bare_summary_saying_done_is_not_done_and_a_relaunch_retrains_it(s):
    (s / "0" / "summary.json").write_text('{"status": "done"}')
    assert_corrupt_then_retrained(s, "0", "summary.json has no 'steps'")


# ------------------------------------------------------------------------------ a planted config naming a file
def _pi_target(kind: str, tmp_path: Path) -> str:
    if kind == "fifo":
        os.mkfifo(tmp_path / "pi.fifo")
        return str(tmp_path / "pi.fifo")
    return "/dev/zero"


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_planted_config_whose_pi_file_is_a_fifo_or_dev_zero_is_ignored_by_a_relaunch(s, tmp_path, target):
    pi = _pi_target(target, tmp_path)
    planted = s / "planted"
    planted.mkdir()
    (planted / "config.yaml").write_text(f"data:\n  name: markov_matrix\n  Pi_file: {pi}\n")
    r = relaunch(s)   # the hang guard: a reader opening the FIFO would block here
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == f"sweep {s}: 2 runs: 0 done, 2 skipped, 0 failed, 0 diverged"
    assert sorted(p.name for p in planted.iterdir()) == ["config.yaml"]
    df = H.within(60, load_runs, s, cache=False, progress=False)
    assert sorted(df["run"]) == ["0", "1"] and skipped_of(df)["planted"]["status"] == "unfinished"
    if target == "fifo":
        assert Path(pi).is_fifo()


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_planted_config_whose_pi_file_is_a_fifo_or_dev_zero_in_a_new_runs_folder_is_refused_in_one_line(
        s, tmp_path, target):
    pi = _pi_target(target, tmp_path)
    (s / "2").mkdir()
    (s / "2" / "config.yaml").write_text(f"data:\n  name: markov_matrix\n  Pi_file: {pi}\n")
    before = H.regular_files(s)
    r = relaunch(s, grid=["data.p=0.5,1,0.7"])   # p = 0.7 is job 2: its folder holds the planted config
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{s / '2'} holds a run of another config" in lines[0], r.stderr
    assert "markov_matrix" in lines[0] and len(lines[0]) < 600
    assert H.regular_files(s) == before   # nothing trained, nothing written


# ------------------------------------------------------------------------------ nesting and alias bombs
@pytest.mark.parametrize("name", ["summary.json", "history.jsonl"])
def test_deeply_nested_json_as_a_summary_or_a_history_line_crashes_neither_analysis_nor_a_relaunch(s, tmp_path, name):
    f = s / "0" / name
    if name == "summary.json":
        f.write_text(H.DEEP_JSON)
    else:
        rows = f.read_text().splitlines()
        f.write_text("\n".join([*rows[:2], H.DEEP_JSON, *rows[3:]]) + "\n")
    r, counts = analysis_cli(s, tmp_path / "report")
    assert r.returncode == 0 and (counts["done"], counts["corrupt"]) == (1, 1), (r.stderr[-3000:], counts)
    v = contract.judge(s / "0")
    assert v.state == "corrupt" and "JSON" in v.why and len(v.why) < 400
    r = relaunch(s)
    assert r.returncode == 0 and H.retraining_lines(r.stdout) == {str(s / "0"): v.why}
    assert contract.judge(s / "0").state == "done"


def test_a_yaml_alias_bomb_as_a_config_is_refused_by_analysis_in_seconds_and_small_memory(s, tmp_path):
    assert 700 < len(H.ALIAS_BOMB) < 1000 and H.ALIAS_BOMB.count("*lol") == 72   # 9 levels of 9
    (s / "1" / "config.yaml").write_text(H.ALIAS_BOMB)
    tracemalloc.start()
    try:
        df = H.within(30, load_runs, s, cache=False, progress=False)
        peak = tracemalloc.get_traced_memory()[1] / H.MiB
    finally:
        tracemalloc.stop()
    assert peak < 100, f"analysis allocated {peak:.0f} MB reading a {len(H.ALIAS_BOMB)}-byte config"
    assert df["run"].tolist() == ["0"] and skipped_of(df)["1"]["status"] == "corrupt"
    assert "anchor or alias" in skipped_of(df)["1"]["reason"]
    r, peak_mb = H.run_measured("analysis", str(s), "--out", str(tmp_path / "report"), timeout=HANG_S)
    assert r.returncode == 0 and (_counts(r.stdout)["done"], _counts(r.stdout)["corrupt"]) == (1, 1), r.stderr
    assert peak_mb < 1024, f"python -m analysis peaked at {peak_mb:.0f} MB"   # the bomb expanded is gigabytes
    r = relaunch(s)   # a folder whose config is no run's is trained over
    assert r.returncode == 0, r.stderr[-3000:]
    assert contract.judge(s / "1").state == "done" and "&lol" not in (s / "1" / "config.yaml").read_text()


# ------------------------------------------------------------------------------ huge files
@pytest.mark.parametrize("name,why", [("summary.json", "summary.json is 1,073,741,824 bytes; its cap is 1,048,576"),
                                      ("history.jsonl", "history.jsonl: line 7 is longer than its cap")])
def test_a_1_gib_sparse_summary_or_history_keeps_analysis_and_a_relaunch_bounded(s, tmp_path, name, why):
    os.truncate(s / "0" / name, 1 << 30)   # sparse: the old content, then a gigabyte of NULs
    r, peak = H.run_measured("analysis", str(s), "--out", str(tmp_path / "report"), timeout=300)
    assert r.returncode == 0 and (_counts(r.stdout)["done"], _counts(r.stdout)["corrupt"]) == (1, 1), r.stderr
    assert peak < 700, f"python -m analysis peaked at {peak:.0f} MB on a 1 GiB {name}"
    r, peak = H.run_measured("launch.py", "-m", *GRID, *S, f"hydra.sweep.dir={s}", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    said = H.retraining_lines(r.stdout)
    assert list(said) == [str(s / "0")] and why in said[str(s / "0")]
    assert peak < 700, f"the relaunch peaked at {peak:.0f} MB on a 1 GiB {name}"
    assert contract.judge(s / "0").state == "done" and (s / "0" / name).stat().st_size < 1 << 20


# ------------------------------------------------------------------------------ the analysis cache
@pytest.mark.parametrize("seal", ["left-as-it-was", "removed"])
def test_a_planted_runs_parquet_with_every_test_acc_at_1_is_not_believed(s, seal):
    import pyarrow as pa
    import pyarrow.parquet as pq

    truth = {n: json.loads((s / n / "summary.json").read_text())["test_acc"] for n in "01"}
    assert all(v < 1 for v in truth.values())
    first = load_runs(s, progress=False)   # writes the sealed cache
    assert dict(zip(first["run"], first["test_acc"])) == truth and (s / "runs.parquet").is_file()
    table = pq.read_table(s / "runs.parquet")
    i = table.column_names.index("test_acc")
    pq.write_table(table.set_column(i, "test_acc", pa.array([1.0] * len(table))), s / "runs.parquet")
    assert pq.read_table(s / "runs.parquet").column("test_acc").to_pylist() == [1.0, 1.0]
    if seal == "removed":
        (s / ".runs.parquet.seal").unlink()
    df = load_runs(s, progress=False)
    assert dict(zip(df["run"], df["test_acc"])) == truth
    assert sorted(pq.read_table(s / "runs.parquet").column("test_acc").to_pylist()) == sorted(truth.values())


# ------------------------------------------------------------------------------ links at wandb folders
def test_a_runs_wandb_folder_linked_outside_is_never_written_through(s, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious\n")
    (s / "0" / "summary.json").unlink()             # so that run 0 trains again, with wandb on
    shutil.rmtree(s / "0" / "wandb", ignore_errors=True)
    (s / "0" / "wandb").symlink_to(outside, target_is_directory=True)
    r = launch("-m", *GRID, *S[:-1], "wandb.mode=offline", f"hydra.sweep.dir={s}", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "precious\n"
    assert contract.judge(s / "0").state == "done" and contract.judge(s / "1").state == "done"
    assert (s / "0" / "wandb").is_symlink()
    warnings = [ln for ln in r.stderr.splitlines() if "wandb" in ln]
    assert all(ln.startswith("warning: wandb logging failed: ") and "symbolic link" in ln for ln in warnings), warnings
    assert len(warnings) <= 1, f"one warning line, not {len(warnings)}: {warnings}"


# ------------------------------------------------------------------------------ a user's Pi_file
def _pi_file(kind: str, tmp_path: Path) -> tuple[str, list[str]]:
    """A Pi_file a user might give, and strings of its content that must not be echoed."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pi.fifo")
        return str(tmp_path / "pi.fifo"), []
    if kind == "40MB-text":
        f = tmp_path / "pi.txt"
        line = b"0.25 0.75\n"
        f.write_bytes(line * (40_000_000 // len(line)))
        return str(f), ["0.25", "0.75"]
    if kind == "/etc/shadow":
        if not os.path.exists("/etc/shadow"):
            pytest.skip("no /etc/shadow here")
        return "/etc/shadow", ["root:", "$6$", "$y$"]
    return kind, []


@pytest.mark.parametrize("kind", ["fifo", "40MB-text", "/etc/shadow", "/dev/zero"])
def test_a_users_pi_file_that_is_no_matrix_file_is_one_line_naming_it_and_nothing_of_its_content(tmp_path, kind):
    path, secrets = _pi_file(kind, tmp_path)
    r = launch("data=markov_matrix", f"data.Pi_file={path}", *S, f"hydra.run.dir={tmp_path / 'run'}",
               timeout=HANG_S)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    head = lines[0][:300] if lines else ""
    assert len(lines) == 1 and "Traceback" not in r.stderr, head
    assert lines[0].startswith(f"error: invalid config: data.Pi_file={path!r}: "), head
    assert len(lines[0]) < 400, f"a {len(lines[0]):,}-character line: {head}…"
    assert not any(x in lines[0] for x in secrets), head
    assert not (tmp_path / "run" / "summary.json").exists()
