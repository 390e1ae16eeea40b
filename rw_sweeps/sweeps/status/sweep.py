"""Where a sweep stands: every run of its folder classified (`Sweep.poll`: done, skipped, failed, diverged,
unfinished, a copy, running or pending) from the contract's verdict of its folder, the launcher's record and
the scheduler's answers, followed to its end (`Sweep.follow`), and the line that ends a sweep (`summary_line`)."""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rw_sweeps.core import contract, layout, results, store
from rw_sweeps.core.console import counted, shown

from .record import fingerprint, read_record
from .scheduler import PENDING, RUNNING, job_states

FINAL = ("done", "skipped", "failed", "diverged")
# A run of the sweep folder that no summary finishes and the last launch does not train (an earlier launch
# was stopped): final too, as nothing running will change it; a relaunch trains it.
UNFINISHED = "unfinished"
# A folder holding a copy of a run counted already (a backup `cp -a 0 X`: it carries that run's run_id)
COPY = "copy"
DONE_WITH = (*FINAL, UNFINISHED, COPY)  # the states no running job changes
GRACE_S = 15.0  # how long an ended job's summaries may take to show up (shared file systems cache lookups)




def summary_line(label: str, counts: Counter) -> str:
    """The one line that ends every sweep, blocking or followed (with the runs of earlier launches that no
    launch finished, where a followed sweep folder holds any)."""
    left = f", {counts[UNFINISHED]} {UNFINISHED}" if counts[UNFINISHED] else ""
    return (f"sweep {shown(label)}: {counted(sum(counts[k] for k in (*FINAL, UNFINISHED)), 'run')}: {counts['done']} done, "
            f"{counts['skipped']} skipped, {counts['failed']} failed, {counts['diverged']} diverged{left}")


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
        return job_states(self.record)

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
                    line = progress_text(snap.counts)
                    if line != last_line and (snap.finished or now - last_print >= 10):
                        print(f"[status] {n_final}/{len(self.runs)} finished: {line}", file=sys.stderr, flush=True)
                        last_line, last_print = line, now
                if snap.finished:
                    return snap
                time.sleep(min(1.0, interval))
        finally:
            if bar is not None:
                bar.close()


def _short_text(c: Counter) -> str:
    """For the progress bar: what is moving, and any trouble."""
    parts = [f"{c['running']} running", f"{c['pending']} pending"]
    parts += [f"{c[k]} {k}" for k in ("skipped", "failed", "diverged") if c[k]]
    return ", ".join(parts)


def progress_text(c: Counter) -> str:
    left = f", {c[UNFINISHED]} {UNFINISHED}" if c[UNFINISHED] else ""
    left += f", {c[COPY]} {'copies' if c[COPY] > 1 else COPY} not counted" if c[COPY] else ""
    return (f"{c['done']} done, {c['skipped']} skipped, {c['failed']} failed, {c['diverged']} diverged, "
            f"{c['running']} running, {c['pending']} pending{left}")
