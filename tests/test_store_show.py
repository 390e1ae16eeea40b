"""`rw-show SWEEP RUN`: a stored run (no folder: the sweep's store holds it) printed and written as its run folder
would hold it, byte for byte against the same grid launched with run folders; its refusals one line each."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rw_sweeps.core import contract, results, store

from .conftest import launch, python

TINY = ["optim.steps=2", "data.n_train=64", "data.n_test=64", "model.M=200"]
# two runs a job: the store holds them in two shards or more (one a flush)
GRID = ["-m", "data.p=0.3,0.7", "init=zero,gaussian", *TINY, "wandb.mode=disabled", "wandb.group=g",
        "hydra.launcher.max_runs_per_job=2"]
FILES = {"config.yaml": "config.yaml", "summary.json": "summary.json", "history.jsonl": "history.jsonl",
         "snapshots.jsonl": "snapshots.jsonl", "overrides.yaml": ".hydra/overrides.yaml"}
OWN = ('"wall_s":', '"run_id":')  # a summary's lines a run of the same config in another sweep has its own of


def _show(*args) -> "subprocess.CompletedProcess":  # noqa: F821 - conftest.python's
    return python("-m", "rw_sweeps.sweeps.show", *map(str, args))


def _same_but_own(stored: str, folder: str) -> None:
    """Two summary.json texts equal line for line, but for the values of `OWN`."""
    a, b = stored.splitlines(keepends=True), folder.splitlines(keepends=True)
    assert len(a) == len(b) and stored.endswith("\n")
    differ = [(x, y) for x, y in zip(a, b) if x != y]
    assert all(x.strip().startswith(OWN) and x.split(":")[0] == y.split(":")[0] for x, y in differ), differ


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The same grid twice: its runs stored (`hydra.launcher.store=true`), and as run folders (`=false`)."""
    root = tmp_path_factory.mktemp("show")
    out = {}
    for kind, flag in (("stored", "true"), ("folders", "false")):
        sweep = root / kind / "S"
        r = launch(*GRID, f"hydra.launcher.store={flag}", f"hydra.sweep.dir={sweep}")
        assert r.returncode == 0, r.stderr
        out[kind] = sweep
    return out


@pytest.mark.e2e  # it launches
def test_a_stored_run_prints_each_file_as_its_run_folder_holds_it(sweeps, capsysbinary):
    from rw_sweeps.sweeps import show

    stored, folders = sweeps["stored"], sweeps["folders"]
    names = sorted(store.index(stored).runs)
    assert names == ["0", "1", "2", "3"] and not any((stored / n).exists() for n in names)  # no folder per run
    for name in names:
        for given, path in FILES.items():
            assert show.main([str(stored), name, "--file", given]) == 0
            got, want = capsysbinary.readouterr().out, (folders / name / path).read_bytes()
            if given == "summary.json":
                _same_but_own(got.decode(), want.decode())
                s = json.loads(got)
                assert s["run_id"] == results.run_id(stored / name) != json.loads(want)["run_id"]
                assert s["status"] == "done" and s["steps"] == 2
            else:
                assert got == want, (name, given)
    r = _show(stored, "1", "--file", "overrides.yaml")  # as a user runs it
    assert r.returncode == 0 and r.stdout == (folders / "1" / ".hydra" / "overrides.yaml").read_text()
    assert r.stdout.startswith("- data.p=0.3\n- init=gaussian\n")  # the job's own, as Hydra recorded them


@pytest.mark.e2e  # it launches
def test_a_stored_run_written_to_a_folder_is_that_run_folder(sweeps, tmp_path):
    stored, folders = sweeps["stored"], sweeps["folders"]
    out = tmp_path / "copy"
    r = _show(stored, "2", "--to", out)
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == \
        sorted([*FILES.values(), ".hydra/hydra.yaml"])
    job = (out / ".hydra/hydra.yaml").read_text()  # its job's hydra.yaml (kept per job, in its head)
    assert job == store.index(stored).heads[store.index(stored).runs["2"][0]][1]["hydra"] and "sweep:" in job
    for given, path in FILES.items():
        if given == "summary.json":
            _same_but_own((out / path).read_text(), (folders / "2" / path).read_text())
        else:
            assert (out / path).read_bytes() == (folders / "2" / path).read_bytes(), given
    verdict = contract.judge(out)  # a run folder the contract finds done, of the stored run's own record
    assert verdict.state == "done" and verdict.summary == store.index(stored).record("2")[1]
    again = _show(stored, "2", "--to", out)  # never over a folder that holds anything
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.splitlines() == [f"python -m rw_sweeps.sweeps.show: --to {out}: it exists and is not "
                                         "empty; --to writes a new folder"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _show(stored, "0", "--to", empty).returncode == 0 and (empty / "summary.json").exists()


@pytest.mark.e2e  # it launches
def test_the_short_view_gives_config_summary_the_last_history_row_and_overrides(sweeps):
    stored, folders = sweeps["stored"], sweeps["folders"]
    for sweep, place in ((stored, "stored in store/"), (folders, "a run folder")):
        r = _show(sweep, "3")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith(f"run 3 of {sweep}: done; {place}")
        history = (folders / "3" / "history.jsonl").read_text().splitlines()
        at = lines.index("== history.jsonl: 3 rows, the last:")
        assert lines[at + 1] == history[-1] and len(history) == 3
        config = (folders / "3" / "config.yaml").read_text().splitlines()
        assert lines[lines.index("== config.yaml") + 1:][:len(config)] == config
        assert lines[lines.index("== .hydra/overrides.yaml") + 1:] == \
            (folders / "3" / ".hydra" / "overrides.yaml").read_text().splitlines()
        summary = lines[lines.index("== summary.json") + 1:at]
        assert json.loads("\n".join(summary))["test_acc"] == json.loads((folders / "3" / "summary.json").read_text())["test_acc"]
    folder = _show(folders, "0", "--file", "config.yaml")  # a run folder's file: its own bytes
    assert folder.stdout == (folders / "0" / "config.yaml").read_text()


@pytest.mark.e2e  # it launches
def test_what_cannot_be_shown_is_one_line_with_exit_status_two(sweeps, tmp_path):
    stored = sweeps["stored"]
    cases = {(tmp_path / "nowhere", "0"): f"no such sweep: {tmp_path / 'nowhere'}",
             (stored, "7"): f"no run 7 in {stored}: it has 4 runs (0, 1, 2, 3)",
             (stored, "../S"): "'../S' is no run's name (its folder relative to the sweep folder, e.g. 17 or 0/run)"}
    for (sweep, name), line in cases.items():
        r = _show(sweep, name)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        assert r.stderr.splitlines() == [f"python -m rw_sweeps.sweeps.show: {line}"]
    many = tmp_path / "many"
    for i in range(7):
        (many / str(i)).mkdir(parents=True)
    r = _show(many, "9")
    assert r.stderr.splitlines() == [f"python -m rw_sweeps.sweeps.show: no run 9 in {many}: it has 7 runs (0, 1, 2, 3, 4, …)"]


@pytest.mark.e2e  # it launches
def test_a_shard_that_does_not_verify_is_refused_naming_its_file(sweeps, tmp_path):
    import shutil

    sweep = tmp_path / "S"
    shutil.copytree(sweeps["stored"], sweep)
    idx = store.index(sweep)
    edited, body_of = sorted(idx.heads)[:2]
    gone = sorted(n for n, (sid, _, _) in idx.runs.items() if sid == edited)
    kept = sorted(n for n, (sid, _, _) in idx.runs.items() if sid == body_of)

    def flip(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 3] ^= 0xFF  # the same size: only its seal (a head) or its hash (a body) tells
        path.write_bytes(bytes(raw))

    flip(sweep / "store" / f"{edited}.runs.parquet")
    flip(sweep / "store" / f"{body_of}.body.parquet")
    # a head that does not verify holds no run; nor does a head whose body does not hash to what it names
    refused = sorted([f"{edited}.runs.parquet", f"{body_of}.body.parquet"])
    why = {f"{edited}.runs.parquet": "its seal does not verify: edited, copied from another name or another sweep, or another user's",
           f"{body_of}.body.parquet": "it is not the body its head was sealed with (edited, truncated or replaced)"}
    left = sorted((n for n in idx.runs if n not in gone + kept), key=int)
    listed = f" ({', '.join(left)})" if left else ""
    for name in (gone[0], kept[0]):
        r = _show(sweep, name, "--file", "history.jsonl")
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.splitlines() == [
            f"python -m rw_sweeps.sweeps.show: no run {name} in {sweep}: it has {len(left)} runs{listed}; "
            f"its store refused 2 files that may hold it: store/{refused[0]}: {why[refused[0]]} (and 1 more)"]
    assert os.listdir(sweep / "store") == os.listdir(sweeps["stored"] / "store")  # nothing written by a reader
