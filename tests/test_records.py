"""Records a stranger may plant: `<sweep>/.rw_lock` and `<sweep>/.rw_sweep.json`.

Both are read through `rw_sweeps.core.readers` (regular files, capped, strict JSON, bounded nesting) and
checked field by field: one that breaks the contract is refused in one line, never a traceback, never a
hang. A process is named by its pid and its start time, so a pid reused by an unrelated process neither
holds a lock nor keeps a sweep pending. Everything status prints from a record or a folder is escaped.
Every command runs as a user runs it, in a real process, under a timeout (a FIFO must not block it).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rw_sweeps.sweeps import lock, status

from .conftest import ROOT, start_launch, status_cmd, status_here, steps_lasting, wait_for_training, wait_until

GOOD = {"version": 1, "sweep": "S", "backend": "local", "detached": False, "submitted": 1.7e9, "runs": ["0"],
        "skipped": [], "stale": {}, "jobs": {"local": ["0"]}, "arrays": []}
NESTED = "[" * 200_000 + "]" * 200_000
ME = os.getpid()  # a live process, unrelated to the child processes below: a reused pid, seen from them


def sweep_with(tmp_path: Path, name: str, content) -> Path:
    """A sweep folder whose file `name` holds `content`: text, a dict (as JSON), "FIFO" or "SPARSE" (1 GiB)."""
    sweep = tmp_path / "S"
    sweep.mkdir(exist_ok=True)
    path = sweep / name
    if content == "FIFO":
        os.mkfifo(path)  # no writer ever opens it: a blocking read would wait forever
    elif content == "SPARSE":
        path.touch()
        os.truncate(path, 1 << 30)  # a 1 GiB file that takes no disk: read whole, it would take 1 GiB of memory
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return sweep


def refusal(r: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit 2, nothing else on stderr, no traceback anywhere)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    return lines[0]


def record_without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# ------------------------------------------------------------------------------ status: the record
@pytest.mark.parametrize("content, why", [
    (NESTED, ".rw_sweep.json is not valid JSON (depth limit exceeded"),  # orjson stops at 1024: no RecursionError
    (json.dumps(GOOD)[:-1] + ', "x": ' + "[" * 100 + "]" * 100 + "}", ".rw_sweep.json nests deeper than 64 levels"),
    ("SPARSE", f".rw_sweep.json is {1 << 30:,} bytes; its cap is {256 << 20:,}"),
    ("FIFO", ".rw_sweep.json is not a regular file (a FIFO); it is not read"),
    ("{not json", ".rw_sweep.json is not valid JSON"),
    ('{"version": NaN}', ".rw_sweep.json is not valid JSON"),
    ([GOOD], ".rw_sweep.json is not a JSON object"),
    ({**GOOD, "version": "1"}, "version must be 1 (it is a text)"),
    ({**GOOD, "version": 2}, "version must be 1 (it is an integer)"),
    ({**GOOD, "sweep": 5}, "sweep must be a text (it is an integer)"),
    ({**GOOD, "backend": None}, "backend must be a text (it is null)"),
    ({**GOOD, "detached": "no"}, "detached must be true or false (it is a text)"),
    ({**GOOD, "submitted": "yesterday"}, "submitted must be a time in seconds since 1970 (it is a text)"),
    ({**GOOD, "submitted": 1e300}, "submitted must be a time in seconds since 1970 (it is a number)"),
    ({**GOOD, "runs": "0"}, "runs must be a list of run folders inside the sweep folder (it is a text)"),
    ({**GOOD, "runs": [0]}, "runs must be a list of run folders inside the sweep folder (it is a list)"),
    ({**GOOD, "runs": ["a\0b"]}, "runs must be a list of run folders inside the sweep folder (it is a list)"),  # os calls raise on NUL
    ({**GOOD, "skipped": {"0": 1}}, "skipped must be a list of run folders inside the sweep folder (it is an object)"),
    ({**GOOD, "stale": {"0": "x"}}, "stale must be a mapping of run names to [inode, mtime] (it is an object)"),
    ({**GOOD, "stale": {"0": [1, True]}}, "stale must be a mapping of run names to [inode, mtime] (it is an object)"),
    ({**GOOD, "stale": []}, "stale must be a mapping of run names to [inode, mtime] (it is a list)"),
    ({**GOOD, "jobs": {"local": "0"}}, "jobs must be a mapping of job ids to run names (it is an object)"),
    ({**GOOD, "jobs": ["0"]}, "jobs must be a mapping of job ids to run names (it is a list)"),
    ({**GOOD, "arrays": [12]}, "arrays must be a list of job ids (it is a list)"),
    ({**GOOD, "host": 1}, "host must be a text (it is an integer)"),
    ({**GOOD, "pid": "1234"}, "pid must be a process id (1 to 2147483647) (it is a text)"),
    ({**GOOD, "pid": True}, "pid must be a process id (1 to 2147483647) (it is true or false)"),
    ({**GOOD, "pid": 0}, "pid must be a process id (1 to 2147483647) (it is an integer)"),  # kill(0) = my group
    ({**GOOD, "pid": 1 << 40}, "pid must be a process id (1 to 2147483647) (it is an integer)"),
    ({**GOOD, "start": "now"}, "start must be a start time in clock ticks, or null (it is a text)"),
    ({**GOOD, "start": -1}, "start must be a start time in clock ticks, or null (it is an integer)"),
    *[(record_without(k), f".rw_sweep.json has no {k!r}") for k in GOOD],
])
@pytest.mark.timeout(60)  # a FIFO read would block: the timeout fails the test
def test_a_record_that_breaks_the_contract_is_refused_in_one_line(tmp_path, content, why):
    """In this process: a refusal is its exit code and its one line (`status_here`)."""
    sweep = sweep_with(tmp_path, status.STATE, content)
    for args in ([], ["--wait", "--interval", "0.1"]):
        r = status_here(str(sweep), *args)
        assert refusal(r).startswith(f"error: {sweep / status.STATE}: {why}")  # (a parse error goes on to say where)
        assert r.stdout == ""


@pytest.mark.e2e
def test_a_record_that_meets_the_contract_is_read(tmp_path):
    sweep = sweep_with(tmp_path, status.STATE, {**GOOD, "start": None})  # null: a writer without /proc
    r = status_cmd(str(sweep), timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == f"sweep {sweep}: 1 run: 0 done, 0 skipped, 0 failed, 0 diverged, 0 running, 1 pending\n"


@pytest.mark.e2e
def test_a_missing_record_still_counts_the_runs_from_their_folders(tmp_path):
    sweep = tmp_path / "S"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    r = status_cmd(str(sweep), timeout=60)
    assert r.returncode == 0 and "has no .rw_sweep.json" in r.stderr
    assert r.stdout == f"sweep {sweep}: 1 run: 0 done, 0 skipped, 0 failed, 0 diverged, 0 running, 1 pending\n"


# ------------------------------------------------------------------------------ status: what it prints
FAILED = {"status": "failed", "steps": 0, "seed": 0, "K": 2, "N": 2}


@pytest.mark.e2e
def test_escape_codes_in_a_label_a_run_name_and_an_error_are_printed_escaped(tmp_path):
    label = "\x1b[2J\x1b[H\x9b31mALL GOOD\u202e\r"  # clear the screen, home, C1 CSI, a bidi override, CR
    name = "run\x1b]0;title\x07"
    sweep = sweep_with(tmp_path, status.STATE, {**GOOD, "sweep": label, "runs": [name], "jobs": {}})
    (sweep / name).mkdir()
    (sweep / name / "summary.json").write_text(json.dumps({**FAILED, "error": "boom\x1b[31m\nforged line"}))
    for args in ([], ["--wait", "--interval", "0.1"]):
        r = status_cmd(str(sweep), *args, timeout=60)
        assert r.returncode == 1, r.stderr
        out = r.stdout + r.stderr
        assert not any(c in out for c in "\x1b\x07\x9b\r\u202e"), repr(out)
        line = f"failed {sweep}/run\\x1b]0;title\\x07: boom\\x1b[31m\\x0aforged line\n"
        assert r.stderr.endswith(line) and r.stderr.count("\n") == (2 if args else 1)  # --wait: a [status] line first
        # the sweep is named as given (the record's label is not printed: tests/test_edges_status.py)
        assert "ALL GOOD" not in out and r.stdout.startswith(f"sweep {sweep}: 1 run: 0 done, 0 skipped, 1 failed")


@pytest.mark.e2e
def test_escape_codes_in_a_folder_name_are_printed_escaped_without_a_record(tmp_path):
    sweep = tmp_path / "S"
    (sweep / "x\x1b[2J").mkdir(parents=True)
    (sweep / "x\x1b[2J" / "summary.json").write_text(json.dumps({**FAILED, "error": "e"}))
    r = status_cmd(str(sweep), timeout=60)
    assert r.returncode == 1 and "\x1b" not in r.stdout + r.stderr
    assert f"failed {sweep}/x\\x1b[2J: e\n" in r.stderr


def test_shown_escapes_every_control_character_and_nothing_else():
    assert status.shown("plain ü → ok\\") == "plain ü → ok\\"
    assert status.shown("".join(map(chr, range(0x20)))) == "".join(f"\\x{i:02x}" for i in range(0x20))
    assert status.shown("\x7f\x80\x9f\u2028\u2066") == "\\x7f\\x80\\x9f\\u2028\\u2066"


# ------------------------------------------------------------------------------ status: pid and start time
def local_record(start) -> dict:
    rec = {**GOOD, "host": socket.gethostname(), "pid": ME}
    return rec if start == "none" else {**rec, "start": start}


@pytest.mark.e2e
def test_a_local_sweep_whose_pid_was_reused_by_another_process_has_ended(tmp_path):
    sweep = sweep_with(tmp_path, status.STATE, local_record(status.process_start(ME) + 1))
    r = status_cmd(str(sweep), timeout=60)
    assert r.returncode == 1
    assert r.stdout == (f"sweep {sweep}: 1 run: 0 done, 0 skipped, 1 failed, 0 diverged, 0 running, 0 pending; "
                        "jobs: 1 ENDED\n")
    assert r.stderr == f"failed {sweep}/0: job local ended (ENDED) without writing this run's summary\n"


@pytest.mark.e2e
@pytest.mark.parametrize("start", ["right", "none"])  # "none": a record of an older version, judged by pid
def test_a_local_sweep_whose_process_lives_is_pending(tmp_path, start):
    sweep = sweep_with(tmp_path, status.STATE, local_record(status.process_start(ME) if start == "right" else "none"))
    r = status_cmd(str(sweep), timeout=60)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.endswith(", 0 running, 1 pending; jobs: 1 LIVE\n")


def test_a_live_local_sweep_counts_the_runs_of_its_started_chunks_as_running(tmp_path):
    """Runs whose folder (or `.hydra/`) this launch made, as a chunk starts, are running; a folder an earlier
    launch left, and a run whose chunk has not started, are pending."""
    sweep = tmp_path / "S"
    for name, age in (("0", 0), ("1", None), ("2", 3600)):   # started now; no folder yet; left an hour ago
        if age is not None:
            (sweep / name / ".hydra").mkdir(parents=True)
            old = time.time() - age
            for path in (sweep / name / ".hydra", sweep / name):
                os.utime(path, (old, old))
    rec = {**local_record(status.process_start(ME)), "runs": ["0", "1", "2"], "jobs": {"local": ["0", "1", "2"]},
           "submitted": time.time() - 5}
    (sweep / status.STATE).write_text(json.dumps(rec))
    snap = status.Sweep(sweep).poll()
    assert snap.states == {"0": "running", "1": "pending", "2": "pending"} and snap.jobs == {"local": "LIVE"}


@pytest.mark.e2e
def test_rw_status_during_a_real_local_sweep_says_which_runs_are_training(tmp_path):
    """Two chunks of two runs each (two shapes), trained one after the other by one process: while the first
    trains, 2 running and 2 pending; while the second trains, 2 done and 2 running."""
    sweep = tmp_path / "S"
    p = start_launch("-m", "data.N=97,49", "seed=0,1", "data.n_test=200", f"optim.steps={steps_lasting(5)}",
                     "wandb.mode=disabled", f"hydra.sweep.dir={sweep}")
    try:
        wait_for_training(p)
        assert status_cmd(str(sweep), timeout=60).stdout.endswith(
            "4 runs: 0 done, 0 skipped, 0 failed, 0 diverged, 2 running, 2 pending; jobs: 1 LIVE\n")
        line = wait_until(lambda: (lambda out: "runs: 2 done," in out and out)(status_cmd(str(sweep), timeout=60).stdout),
                          120, "the first chunk to finish", poll=0.2)
        assert line.endswith("2 done, 0 skipped, 0 failed, 0 diverged, 2 running, 0 pending; jobs: 1 LIVE\n"), line
        assert p.wait(timeout=300) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert status_cmd(str(sweep), timeout=60).stdout.endswith(", 0 running, 0 pending; jobs: 1 ENDED\n")


@pytest.mark.e2e
def test_process_start_is_field_22_of_proc_stat_and_names_one_process():
    start = status.process_start(ME)
    with open(f"/proc/{ME}/stat") as fh:
        assert start == int(fh.read().rsplit(")", 1)[1].split()[19]) > 0
    assert status.alive(ME) and status.alive(ME, start) and status.alive(ME, None)
    assert not status.alive(ME, start + 1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert status.process_start(dead.pid) is None and not status.alive(dead.pid)
    assert not status.alive(0) and not status.alive(-1) and not status.alive(True)


def test_new_records_name_their_process_by_pid_and_start_time():
    rec = status.new_record("S", "local")
    assert (rec["pid"], rec["start"]) == (ME, status.process_start(ME)) and status.check_record(rec, "x") is rec
    assert "start" not in status.new_record("S", "slurm")  # a SLURM sweep's jobs are asked of SLURM


# ------------------------------------------------------------------------------ the lock
CHILD = """
import json, sys
from pathlib import Path
from rw_sweeps.sweeps import lock
sweep = Path(sys.argv[1])
try:
    me = lock.acquire(sweep)
except lock.SweepLocked as e:
    print(e, file=sys.stderr)
    sys.exit(2)
print(json.dumps([me, json.loads((sweep / lock.LOCK).read_text())]))
lock.release(sweep)
"""


def acquire_in_child(sweep: Path) -> subprocess.CompletedProcess:
    """`lock.acquire` in a process of its own, under a timeout (a FIFO lock must not block it)."""
    return subprocess.run([sys.executable, "-c", CHILD, str(sweep)], cwd=ROOT, text=True, capture_output=True,
                          timeout=60)


@pytest.mark.parametrize("content", [NESTED, "FIFO", "SPARSE", '{"host": "h", "pid": "1234", "since": 1, "arrays": []}',
                                     '{"host": "h", "pid": 4294967296, "since": 1, "arrays": []}',
                                     '{"host": "h", "pid": 1234, "start": "x", "since": 1, "arrays": []}'])
@pytest.mark.e2e
def test_a_lock_that_breaks_the_contract_is_refused_in_one_line_and_kept(tmp_path, content):
    sweep = sweep_with(tmp_path, lock.LOCK, content)
    before = os.lstat(sweep / lock.LOCK)
    r = acquire_in_child(sweep)
    assert refusal(r) == (f"sweep folder {sweep}: its lock {sweep / lock.LOCK} cannot be read as a holder record; "
                          "remove it if no launch is using the folder")
    after = os.lstat(sweep / lock.LOCK)
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)


def holder(start) -> dict:
    rec = {"host": socket.gethostname(), "pid": ME, "since": 1.7e9, "arrays": []}
    return rec if start == "none" else {**rec, "start": start}


@pytest.mark.e2e
def test_a_lock_whose_pid_was_reused_by_a_live_unrelated_process_is_taken_over(tmp_path):
    sweep = sweep_with(tmp_path, lock.LOCK, holder(status.process_start(ME) + 1))
    r = acquire_in_child(sweep)
    assert r.returncode == 0, r.stderr
    me, written = json.loads(r.stdout)
    assert written == me and me["pid"] != ME and type(me["start"]) is int and me["start"] >= status.process_start(ME)
    assert not (sweep / lock.LOCK).exists()  # released by the child


@pytest.mark.e2e
@pytest.mark.parametrize("start", ["right", "none"])  # "none": a lock of an older version, judged by pid
def test_a_lock_whose_process_lives_is_held(tmp_path, start):
    content = holder(status.process_start(ME) if start == "right" else "none")
    sweep = sweep_with(tmp_path, lock.LOCK, content)
    r = acquire_in_child(sweep)
    assert refusal(r).startswith(f"sweep folder {sweep} is in use by pid {ME} on {socket.gethostname()} (since ")
    assert json.loads((sweep / lock.LOCK).read_text()) == content


def test_a_lock_names_its_host_and_jobs_escaped(tmp_path):
    content = {"host": "evil\x1b[2J", "pid": None, "since": 1.7e9, "arrays": ["1\x1b[H"]}
    assert lock.describe(content, tmp_path).startswith(
        f"sweep folder {tmp_path} is in use by SLURM job(s) 1\\x1b[H (since ")
    assert "evil\\x1b[2J" in lock.describe({**content, "pid": 7}, tmp_path)


@pytest.mark.e2e
def test_status_judges_a_run_as_the_launcher_and_analysis_do(tmp_path):
    """One contract: a done summary over a shortened history is failed (corrupt) for status, corrupt for
    analysis, and retrained by a relaunch; the intact run is done for all three."""
    from analysis import load_runs

    from ._fake_runs import make_sweep

    sweep = tmp_path / "s"
    make_sweep(sweep, {"data.p": [0.5, 1.0]}, seeds=(0,))
    rows = (sweep / "0" / "history.jsonl").read_text().splitlines()
    (sweep / "0" / "history.jsonl").write_text("\n".join(rows[:2]) + "\n")
    r = subprocess.run([sys.executable, "-m", "rw_sweeps.sweeps.status", str(sweep)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "1 done, 0 skipped, 1 failed" in r.stdout, r.stdout + r.stderr
    assert f"failed {sweep / '0'}: corrupt: history.jsonl ends at step 1; summary.json says 10 steps" in r.stderr
    runs = load_runs(sweep, progress=False, cache=False)
    assert runs["run"].tolist() == ["1"] and runs.attrs["skipped"][0]["status"] == "corrupt"
