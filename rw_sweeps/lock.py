"""One launch per sweep folder: `<sweep>/.rw_lock`, created with O_EXCL (atomic on local and NFS v3+ file
systems), names its holder: a host and pid, or, once a detached SLURM sweep's launcher has returned, the
job arrays that still write into the folder. A second launch refuses in one line naming the holder, or
waits for it with `hydra.launcher.wait_for_lock=true`. A lock whose process is gone (same host) or whose
jobs have all ended is stale and taken over.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

LOCK = ".rw_lock"


class SweepLocked(RuntimeError):
    """The sweep folder is in use by another launch (the message names it)."""


def _read(path: Path) -> tuple[dict | None, int | None]:
    try:
        st = os.stat(path)
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, None
    return (holder if isinstance(holder, dict) else None), st.st_ino


def _held(holder: dict) -> bool:
    """Is the holder still at work: its SLURM jobs pending or running, or its process alive (same host)?"""
    from .status import PENDING, RUNNING, _alive, slurm_states

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
    return isinstance(pid, int) and _alive(pid)


def describe(holder: dict, sweep_dir: Path) -> str:
    who = [f"pid {holder['pid']} on {holder.get('host')}"] if holder.get("pid") else []
    if holder.get("arrays"):
        who.append(f"SLURM job(s) {', '.join(holder['arrays'])}")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return (f"sweep folder {sweep_dir} is in use by {' and '.join(who) or 'another launch'} (since {since}); "
            f"wait for it with hydra.launcher.wait_for_lock=true, or remove {Path(sweep_dir) / LOCK} if it is gone")


def acquire(sweep_dir: Path, wait: bool = False, poll_s: float = 2.0) -> dict:
    """Take the sweep's lock for this process, or raise SweepLocked (or wait for it)."""
    path = Path(sweep_dir) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(), "arrays": []}
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder, ino = _read(path)
            if holder is not None and _held(holder):
                if not wait:
                    raise SweepLocked(describe(holder, Path(sweep_dir))) from None
                time.sleep(poll_s)
                continue
            _take_over(path, ino)
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        return me


def _take_over(path: Path, ino: int | None) -> None:
    """Remove a stale lock, but only the very file judged stale (another launch may have replaced it)."""
    aside = path.with_name(f"{LOCK}.stale.{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if ino is not None and os.stat(aside).st_ino != ino:  # a fresh lock: put it back
        os.rename(aside, path)
        return
    aside.unlink(missing_ok=True)


def hand_to_jobs(sweep_dir: Path, arrays: list[str]) -> None:
    """A detached SLURM sweep: the lock now belongs to its jobs, until they have all ended."""
    path = Path(sweep_dir) / LOCK
    holder, _ = _read(path)
    if holder is not None and holder.get("pid") == os.getpid():
        holder.update(pid=None, arrays=sorted(set(holder.get("arrays", [])) | set(arrays)))
        tmp = path.with_name(f"{LOCK}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(holder))
        os.replace(tmp, path)


def release(sweep_dir: Path) -> None:
    path = Path(sweep_dir) / LOCK
    holder, _ = _read(path)
    if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)
