"""The scheduler's answers about a sweep's jobs: SLURM's (`sacct`, or `squeue` where accounting is off), parsed
into job id → state, and, for a sweep whose jobs run under a local process, whether that very process lives
(/proc: a pid and its start time). No file of the sweep is read here."""
from __future__ import annotations

import os
import re
import socket
import subprocess

# SLURM job states (sacct/squeue). A requeued or preempted job comes back: it is waiting, not gone.
PENDING = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED", "PREEMPTED",
           "RESIZING", "UNKNOWN"}
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"}
# Anything else (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL…) has ended.

PID_MAX = 2 ** 31 - 1  # os.kill takes a C int: a larger pid would raise instead of answering


def is_pid(v) -> bool:
    return type(v) is int and 1 <= v <= PID_MAX  # type(): true/false are not pids; 0 and -1 signal groups


def is_start(v) -> bool:
    return v is None or (type(v) is int and v >= 0)  # null where the writer had no /proc



# ------------------------------------------------------------------------------------------ SLURM
def expand_ids(job_id: str) -> list[str]:
    """sacct/squeue ids → array task ids: `12_[0-3,7%2]` → 12_0 … 12_3, 12_7; `12_5` and `12` stay."""
    m = re.fullmatch(r"(\d+)_\[([^\]]*)\]", job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isascii() and lo.isdigit() and (not hi or (hi.isascii() and hi.isdigit())):
            out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def parse_states(text: str) -> dict[str, str]:
    """`JobID|State` lines (sacct --parsable2 -n, squeue -o '%i|%T') → {job id: state}; job steps ignored."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0] or "." in parts[0]:
            continue
        state = (parts[1].split() or ["UNKNOWN"])[0].upper()  # "CANCELLED by 0" → CANCELLED
        for j in expand_ids(parts[0]):
            out[j] = state
    return out


def slurm_states(arrays: list[str]) -> dict[str, str] | None:
    """The state of every job of these arrays, or None when SLURM cannot be asked from here.
    Jobs accounting has not seen yet are missing (they count as pending)."""
    if not arrays:
        return {}
    ids = ",".join(arrays)
    try:
        r = subprocess.run(["sacct", "-j", ids, "--parsable2", "-n", "-o", "JobID,State"], capture_output=True,
                           text=True, timeout=60)
        if r.returncode == 0:
            return parse_states(r.stdout)
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # no accounting: squeue knows the jobs that have not ended; the others have
        r = subprocess.run(["squeue", "-h", "-r", "-j", ids, "-o", "%i|%T"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 and "invalid job id" not in r.stderr.lower():
        return None
    live = parse_states(r.stdout) if r.returncode == 0 else {}
    return _Ended(live)


class _Ended(dict):
    """squeue's answer: a job it does not list has ended."""

    def get(self, key, default=None):
        return super().get(key, "ENDED")


# ------------------------------------------------------------------------------------------ processes
# A pid alone does not name a process: once it has ended, its pid may be given to an unrelated one, which
# would then hold a lock or keep a sweep "pending" forever. A pid and its start time name one process.
def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from field 3 (state) on, or None (no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()  # after the last ')': the name may hold ') '
    except (OSError, IndexError):
        return None


def _started(fields: list[bytes] | None) -> int | None:
    try:
        return int(fields[22 - 3]) if fields else None  # field 22; `fields` starts at field 3
    except (IndexError, ValueError):
        return None


def process_start(pid: int) -> int | None:
    """When process `pid` started: field 22 (`starttime`, clock ticks since boot) of /proc/<pid>/stat;
    None where there is no /proc (macOS) or no such process."""
    return _started(_proc_stat(pid))


def alive(pid: int, start: int | None = None) -> bool:
    """Is process `pid` running (not a zombie), and, where `start` and its start time are both known, the
    very process that started then? A record without a start time (an older version) is judged by pid."""
    if not is_pid(pid):
        return False
    fields = _proc_stat(pid)
    if fields:
        now = _started(fields)
        return fields[0] not in (b"Z", b"X") and (start is None or now is None or now == start)
    try:  # no /proc: ask the kernel whether the pid exists (its start time cannot be known)
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# ------------------------------------------------------------------------------------------ a sweep's jobs
def job_states(record: dict) -> dict | None:
    """The state of every job of a sweep's record: SLURM's for a SLURM sweep; for a local one, LIVE or ENDED
    for all of its jobs alike (its launching process, on this host); None where nothing can be asked."""
    if record.get("backend") == "slurm":
        return slurm_states(record["arrays"])
    if record.get("pid") and record.get("host") == socket.gethostname():
        return _Const("LIVE" if alive(record["pid"], record.get("start")) else "ENDED")
    return None


class _Const(dict):
    def __init__(self, state: str):
        super().__init__()
        self.state = state

    def get(self, key, default=None):
        return self.state
