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
import os
import sys
from collections import Counter
from pathlib import Path

from rw_sweeps.core import contract, store
from rw_sweeps.core.console import counted, prog, shown
from rw_sweeps.core.readers import Broken

from .record import STATE
from .sweep import COPY, GRACE_S, Sweep, progress_text, summary_line


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
        print(shown(f"sweep {sweep.label}: {counted(runs, 'run')}: {progress_text(snap.counts)}{tail}"), flush=True)
    return 1 if snap.counts["failed"] else 0

