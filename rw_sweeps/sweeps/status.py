"""`python -m rw_sweeps.sweeps.status SWEEP_DIR [--wait] [--interval S]`: where a sweep stands.

The sweep folder's runs are every run folder in it (`rw_sweeps.core.layout`: at whatever depth
`hydra.sweep.subdir` puts them), of every launch and sweeper, each judged by the contract
(`contract.judge`: done, failed, diverged, corrupt — counted failed — or unfinished). The launcher's record
`<sweep>/.rw_sweep.json` is the last launch's: which runs it expects, which it found done (skipped), and which
job trains which run; SLURM's accounting (`sacct`, or `squeue` where accounting is off) says whether an
unfinished run's job is pending, running or gone. A run whose job ended without writing its summary
(cancelled, killed at its time limit, out of memory, a dead node) is failed; an unfinished run that the last
launch does not train is `unfinished` (a relaunch trains it). Given one run's folder, status prints the
contract's verdict of that run. Lines name the folder as it was given.

`--wait` follows the sweep until every run is finished and every job has ended, then prints the line a
blocking sweep prints (`sweep DIR: N runs: a done, b skipped, c failed, d diverged`, with `, e unfinished`
where the folder holds such runs) and exits 1 if a run failed. The blocking SLURM launcher waits through the
same code.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rw_sweeps.core import contract, layout, readers, results, store
from rw_sweeps.core.console import prog, shown  # noqa: F401 - shown: imported from here too (lock, sync)
from rw_sweeps.core.contract import RECORD_CAP
from rw_sweeps.core.readers import Broken

STATE = ".rw_sweep.json"
FINAL = ("done", "skipped", "failed", "diverged")
# A run of the sweep folder that no summary finishes and the last launch does not train (an earlier launch
# was stopped): final too, as nothing running will change it; a relaunch trains it.
UNFINISHED = "unfinished"
# A folder holding a copy of a run counted already (a backup `cp -a 0 X`: it carries that run's run_id)
COPY = "copy"
DONE_WITH = (*FINAL, UNFINISHED, COPY)  # the states no running job changes
# SLURM job states (sacct/squeue). A requeued or preempted job comes back: it is waiting, not gone.
PENDING = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED", "PREEMPTED",
           "RESIZING", "UNKNOWN"}
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"}
# Anything else (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL…) has ended.
GRACE_S = 15.0  # how long an ended job's summaries may take to show up (shared file systems cache lookups)


def summary_line(label: str, counts: Counter) -> str:
    """The one line that ends every sweep, blocking or followed (with the runs of earlier launches that no
    launch finished, where a followed sweep folder holds any)."""
    left = f", {counts[UNFINISHED]} {UNFINISHED}" if counts[UNFINISHED] else ""
    return (f"sweep {shown(label)}: {sum(counts[k] for k in (*FINAL, UNFINISHED))} runs: {counts['done']} done, "
            f"{counts['skipped']} skipped, {counts['failed']} failed, {counts['diverged']} diverged{left}")


def fingerprint(run_dir: Path) -> list | None:
    """Identifies one written summary.json (files are replaced, never rewritten: a new write is a new inode)."""
    try:
        st = os.stat(os.path.join(run_dir, results.SUMMARY))
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns]


# ------------------------------------------------------------------------------------------ the record
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


PID_MAX = 2 ** 31 - 1  # os.kill takes a C int: a larger pid would raise instead of answering


def is_pid(v) -> bool:
    return type(v) is int and 1 <= v <= PID_MAX  # type(): true/false are not pids; 0 and -1 signal groups


def is_start(v) -> bool:
    return v is None or (type(v) is int and v >= 0)  # null where the writer had no /proc


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


# ------------------------------------------------------------------------------------------ the sweep
@dataclass
class Snapshot:
    states: dict  # run name → done | skipped | failed | diverged | running | pending
    errors: dict  # run name → why it failed
    jobs: dict  # job id → SLURM state (or ENDED / LIVE for a local sweep); {} when unknown
    finished: bool
    counts: Counter = field(default_factory=Counter)

    def __post_init__(self):
        self.counts = Counter(self.states.values())


class Sweep:
    """A sweep folder, its record and its jobs; `poll()` classifies every run.

    `whole` (rw-status): every run of the folder (`layout.run_folders`: what the record names and the run
    folders present, whichever launch or sweeper made them), each judged by the contract, the last launch's
    live states kept for its own runs. Else (a launcher following its own launch): the record's runs alone.
    `label` names the sweep in its lines (rw-status: the folder as given; else the record's)."""

    def __init__(self, sweep_dir: Path, record: dict | None = None, grace_s: float = GRACE_S,
                 whole: bool = False, label: str | None = None):
        self.dir = Path(sweep_dir)
        self.record = record if record is not None else read_record(self.dir)
        self.grace_s = grace_s
        self.ended_at: dict[str, float] = {}  # job id → when it was first seen ended
        self.recorded = self.record is not None
        if self.record is None:  # Hydra's own launcher: no record; the folders are all we know
            self.record = {"sweep": str(sweep_dir), "backend": None, "runs": [], "skipped": [], "stale": {},
                           "jobs": {}, "arrays": []}
            whole = True
        self.whole = whole
        self.label = label if label is not None else self.record["sweep"]
        self.launched = set(self.record["runs"])
        self.runs = layout.run_folders(self.dir, self.record["runs"]) if whole else list(self.record["runs"])
        self.skipped = set(self.record["skipped"])
        self.job_of = {r: j for j, rs in self.record["jobs"].items() for r in rs}
        self._judged: dict = {}  # run name → (its summary's fingerprint, its verdict)
        self._stored = None  # the sweep's store as the last poll read it (`rw_sweeps.core.store.index`)
        self.copies: dict = {}  # run name → why it is a copy of another (`_copies`)

    def verdict(self, name: str):
        """The contract's judgement of the run (`contract.judge`, as the launcher and analysis judge it) if this
        sweep wrote its summary (not one left over from an earlier one), else None; judged once per summary."""
        run_dir = self.dir / name
        if not store.has_folder(run_dir):  # a run of the sweep's store is judged by its record
            if self._stored is None and store.present(self.dir):
                self._stored = store.index(self.dir)
            v = self._stored.verdict(name) if self._stored is not None else None
            if v is not None:
                return v
        fp = fingerprint(run_dir)
        if fp is not None and fp == self.record["stale"].get(name):
            return None
        hit = self._judged.get(name)
        if hit is not None and hit[0] == fp and fp is not None:
            return hit[1]
        why = layout.problem(self.dir, name)  # a link on its path is never followed, a file is no run folder
        if why is not None:
            return contract.Verdict("corrupt", why=why)
        if fp is None:
            return None
        v = contract.judge(run_dir)
        if v.state == "unfinished":
            return None
        self._judged[name] = (fp, v)
        return v

    def summary(self, name: str) -> dict | None:
        """The run's summary if the contract judges the run finished (done, failed or diverged), else None."""
        v = self.verdict(name)
        return v.summary if v is not None and v.state in contract.STATUSES else None

    def _checkpoint(self, name: str) -> bool:
        """Has the run a checkpoint (it is being trained)? os.path.exists: a name too long to look up has none."""
        return os.path.exists(os.path.join(self.dir, name, "checkpoint.pt"))

    def _started(self, name: str) -> bool:
        """Has this launch started training the run? A chunk makes its runs' folders and `.hydra/` as it starts
        (as Hydra's run_job does a job's), so a run whose folder, `.hydra/` or checkpoint changed since the sweep
        was submitted is in a chunk being trained; an unfinished folder of an earlier launch is not, until its
        chunk comes."""
        since = self.record.get("submitted")
        if since is None:
            return self._checkpoint(name)
        run = os.path.join(self.dir, name)
        for path in (run, os.path.join(run, ".hydra"), os.path.join(run, "checkpoint.pt")):
            try:
                if os.stat(path, follow_symlinks=False).st_mtime >= since - 1:   # mtimes may lag by a tick
                    return True
            except (OSError, ValueError):   # not there (or a name too long to look up): not started by this one
                continue
        return False

    def job_states(self) -> dict | None:
        rec = self.record
        if rec.get("backend") == "slurm":
            return slurm_states(rec["arrays"])
        if rec.get("pid") and rec.get("host") == socket.gethostname():
            state = "LIVE" if alive(rec["pid"], rec.get("start")) else "ENDED"
            return _Const(state)
        return None

    def poll(self, ask_slurm: bool = True, states: dict | None = None) -> Snapshot:
        """Classify every run; `states` (job id → state) saves asking SLURM again."""
        jobs = states if states is not None else self.job_states() if ask_slurm else None
        self._stored = None  # the store is read again, once, by this poll
        now = time.time()
        out, errors = {}, {}
        for name in self.runs:
            if name in self.skipped and not self.whole:  # placement judged it done as this launch began
                out[name] = "skipped"
                continue
            v = self.verdict(name)
            if v is not None:  # a corrupt folder is failed: a relaunch trains it again
                out[name] = v.state if v.state in contract.STATUSES else "failed"
                if out[name] == "done" and name in self.skipped:  # found done by the last launch, not trained
                    out[name] = "skipped"
                if out[name] == "failed":
                    errors[name] = (v.summary or {}).get("error") or f"corrupt: {v.why}"
                continue
            if self.recorded and (name not in self.launched or name in self.skipped):
                out[name] = UNFINISHED  # no launch is training it: an earlier one stopped, or its summary went
                continue
            job = self.job_of.get(name)
            state = jobs.get(job, "UNKNOWN") if jobs is not None and job is not None else None
            if state is not None and (state in RUNNING | PENDING or state == "LIVE"):
                self.ended_at.pop(job, None)  # (back) in the queue: a requeued job may end again later
            if state is None:  # nothing to ask: a checkpoint means it is being trained
                out[name] = "running" if self._checkpoint(name) else "pending"
            elif state in RUNNING:
                out[name] = "running"
            elif state == "LIVE":  # a local sweep's process: the runs of the chunks it has started are training
                out[name] = "running" if self._started(name) else "pending"
            elif state in PENDING:
                out[name] = "pending"
            else:  # the job has ended and this run has no summary (yet?)
                since = self.ended_at.setdefault(job, now)
                if now - since >= self.grace_s:
                    out[name] = "failed"
                    errors[name] = f"job {job} ended ({state}) without writing this run's summary"
                else:
                    out[name] = "running"
        if self.whole:
            self._copies(out, errors)
        all_final = all(st in DONE_WITH for st in out.values())
        if jobs is None or not self.job_of:
            finished = all_final
        else:
            finished = all_final and all(
                jobs.get(j, "UNKNOWN") not in RUNNING | PENDING | {"LIVE"} for j in self.record["jobs"])
        job_states = {j: jobs.get(j, "UNKNOWN") for j in self.record["jobs"]} if jobs is not None else {}
        return Snapshot(out, errors, job_states, finished)

    def _copies(self, out: dict, notes: dict) -> None:
        """A run is counted once however many folders hold it (the analysis's rule, `analysis.load`): of the
        finished folders with one summary run_id, the one it was made in stays, else the first; the others
        are copies, each named once."""
        by_id: dict = {}
        for name, st in out.items():
            v = self._judged.get(name, (None, None))[1]
            rid = (v.summary or {}).get("run_id") if v is not None and st in ("done", "skipped") else None
            if isinstance(rid, str):
                by_id.setdefault(rid, []).append(name)
        for rid, names in by_id.items():
            if len(names) < 2:
                continue
            own = [n for n in names if results.run_id(self.dir / n) == rid]
            keep = own[0] if own else names[0]
            for n in names:
                if n != keep:
                    out[n] = COPY
                    self.copies[n] = f"a copy of {keep} (the same run_id {rid}); counted once"

    def follow(self, interval: float = 5.0, progress: bool | None = None, quiet: bool = False) -> Snapshot:
        """Poll until the sweep has finished; a progress bar on a terminal, a line per change otherwise."""
        if progress is None:
            progress = sys.stderr.isatty() and not os.environ.get("CI")
        bar, last_line, last_print = None, None, 0.0
        if progress and not quiet:
            from tqdm import tqdm  # tqdm: only a progress bar on a terminal needs it

            # nrows: some terminals (e.g. under `script`) report no height, and tqdm would then draw nothing
            bar = tqdm(total=len(self.runs), desc=shown(f"sweep {self.dir.name}"), file=sys.stderr, nrows=10,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} runs [{elapsed}{postfix}]")
        last_ask, snap, states = float("-inf"), None, None
        try:
            while True:
                now = time.time()
                # SLURM is asked every `interval` s, and every second once every run has its summary
                near_end = snap is not None and all(st in DONE_WITH for st in snap.states.values())
                if now - last_ask >= (min(1.0, interval) if near_end else interval):
                    states, last_ask = self.job_states(), now
                snap = self.poll(ask_slurm=False, states=states)
                n_final = sum(snap.counts[k] for k in DONE_WITH)
                if bar is not None:
                    bar.n = n_final
                    bar.set_postfix_str(_short_text(snap.counts), refresh=False)
                    bar.refresh()
                elif not quiet:
                    line = _progress_text(snap.counts)
                    if line != last_line and (snap.finished or now - last_print >= 10):
                        print(f"[status] {n_final}/{len(self.runs)} finished: {line}", file=sys.stderr, flush=True)
                        last_line, last_print = line, now
                if snap.finished:
                    return snap
                time.sleep(min(1.0, interval))
        finally:
            if bar is not None:
                bar.close()


class _Const(dict):
    def __init__(self, state: str):
        super().__init__()
        self.state = state

    def get(self, key, default=None):
        return self.state


def _short_text(c: Counter) -> str:
    """For the progress bar: what is moving, and any trouble."""
    parts = [f"{c['running']} running", f"{c['pending']} pending"]
    parts += [f"{c[k]} {k}" for k in ("skipped", "failed", "diverged") if c[k]]
    return ", ".join(parts)


def _progress_text(c: Counter) -> str:
    left = f", {c[UNFINISHED]} {UNFINISHED}" if c[UNFINISHED] else ""
    left += f", {c[COPY]} {'copies' if c[COPY] > 1 else COPY} not counted" if c[COPY] else ""
    return (f"{c['done']} done, {c['skipped']} skipped, {c['failed']} failed, {c['diverged']} diverged, "
            f"{c['running']} running, {c['pending']} pending{left}")


# ------------------------------------------------------------------------------------------ CLI
def is_run_folder(folder) -> bool:
    """One run's folder rather than a sweep's: it holds a run's config or summary and no sweep record."""
    return not os.path.lexists(os.path.join(folder, STATE)) and any(
        os.path.lexists(os.path.join(folder, f)) for f in (contract.CONFIG, contract.SUMMARY))


def run_status(given: str) -> int:
    """`rw-status RUN`: the contract's verdict of that one run (`run RUN: done`, or the state and why)."""
    v = contract.judge(Path(given))
    why = (v.summary or {}).get("error") if v.state == "failed" else None
    why = why or (v.why if v.state in ("corrupt", "unfinished") else None)
    print(shown(f"run {given}: {v.state}" + (f": {' '.join(str(why).split())}" if why else "")), flush=True)
    return 1 if v.state in ("failed", "corrupt") else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("rw_sweeps.sweeps.status", "rw-status"), description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", help="a sweep folder, or one run's folder")
    ap.add_argument("--wait", action="store_true", help="follow the sweep to its end, then print its summary line")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between questions to SLURM (10)")
    ap.add_argument("--grace", type=float, default=GRACE_S,
                    help=f"seconds an ended job's summaries may take to appear before its runs are failed ({GRACE_S:g})")
    args = ap.parse_args(argv)
    given = args.sweep_dir  # named in every line as typed: the record's path may be another name for it
    if not store.has_folder(given) and store.stored_verdict(given) is not None:  # one run of a sweep's store
        return run_status(given)
    if not os.path.isdir(given):
        print(shown(f"error: no sweep folder {given}"), file=sys.stderr)
        return 2
    if is_run_folder(given):
        return run_status(given)
    try:
        sweep = Sweep(Path(given), grace_s=args.grace, whole=True, label=given)
    except Broken as e:  # a record that breaks the contract: refused in one line, never guessed around
        print(shown(f"error: {e}"), file=sys.stderr)
        return 2
    if not sweep.recorded:
        print(shown(f"note: {given} has no {STATE} (Hydra's own launcher): runs counted from its folders"),
              file=sys.stderr)
        if args.wait and not sweep.runs:
            print("error: nothing to follow", file=sys.stderr)
            return 2
    if args.wait:
        snap = sweep.follow(interval=args.interval)
    else:
        sweep.grace_s = 0.0
        snap = sweep.poll()
    for name, err in snap.errors.items():
        print(shown(f"failed {os.path.join(given, name)}: {err}"), file=sys.stderr)
    for name, why in sweep.copies.items():
        print(shown(f"note: {os.path.join(given, name)}: {why}"), file=sys.stderr)
    for file, why in (store.index(sweep.dir).refused.items() if store.present(sweep.dir) else ()):
        print(shown(f"not a record: {os.path.join(given, store.STORE, file)}: {why}; no run is done by it"),
              file=sys.stderr)
    if args.wait:
        print(summary_line(sweep.label, snap.counts), flush=True)
    else:
        jobs = Counter(snap.jobs.values())
        tail = f"; jobs: {', '.join(f'{n} {s}' for s, n in sorted(jobs.items()))}" if jobs else ""
        runs = len(sweep.runs) - snap.counts[COPY]
        print(shown(f"sweep {sweep.label}: {runs} runs: {_progress_text(snap.counts)}{tail}"), flush=True)
    return 1 if snap.counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
