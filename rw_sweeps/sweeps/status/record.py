"""The launcher's record of a sweep, `<sweep>/.rw_sweep.json`: written as a launch goes (`new_record`,
`write_record`), read back checked against its contract (`read_record`, `check_record`: every field status
reads, with its type and bounds), and the fingerprint of a run's summary that its `stale` entries hold."""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from rw_sweeps.core import layout, readers, results
from rw_sweeps.core.contract import RECORD_CAP
from rw_sweeps.core.readers import Broken

from .scheduler import PID_MAX, is_pid, is_start, process_start

STATE = ".rw_sweep.json"


def fingerprint(run_dir: Path) -> list | None:
    """Identifies one written summary.json (files are replaced, never rewritten: a new write is a new inode)."""
    try:
        st = os.stat(os.path.join(run_dir, results.SUMMARY))
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns]


def new_record(label: str, backend: str, detached: bool = False) -> dict:
    """What a launcher writes to `<sweep>/.rw_sweep.json` (and keeps adding to, batch after batch)."""
    rec = {"version": 1, "sweep": label, "backend": backend, "detached": detached, "submitted": time.time(),
           "runs": [], "skipped": [], "stale": {}, "jobs": {}, "arrays": []}
    if backend != "slurm":  # jobs run under this process: when it is gone, so are they
        rec.update(host=socket.gethostname(), pid=os.getpid(), start=process_start(os.getpid()))
    return rec


def write_record(sweep_dir: Path, rec: dict) -> None:
    results.atomic_write(Path(sweep_dir) / STATE, json.dumps(rec, indent=1))


def read_record(sweep_dir: Path) -> dict | None:
    """The sweep's record, checked (`check_record`); None only if there is none (Hydra's own launcher wrote
    no record: the folders are read instead). Broken, in one line, if it cannot be read or breaks the
    contract: a link, a FIFO, over RECORD_CAP, not strict JSON, nested too deep, a field of the wrong type."""
    path = Path(sweep_dir) / STATE
    try:
        rec = readers.read_json(path, RECORD_CAP, STATE)
    except FileNotFoundError:
        return None
    return check_record(rec, path)


def _text(v) -> bool:
    return type(v) is str and "\0" not in v  # a NUL in a path makes every os call raise ValueError


def _texts(v) -> bool:
    return type(v) is list and all(map(_text, v))


def _run_names(v) -> bool:
    """Run folders relative to the sweep folder and inside it (the launcher places every run there): a
    record naming /elsewhere or ../x would make status judge runs that are not the sweep's."""
    return _texts(v) and all(map(layout.valid_name, v))


# Every field status reads: (its check, what it must be). Required unless in OPTIONAL: `host`, `pid` and
# `start` are written for local sweeps only (and `start` only by versions that record it).
RECORD_FIELDS = {
    "version": (lambda v: type(v) is int and v == 1, "1"),
    "sweep": (_text, "a text"),
    "backend": (_text, "a text"),
    "detached": (lambda v: type(v) is bool, "true or false"),
    "submitted": (lambda v: type(v) in (int, float) and 0 <= v < 1e11, "a time in seconds since 1970"),
    "runs": (_run_names, "a list of run folders inside the sweep folder"),
    "skipped": (_run_names, "a list of run folders inside the sweep folder"),
    "stale": (lambda v: type(v) is dict and all(type(f) is list and len(f) == 2 and all(type(x) is int for x in f)
                                                for f in v.values()), "a mapping of run names to [inode, mtime]"),
    "jobs": (lambda v: type(v) is dict and all(map(_run_names, v.values())), "a mapping of job ids to run names"),
    "arrays": (_texts, "a list of job ids"),
    "host": (_text, "a text"),
    "pid": (is_pid, f"a process id (1 to {PID_MAX})"),
    "start": (is_start, "a start time in clock ticks, or null"),
}
OPTIONAL = {"host", "pid", "start"}
_JSON_TYPES = {dict: "an object", list: "a list", str: "a text", int: "an integer", float: "a number",
               bool: "true or false", type(None): "null"}


def check_record(rec, path) -> dict:
    """The record if every field status reads is there (but OPTIONAL ones) with its type and bounds, else
    Broken naming the first that is not (its JSON type, never its content)."""
    if type(rec) is not dict:
        raise Broken(path, f"{STATE} is not a JSON object")
    for key, (ok, what) in RECORD_FIELDS.items():
        if key not in rec:
            if key not in OPTIONAL:
                raise Broken(path, f"{STATE} has no {key!r}")
        elif not ok(rec[key]):
            raise Broken(path, f"{key} must be {what} (it is {_JSON_TYPES.get(type(rec[key]), '?')})")
    return rec
