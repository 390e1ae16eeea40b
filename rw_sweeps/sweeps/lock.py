"""One launch per sweep folder: `<sweep>/.rw_lock` names its holder: a host and pid, or, once a detached
SLURM sweep's launcher has returned, the job arrays that still write into the folder. The lock is taken in
one atomic step, before anything else is written: the holder record is written to a fresh private file and
hard-linked to the lock's name (atomic on local and NFS file systems, and a reader never finds it empty).
A second launch refuses in one line naming the holder, or waits for it with
`hydra.launcher.wait_for_lock=true`. A holder process is named by its pid and its start time (a pid is
reused once its process has ended). A lock whose process is gone (same host: no such pid, or a pid now
given to a process that started at another time) or whose jobs have all ended is stale and taken over; a
lock that cannot be read (read through `readers`: a regular file within LOCK_CAP, strict JSON) or validated
is reported in one line, never taken over silently, except a very young empty one (a launch of an older
version creating it), which counts as held.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import socket
import stat
import time
from pathlib import Path

from rw_sweeps.core import readers, safefs
from rw_sweeps.core.contract import CHECKPOINT, CONFIG, HISTORY, LOCK_CAP, SNAPSHOTS, SUMMARY, job_number
from rw_sweeps.core.errors import Refused
from rw_sweeps.core.safefs import atomic_write, ensure_dir

from .status import PENDING, RUNNING, alive, is_pid, is_start, process_start, shown, slurm_states

LOCK = ".rw_lock"
RECORD = ".rw_sweep.json"  # status.STATE: the sweep's record, which makes a folder the project's
# What a launch of this project leaves in a sweep folder before its record (its lock, the config Hydra's
# sweepers save, a killed write's temp files), and what a run folder of any launcher holds: a folder of only
# these is the project's (a sweep of an older version, or one whose first launch stopped early)
_TOP = frozenset({LOCK, "multirun.yaml"})
_IN_RUN = frozenset({CONFIG, SUMMARY, HISTORY, SNAPSHOTS, CHECKPOINT, ".hydra", "wandb", ".wandb_exported.json"})
_LOOKED_AT = 10_000  # entries judged before a folder without a record is taken for someone else's


YOUNG_S = 10.0  # an empty lock younger than this is being written by its holder: held
_HELD: set[str] = set()  # the sweep folders this process holds


class NotASweep(Refused):
    """`hydra.sweep.dir` is a folder of someone else's files (the message names some of them)."""


def claim(sweep_dir: Path) -> None:
    """Refuse, in one line, a sweep folder that holds files this project did not make: a launch into a home or
    project folder would otherwise write over the user's own `multirun.yaml`, or take their folder `0/` for
    run 0. A folder is the project's when it holds the sweep's record or lock, or only what the project
    writes (numbered run folders of run files, `multirun.yaml`); a missing or empty folder is free."""
    try:
        names = os.listdir(sweep_dir)
    except (FileNotFoundError, NotADirectoryError):
        return  # made by the launch; a file at its name is placement's one line
    if RECORD in names or LOCK in names:
        return
    foreign = [n for n in sorted(names)[:_LOOKED_AT] if not _ours(Path(sweep_dir), n)]
    if len(names) > _LOOKED_AT and not foreign:
        foreign = [f"{len(names) - _LOOKED_AT:,} entries not looked at"]
    if foreign:
        listed = ", ".join(shown(n) + ("/" if os.path.isdir(os.path.join(sweep_dir, n)) else "") for n in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise NotASweep(f"invalid config: hydra.sweep.dir={shown(str(sweep_dir))}: the folder holds files this "
                        f"project did not make ({listed}{more}); choose a new or empty folder, or a sweep folder "
                        f"of rw-sweeps")


def _ours(sweep_dir: Path, name: str) -> bool:
    """Whether an entry of a sweep folder without a record is one the project writes."""
    if name in _TOP or safefs.TEMP_NAME.fullmatch(name):
        return True
    if job_number(name) is None:
        return False
    try:
        if not stat.S_ISDIR(os.lstat(sweep_dir / name).st_mode):
            return True  # a file or link at a run's place: stepped over or failed in one line, never written through
        inside = os.listdir(sweep_dir / name)
    except OSError:
        return False
    return all(n in _IN_RUN or n.endswith(".log") or safefs.TEMP_NAME.fullmatch(n) for n in inside)


class SweepLocked(Refused):
    """The sweep folder is in use by another launch (the message names it)."""


def _valid(holder) -> bool:
    """A holder record as `acquire` and `hand_to_jobs` write it (older versions wrote no `start`)."""
    if not isinstance(holder, dict):
        return False
    pid, since, arrays = holder.get("pid"), holder.get("since"), holder.get("arrays", [])
    return (isinstance(holder.get("host"), str) and (pid is None or is_pid(pid)) and is_start(holder.get("start"))
            and isinstance(since, (int, float)) and not isinstance(since, bool)
            and math.isfinite(since) and 0 <= since < 1e11 and isinstance(arrays, list)
            and all(isinstance(a, str) for a in arrays) and (pid is not None or bool(arrays)))


def _read(path: Path) -> tuple[str, dict | None, int | None]:
    """("held" | "gone" | "young" | "bad", the holder record, the file's inode)."""
    try:
        st = os.lstat(path)
        raw = readers.read_bytes(path, LOCK_CAP, LOCK)  # a link, FIFO, device or huge file: Broken, not read
    except FileNotFoundError:
        return "gone", None, None
    except (OSError, readers.Broken):
        return "bad", None, None
    if not raw.strip():
        return ("young" if abs(time.time() - st.st_mtime) < YOUNG_S else "bad"), None, st.st_ino
    try:
        holder = readers.json_value(raw, path, LOCK)  # strict JSON, nesting bounded (no RecursionError)
    except readers.Broken:
        return "bad", None, st.st_ino
    return ("held" if _valid(holder) else "bad"), (holder if isinstance(holder, dict) else None), st.st_ino


def _held(holder: dict) -> bool:
    """Is the holder still at work: its SLURM jobs pending or running, or its process alive (same host:
    its pid, started at its recorded start time)?"""
    if holder.get("arrays"):
        states = slurm_states(holder["arrays"])
        if states is None:
            return True  # SLURM cannot be asked from here: assume the jobs go on
        live = PENDING | RUNNING
        if any(s in live for s in states.values()) or not states:
            return True
        if holder.get("pid") is None:
            return False
    if holder.get("host") != socket.gethostname():
        return True  # a process on another host: it cannot be checked from here
    pid = holder.get("pid")
    return is_pid(pid) and alive(pid, holder.get("start"))


def describe(holder: dict, sweep_dir: Path) -> str:
    who = [f"pid {holder['pid']} on {shown(holder.get('host'))}"] if holder.get("pid") else []
    if holder.get("arrays"):  # the host and job ids are a stranger's text: escaped, as status prints them
        who.append(f"SLURM job(s) {shown(', '.join(holder['arrays']))}")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
    return (f"sweep folder {sweep_dir} is in use by {' and '.join(who) or 'another launch'} (since {since}); "
            f"wait for it with hydra.launcher.wait_for_lock=true, or remove {Path(sweep_dir) / LOCK} if it is gone")


def _create(path: Path, me: dict) -> bool:
    """The lock, with its content, in one step; False if a lock is there."""
    body = json.dumps(me).encode()
    private = path.with_name(f"{LOCK}.{socket.gethostname()}.{os.getpid()}")
    atomic_write(private, body)  # a fresh file of ours (the one writer), then linked to the lock's name
    try:
        os.link(private, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: O_EXCL, then the content
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        return True
    finally:
        private.unlink(missing_ok=True)


def acquire(sweep_dir: Path, wait: bool = False, poll_s: float = 2.0) -> dict:
    """Take the sweep's lock for this process, or raise SweepLocked (or wait for it). Taking a lock this
    process holds already is a no-op."""
    path = Path(sweep_dir) / LOCK
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid()), "since": time.time(),
          "arrays": []}
    if str(path.resolve()) in _HELD:
        return me
    ensure_dir(path.parent)
    while True:
        if _create(path, me):
            _HELD.add(str(path.resolve()))
            return me
        state, holder, ino = _read(path)
        if state == "bad":
            raise SweepLocked(f"sweep folder {sweep_dir}: its lock {path} cannot be read as a holder record; "
                              f"remove it if no launch is using the folder")
        if state in ("held", "young") and (state == "young" or _held(holder)):
            if not wait:
                raise SweepLocked(describe(holder, Path(sweep_dir)) if holder else
                                  f"sweep folder {sweep_dir} is being locked by another launch right now")
            time.sleep(poll_s)
            continue
        if state == "held":
            _take_over(path, ino)


def _take_over(path: Path, ino: int | None) -> None:
    """Remove a stale lock, but only the very file judged stale (another launch may have replaced it)."""
    aside = path.with_name(f"{LOCK}.stale.{secrets.token_hex(8)}")
    try:
        os.rename(path, aside)
    except OSError:  # gone already (another launch took it over), or not ours to move
        return
    if ino is not None and os.stat(aside).st_ino != ino:  # a fresh lock: put it back
        os.rename(aside, path)
        return
    aside.unlink(missing_ok=True)


def hand_to_jobs(sweep_dir: Path, arrays: list[str]) -> None:
    """A detached SLURM sweep: the lock now belongs to its jobs, until they have all ended."""
    path = Path(sweep_dir) / LOCK
    _, holder, _ = _read(path)
    if _mine(holder):
        holder.update(pid=None, start=None, arrays=sorted(set(holder.get("arrays", [])) | set(arrays)))
        atomic_write(path, json.dumps(holder))


def release(sweep_dir: Path) -> None:
    path = Path(sweep_dir) / LOCK
    _HELD.discard(str(path.resolve()))
    _, holder, _ = _read(path)
    if _mine(holder):
        try:
            safefs.unlink(path)  # through the sweep folder's handle: its name may lead elsewhere by now
        except OSError:
            pass  # the folder is gone (SweepGone) or the lock with it: nothing of ours is left to release


def _mine(holder: dict | None) -> bool:
    """Does the holder record name this process (its host, pid and, where recorded, start time)? A lock left
    by an earlier process with this pid is not ours to release or hand on."""
    return (holder is not None and holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid()
            and holder.get("start") in (None, process_start(os.getpid())))
