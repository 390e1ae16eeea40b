"""A full disk under a grid with wandb (README, "Faults"): each failed run is one line and the sweep's exit
code; wandb's logging errors are gathered into one line; nothing finished is lost and the relaunch is exact.

The disk is real: writes to `/dev/full` fail with ENOSPC as a full disk's do (the unit tests), and the
launches run on a small tmpfs mounted for the test (root only; CI runs as root).
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from pathlib import Path

import pytest

from rw_sweeps.core import contract, results, wandb_io
from rw_sweeps.sweeps import tracking

from .conftest import launch, python, summaries, small_tmpfs
from .wandb_files import read_run

FULL = "/dev/full"  # every write fails with ENOSPC: "No space left on device"


def _failing_handler(log_file: Path | str) -> logging.FileHandler:
    """A FileHandler named `log_file` whose stream is /dev/full: its writes fail as on a full disk."""
    handler = logging.FileHandler(FULL, delay=True)
    handler.baseFilename = str(log_file)
    handler.stream = open(FULL, "w")  # noqa: SIM115 - the handler owns it, closed in `_detach`
    return handler


def _detach(logger: logging.Logger, handler: logging.Handler) -> None:
    logger.removeHandler(handler)
    with contextlib.suppress(OSError):  # its close flushes into the full device
        handler.close()


@pytest.fixture
def full_disk_log():
    """Attach to wandb's logger (as wandb.init does, after the project imported wandb) handlers that write
    to a full device; detached afterwards, nothing left to say."""
    wandb_io.wandb()
    logger = logging.getLogger(wandb_io.WANDB_LOGGER)
    attached = []

    def attach(log_file: Path | str = FULL) -> logging.Handler:
        handler = _failing_handler(log_file)
        logger.addHandler(handler)
        attached.append(handler)
        return handler

    yield attach
    for handler in attached:
        _detach(logger, handler)
    wandb_io.said()


def test_failed_writes_of_wandbs_log_are_one_line_not_a_traceback_each(full_disk_log, capfd):
    full_disk_log()
    for i in range(5):  # wandb's modules log under its logger, which does not propagate
        logging.getLogger("wandb.sdk.wandb_init").warning("message %d", i)
    err = capfd.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
    assert wandb_io.said() == ("warning: wandb logging failed: 5 writes of wandb's own logs failed "
                               "(No space left on device)")
    assert wandb_io.said() is None  # said once


def test_the_projects_own_log_errors_are_not_hidden(full_disk_log, capfd):
    """Only wandb's logger is gathered: a handler of another logger fails as logging says it does."""
    full_disk_log()
    other = logging.getLogger("rw_sweeps.test_edges_disk")
    other.propagate = False
    handler = _failing_handler(FULL)
    other.addHandler(handler)
    try:
        other.warning("the project's own line")
    finally:
        _detach(other, handler)
    assert "--- Logging error ---" in capfd.readouterr().err
    assert wandb_io.said() is None


def test_the_line_names_the_runs_whose_offline_runs_may_be_incomplete_and_the_command(full_disk_log, tmp_path):
    sweep = tmp_path / "S"
    for run in ("0", "1"):
        full_disk_log(sweep / run / "wandb" / "offline-run-20261207_000000-abc" / "logs" / "debug.log")
    logging.getLogger("wandb.sdk").warning("x")  # both handlers fail: one write each
    assert wandb_io.failed_in(sweep / "0") and wandb_io.failed_in(sweep / "1") and not wandb_io.failed_in(sweep / "2")
    assert wandb_io.said() == (
        "warning: wandb logging failed: 2 writes of wandb's own logs failed (No space left on device); its offline "
        f"runs in {os.path.realpath(sweep)} may be incomplete: once there is space, python -m "
        f"rw_sweeps.sweeps.wandb_export {os.path.realpath(sweep)} logs the finished runs wandb lacks")
    assert not wandb_io.failed_in(sweep / "0")  # said: a later run starts clean


@pytest.mark.parametrize("owner", ["wandb_jobs/0123456789abcdef", "wandb_analysis"])
def test_a_packed_jobs_or_the_analysis_runs_failed_writes_name_the_sweep_in_the_command(full_disk_log, tmp_path,
                                                                                         owner):
    from analysis import wandb_run

    sweep = tmp_path / "S"
    full_disk_log(sweep / owner / "wandb" / "offline-run-20261207_000000-abc" / "logs" / "debug.log")
    logging.getLogger("wandb.sdk").warning("x")
    where, top = os.path.realpath(sweep / owner), os.path.realpath(sweep)
    tail = f"its offline runs in {where} may be incomplete: once there is space, "
    if owner == "wandb_analysis":
        assert wandb_io.said(wandb_run.LEAD, wandb_run.AGAIN) == (
            "warning: wandb analysis run incomplete: 1 write of wandb's own logs failed (No space left on device); "
            + tail + "the same launch again logs the sweep's analysis run")
    else:
        assert wandb_io.said().endswith(
            tail + f"python -m rw_sweeps.sweeps.wandb_export {top} logs the finished runs wandb lacks")


def test_failed_logging_tasks_are_gathered_with_the_failed_writes(full_disk_log, tmp_path, capfd):
    full_disk_log(tmp_path / "S" / "wandb_jobs" / "j1" / "wandb" / "offline-run-x" / "logs" / "debug.log")

    def disk_full():
        logging.getLogger("wandb.sdk").warning("x")
        raise OSError(28, "No space left on device")

    for _ in range(3):
        tracking.submit(disk_full, where=tmp_path / "S")
    tracking.wait()
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    where = os.path.realpath(tmp_path / "S")
    assert lines == [
        "warning: wandb logging failed: OSError: [Errno 28] No space left on device (3 times); 3 writes of wandb's "
        f"own logs failed (No space left on device); its offline runs in {where} may be incomplete: once there "
        f"is space, python -m rw_sweeps.sweeps.wandb_export {where} logs the finished runs wandb lacks"], lines


# ------------------------------------------------------------------------------ a real full disk
GRID = ["data.p=0,0.1,0.5,1", "optim.steps=20", "wandb.mode=offline", "wandb.analysis=true"]
FILLER_KB = 800  # of the disk's 1 MiB: what is left holds about two of the grid's four runs


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs holding an 800 KiB filler file; yields (disk, free), free() deleting the filler."""
    with small_tmpfs(tmp_path / "disk") as disk:
        (disk / "filler").write_bytes(b"\0" * (FILLER_KB * 1024))
        yield disk, (disk / "filler").unlink


def _lines(r: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]


def _files(run: Path) -> dict[str, bytes]:
    """A run's result files (its wandb folder aside, which the export replaces)."""
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != tracking.EXPORTED}


@pytest.mark.e2e
def test_a_full_disk_under_a_grid_with_wandb_is_one_wandb_line_and_exit_1_and_the_relaunch_is_exact(tiny_disk):
    """The case reproduced: a 4-run grid, wandb offline, on a full disk printed 74–95 `--- Logging error ---`
    blocks (2,205 lines). Now: each failed run one line, wandb's failures one line, exit 1; freed, the same
    command trains exactly the missing runs, and the export logs the finished runs wandb lacks."""
    disk, free = tiny_disk
    sweep = disk / "S"
    r = launch("-m", *GRID, f"hydra.sweep.dir={sweep}")
    lines = _lines(r)
    text = "\n".join(lines)
    assert "Logging error" not in text and "Traceback" not in text, text[-3000:]
    assert not any(ln[0].isspace() for ln in lines), text[-3000:]  # no traceback frames, no message bodies
    gathered = [ln for ln in lines if ln.startswith(wandb_io.LEAD)]
    assert len(gathered) == 1, text[-3000:]
    assert "No space left on device" in gathered[0] and f"wandb_export {os.path.realpath(sweep)} " in gathered[0], gathered
    # the analysis run (the callback's line) is the only other line that speaks of wandb
    others = [ln for ln in lines if "wandb" in ln.lower() and ln not in gathered
              and not ln.startswith("wandb analysis run: the runs table")]  # the analysis run's own start line
    assert all(ln.startswith("warning: wandb analysis run ") for ln in others) and len(others) <= 1, others
    assert len(lines) < 20, text  # was 1,600–2,205 for this grid
    done = {n for n, s in summaries(sweep).items() if s["status"] == "done"}
    assert len(done) < 4, text  # the disk was full: some runs failed for it
    failed = [ln for ln in lines if ln.startswith("failed: ")]
    assert len(failed) == 4 - len(done) and all("No space left on device" in ln for ln in failed), text
    assert r.returncode == 1, text
    for n in done:  # nothing unfinished is done
        assert contract.judge(sweep / n).state == "done"
    kept = {n: _files(sweep / n) for n in done}

    # an export while the disk is still full: the runs wandb lacks fail, a line each, none marked exported
    r = python("-m", "rw_sweeps.sweeps.wandb_export", sweep, "--workers", "1")
    assert r.returncode == 1 and "Logging error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(r.stdout.splitlines()) == 1 and len(r.stderr.splitlines()) <= 5, r.stdout + r.stderr

    free()
    r = launch("-m", *GRID, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    line = f"sweep {sweep}: 4 runs: {4 - len(done)} done, {len(done)} skipped, 0 failed, 0 diverged"
    assert line in r.stdout + r.stderr, r.stdout + r.stderr
    got = summaries(sweep)
    assert sorted(got) == ["0", "1", "2", "3"] and all(s["status"] == "done" for s in got.values())
    assert {n: _files(sweep / n) for n in done} == kept  # the finished runs untouched, not retrained
    assert not any(ln.startswith(wandb_io.LEAD) for ln in _lines(r)), r.stderr  # wandb logged every run

    r = python("-m", "rw_sweeps.sweeps.wandb_export", sweep, "--workers", "1")
    assert r.returncode == 0 and r.stdout.strip().endswith(" 0 failed"), r.stdout + r.stderr
    for n, s in got.items():  # every run's offline wandb run is whole, and vouched for
        assert tracking.is_exported(sweep / n, results.run_id(sweep / n), "offline"), n
        assert read_run(sweep / n)["summary"]["test_acc"] == s["test_acc"], n
