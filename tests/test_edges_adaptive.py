"""The adaptive sweeper at the edges of a shared folder, each case reproduced as a named test:

- a planted `adaptive.json` in a grid's folder replaced the grid's phase diagrams (the record was not sealed);
- a planted file named with 255 digits made the next run number max + 1, a 256-digit folder name, and every
  relaunch ended in `OSError: File name too long` (run numbers now come from one function that fills gaps);
- a round stopped with wandb on (its runs' folders hold `wandb/` and a log beside the checkpoint) was
  trained again from step 0 in new folders, the stopped ones left unfinished for ever;
- a full disk ended the adaptive sweep in a traceback from `write_record`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from rw_sweeps.core import contract, layout

from .conftest import ROOT, launch, python, start_launch, steps_lasting, wait_for_work, wait_until

TINY = ["data.n_train=64", "data.n_test=64", "model.M=200"]
LR_AXIS = "optim.lr=tag(log,interval(0.01,0.3))"
ADAPTIVE = ["hydra/sweeper=adaptive", *TINY, "wandb.mode=disabled"]


def _record(sweep: Path) -> dict:
    return json.loads((sweep / "adaptive.json").read_text())


def _folders(sweep: Path) -> list[str]:
    """The sweep's run folders by name (`3`, or `3/run` under a nested subdir), in job order: folders only (a
    planted file or link at a run's place is named by `layout`, and is no folder the sweep made)."""
    return [n for n in layout.run_folders(sweep) if (sweep / n).is_dir() and not (sweep / n).is_symlink()]


def _states(sweep: Path) -> dict[str, str]:
    """Every run folder's state, by the contract's one judgement."""
    return {d: contract.judge(sweep / d).state for d in _folders(sweep)}


# ------------------------------------------------------------------------------------------ an interrupted round resumes in place
def _stop_round_two(p: subprocess.Popen, runs: list[Path], sig: str) -> None:
    """Let round 1 finish and round 2 train, then stop the launch: SIGTERM checkpoints the round's runs; SIGKILL
    comes once each of them has written a checkpoint (`checkpoint_every`), which it then resumes from."""
    while not (line := p.stdout.readline()).startswith("round 1:"):
        assert line, p.stderr.read()
    while "training" not in (line := p.stdout.readline()):
        assert line, p.stderr.read()
    if sig == "SIGTERM":
        wait_for_work(p.pid, 0.5)
    else:
        wait_until(lambda: all((run / "checkpoint.pt").is_file() for run in runs), 300, "round 2's checkpoints")
    p.send_signal(getattr(signal, sig))
    p.communicate(timeout=120)


NESTED = "hydra.sweep.subdir=${hydra.job.num}/run"


@pytest.mark.e2e
@pytest.mark.parametrize("sig, subdir", [("SIGTERM", ""), ("SIGKILL", ""), ("SIGTERM", "/run")])
def test_a_round_stopped_with_wandb_on_resumes_in_its_own_folders(sig, subdir, tmp_path):
    """wandb offline (the default mode): a stopped run's folder holds its `wandb/` (and Hydra's log) beside
    `checkpoint.pt`. The relaunch judged "interrupted" only a folder whose sole entry was the checkpoint, so it
    trained round 2 again from step 0 in folders 6–8 and left 3–5 unfinished. Now the contract's judgement
    (unfinished, with a checkpoint that is a regular file) resumes each in place, whatever else it holds, and
    wherever the subdir puts it (`3/run`)."""
    steps = steps_lasting(3.0)
    every = [f"checkpoint_every={max(10, steps // 10)}"] if sig == "SIGKILL" else []
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/sweeper=adaptive", *TINY, "wandb.mode=offline", f"optim.steps={steps}", LR_AXIS,
            "hydra.sweeper.n_points=6", "hydra.sweeper.batch=3", *every, f"hydra.sweep.dir={sweep}",
            *([NESTED] if subdir else [])]
    env = {"WANDB_MODE": "offline"}
    names = [f"{n}{subdir}" for n in range(6)]
    p = start_launch(*args, env=env)
    _stop_round_two(p, [sweep / n for n in names[3:]], sig)
    stopped = [d for d, state in _states(sweep).items() if state == "unfinished"]
    assert stopped == names[3:], _states(sweep)
    assert all((sweep / d / "checkpoint.pt").is_file() for d in stopped)
    # the case of the issue: more than the checkpoint in the folder (wandb's files, the job's log)
    assert all("wandb" in os.listdir(sweep / d) for d in stopped), {d: os.listdir(sweep / d) for d in stopped}

    resumed = launch(*args, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "6 runs (3 trained, 3 found done)" in resumed.stdout, resumed.stdout
    assert all(f"resuming {sweep / d} from its checkpoint" in resumed.stdout for d in stopped), resumed.stdout
    assert _folders(sweep) == names  # no run trained again in a new folder
    assert set(_states(sweep).values()) == {"done"}  # no folder stays unfinished
    assert all(json.loads((sweep / d / "summary.json").read_text())["steps"] == steps for d in names)
    # one offline wandb run a training run: `sync` uploads 6, not 6 + 3 partial ones
    assert len([r for d in names for r in (sweep / d / "wandb").glob("offline-run-*")]) == 6


def test_the_judgement_of_an_interrupted_folder_is_the_contracts(tmp_path):
    """What `_interrupted` accepts: unfinished (no summary) with a regular checkpoint, whatever else is there;
    not a folder without a checkpoint, one with a folder or a link at the checkpoint's name, nor a finished one."""
    from hydra_plugins.rw_sweeps_plugins.adaptive import _interrupted

    def folder(name: str, *files: str) -> str:
        d = tmp_path / name
        d.mkdir()
        for f in files:
            (d / f).parent.mkdir(parents=True, exist_ok=True)
            (d / f).write_bytes(b"x")
        return str(d)

    assert _interrupted(folder("alone", "checkpoint.pt"))
    assert _interrupted(folder("wandb", "checkpoint.pt", "wandb/offline-run-1/run.wandb", "rw.log",
                               ".hydra/config.yaml"))
    assert not _interrupted(folder("none", "wandb/offline-run-1/run.wandb", "rw.log"))
    assert not _interrupted(folder("summary", "checkpoint.pt", "summary.json"))  # corrupt, not unfinished
    d = folder("a_folder")
    (Path(d) / "checkpoint.pt").mkdir()
    assert not _interrupted(d)
    d = folder("a_link", "elsewhere.pt")
    (Path(d) / "checkpoint.pt").symlink_to(Path(d) / "elsewhere.pt")
    assert not _interrupted(d)


# ------------------------------------------------------------------------------------------ run numbers fill gaps
def test_free_numbers_fill_gaps_and_ignore_absurd_names(tmp_path):
    """One function numbers every sweeper's new runs: the lowest numbers no entry of the folder has (a run
    folder, a file, a link: any name that is a job number), so a 255-digit name cannot push them up."""
    from rw_sweeps.sweeps.placement import free_numbers

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for name in ("0", "2", "007", "9" * 255, "notes", "multirun.yaml"):
        (sweep / name).write_text("planted\n")
    (sweep / "3").mkdir()
    (sweep / "4").symlink_to(tmp_path)
    assert free_numbers(sweep, 4) == [1, 5, 6, 8]
    assert free_numbers(sweep, 4, taken={5, None}) == [1, 6, 8, 9]  # numbers this launch is about to use
    assert free_numbers(sweep, 2, consecutive=True) == [5, 6]  # a block, for Hydra's own launchers
    assert free_numbers(sweep, 3, consecutive=True) == [8, 9, 10]
    assert free_numbers(sweep, 0) == [] and free_numbers(tmp_path / "none", 2) == [0, 1]


@pytest.mark.e2e
def test_a_255_digit_name_in_an_adaptive_sweep_does_not_push_its_numbers_up(tmp_path):
    """A file named with 255 digits planted in an adaptive sweep's folder: the next run's folder was 256 digits
    long and every relaunch ended in `OSError: File name too long` with a traceback. New runs take the lowest
    free numbers (a planted file `3` is stepped over), relaunches too; the planted files are left alone."""
    sweep = tmp_path / "sweep"
    args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.batch=2", f"hydra.sweep.dir={sweep}"]
    r = launch(*args, "hydra.sweeper.n_points=2")
    assert r.returncode == 0, r.stderr
    big = "9" * 255
    (sweep / big).write_text("planted\n")
    (sweep / "3").write_text("planted\n")
    grown = launch(*args, "hydra.sweeper.n_points=4")
    assert grown.returncode == 0, grown.stderr
    assert "Traceback" not in grown.stderr
    assert "4 points in 2 round(s), 4 runs (2 trained, 2 found done)" in grown.stdout, grown.stdout
    assert _folders(sweep) == ["0", "1", "2", "4"] and set(_states(sweep).values()) == {"done"}
    assert sorted(r for p in _record(sweep)["points"] for r in p["runs"]) == ["0", "1", "2", "4"]
    again = launch(*args, "hydra.sweeper.n_points=4")
    assert again.returncode == 0 and "4 runs (0 trained, 4 found done)" in again.stdout, again.stdout + again.stderr
    assert (sweep / big).read_text() == (sweep / "3").read_text() == "planted\n"


# ------------------------------------------------------------------------------------------ a sealed record
def _sealed_record(runs: list[str], value: float = 1.0) -> dict:
    """A record as the sweeper writes it (one point at lr = 0.1), sealed with the key in use."""
    from rw_sweeps.core import seal

    rec = {"version": 2, "axes": [{"key": "optim.lr", "lo": 0.01, "hi": 0.3, "log": True}], "crossed": [],
           "metric": "success", "level": 0.5, "tol": 0.02,
           "points": [{"at": [0.1], "panel": [], "value": value, "runs": runs}]}
    return seal.seal_record("adaptive.json", rec)


def test_a_record_is_trusted_only_sealed_by_you_unedited_and_naming_runs_inside(tmp_path, monkeypatch):
    """The analysis draws a sweep by its record only if this user's sweeper sealed it, unedited since, and every
    run it names is a folder inside the sweep (sealed or not, `../x`, `/x` or a link would lead out of it)."""
    from analysis.adaptive import read_record
    from rw_sweeps.core.readers import Broken

    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "mine" / "seal.key"))
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)

    def put(rec: dict) -> None:
        (sweep / "adaptive.json").write_text(json.dumps(rec, indent=1) + "\n")

    def why() -> str:
        with pytest.raises(Broken) as e:
            read_record(sweep)
        return e.value.why

    put(_sealed_record(["0"]))
    assert read_record(sweep)["points"][0]["runs"] == ["0"]  # the sweeper's own: trusted
    unsealed = {k: v for k, v in _sealed_record(["0"]).items() if k != "seal"}
    put(unsealed)
    assert why() == ("adaptive.json is not sealed by you (planted, edited, another user's, or of a version before "
                     "seals: the sweep's command run again, which trains nothing, seals it): ignored")
    edited = _sealed_record(["0"])
    edited["points"][0]["at"] = [0.2]
    put(edited)
    assert "not sealed by you" in why()
    put({**_sealed_record(["0"]), "seal": "0" * 64})
    assert "not sealed by you" in why()
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "theirs" / "seal.key"))
    put(_sealed_record(["0"]))  # another user's sweeper (another key)
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "mine" / "seal.key"))
    assert "not sealed by you" in why()
    (tmp_path / "elsewhere").mkdir()
    (sweep / "1").symlink_to(tmp_path / "elsewhere")
    for name in ("../elsewhere", str(tmp_path / "elsewhere"), "1", "0/../../elsewhere", ""):
        put(_sealed_record(["0", name]))
        assert why() == f"adaptive.json names the run {name[:80]!r}, which is not a folder inside the sweep"


@pytest.mark.e2e
def test_planted_adaptive_json_is_ignored(tmp_path):
    """A planted `adaptive.json` (one point, naming run 0) in a grid's folder: the report drew an "adaptive"
    diagram of that one run instead of the grid's phase diagrams, and said nothing. It is ignored, in one line,
    and the grid's diagrams are drawn as without it."""
    grid = tmp_path / "grid"
    r = launch("-m", *TINY, "wandb.mode=disabled", "optim.steps=5", "optim.lr=0.01,0.1,0.3", f"hydra.sweep.dir={grid}")
    assert r.returncode == 0, r.stderr
    clean = python("-m", "analysis", str(grid), "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr
    rec = {k: v for k, v in _sealed_record(["0"]).items() if k != "seal"}  # what a stranger can write
    (grid / "adaptive.json").write_text(json.dumps(rec))
    planted = python("-m", "analysis", str(grid), "--out", str(tmp_path / "planted"))
    assert planted.returncode == 0, planted.stderr
    line = (f"note: {grid}: adaptive.json is not sealed by you (planted, edited, another user's, or of a version "
            "before seals: the sweep's command run again, which trains nothing, seals it): ignored; drawn as a grid")
    assert planted.stderr.splitlines().count(line) == 1, planted.stderr
    pngs = lambda d: sorted(p.name for p in d.glob("*.png"))  # noqa: E731
    assert pngs(tmp_path / "planted") == pngs(tmp_path / "clean")
    assert "phase_success.png" in pngs(tmp_path / "planted") and not list((tmp_path / "planted").glob("adaptive_*"))


# ------------------------------------------------------------------------------------------ a full disk
FULL_DISK = """
import errno, runpy, sys
import rw_sweeps.sweeps.adaptive as adaptive

written = adaptive.atomic_write

def full(path, text, *a, **k):  # the disk is full when the record is written (after round 1's runs)
    if str(path).endswith("adaptive.json"):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return written(path, text, *a, **k)

adaptive.atomic_write = full
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.e2e
def test_a_full_disk_when_the_record_is_written_is_one_line_and_exit_1(tmp_path):
    """The record's write raises ENOSPC (as on a full disk): the sweep ended in a traceback from `write_record`.
    It is one line naming the file, the exit status of a sweep with failed runs (1), and nothing finished is
    lost: the same command then writes the record from the runs, training nothing."""
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    sweep = tmp_path / "sweep"
    args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=4", "hydra.sweeper.batch=2",
            f"hydra.sweep.dir={sweep}", "wandb.analysis=false"]
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    r = python(script, ROOT / "launch.py", *args, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: {sweep / 'adaptive.json'}: not written (No space left on device); every finished run is kept in "
        "its folder: free space (or make the folder writable) and run the same command again to go on"], r.stderr
    assert "round 1: 2 points, 2 runs" in r.stdout and "round 2" not in r.stdout  # it stopped there
    assert f"sweep {sweep}: 2 runs: 2 done" in r.stdout, r.stdout
    assert not (sweep / "adaptive.json").exists() and _states(sweep) == {"0": "done", "1": "done"}
    again = launch(*args)
    assert again.returncode == 0, again.stderr
    assert "4 points in 2 round(s), 4 runs (2 trained, 2 found done)" in again.stdout, again.stdout
    assert len(_record(sweep)["points"]) == 4 and set(_states(sweep).values()) == {"done"}


@pytest.mark.e2e
def test_an_adaptive_sweep_on_a_full_disk_ends_in_one_line_per_fault_and_no_traceback(tmp_path):
    """A real full disk (a 400 KiB tmpfs): runs that do not fit fail with one line each, the record's write is
    one line, no traceback, exit 1; every run that is done is complete, and the relaunch on a disk with room
    finishes the sweep."""
    if os.geteuid() != 0:
        pytest.skip("a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        sweep = disk / "S"
        args = ["-m", *ADAPTIVE, "optim.steps=5", LR_AXIS, "hydra.sweeper.n_points=16", "hydra.sweeper.batch=4",
                f"hydra.sweep.dir={sweep}"]
        r = launch(*args)  # ~50 KiB a run: the disk fills in round 2 or 3
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and "Logging error" not in r.stderr, r.stderr[-3000:]
        assert r.stderr.count(f"error: {sweep / 'adaptive.json'}: not written (No space left on device)") == 1, r.stderr
        assert all(ln.startswith(("failed ", "error: ")) for ln in r.stderr.splitlines()), r.stderr[-3000:]
        done = [d for d, state in _states(sweep).items() if state == "done"]
        assert 0 < len(done) < 16, r.stdout[-2000:]  # complete, by the contract's judgement
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = launch(*args)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"16 runs ({16 - len(done)} trained, {len(done)} found done)" in again.stdout, again.stdout
        assert set(_states(sweep).values()) == {"done"} and len(_record(sweep)["points"]) == 16
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
