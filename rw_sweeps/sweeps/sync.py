"""python -m rw_sweeps.sweeps.sync SWEEP [--dry-run] [--include-synced] [-p PROJECT] [-e ENTITY]

Uploads every offline wandb run of a sweep with wandb's own `wandb sync`. A sweep's offline runs sit where
each wrote them: `<run>/wandb/offline-run-*` (one per training run, at any depth under `hydra.sweep.subdir`),
`<sweep>/wandb_jobs/<id>/wandb/offline-run-*` (packed jobs) and `<sweep>/wandb_analysis/wandb/offline-run-*`
(the analysis run), which `wandb sync SWEEP` does not look for (it reads one `wandb/` folder). This finds
them all and hands them to `wandb sync` (its CLI, as a user runs it, in batches of `BATCH` paths, so that no
command line outgrows the system's limit); `--dry-run` is wandb's own, which lists what it would upload and
uploads nothing. Runs `wandb sync` marked synced are skipped unless `--include-synced`, as in wandb.

Nothing under a link is followed. The walk never enters a symbolic link (the project refuses links in every
folder it writes), and a run whose folder holds one — its uploads are read from there: its `files/`, the
job's staged artifacts, the report's figures — is not synced: each is one line, `not synced: <path>: <why>`.
The links wandb makes itself (`wandb/latest-run`, `wandb/debug.log`, `wandb/debug-internal.log`, the
`logs/` of an offline run), which `wandb sync` does not upload, are passed over.

A sweep whose runs its store holds (`rw_sweeps.core.store`: no folder per run) has their offline runs in
`<sweep>/wandb_store/<run id>/wandb/` and, above `wandb_export.EXPORT_ALL` runs, its per-cell table's in
`<sweep>/wandb_store/cells/wandb/` (`rw_sweeps.sweeps.wandb_export` writes both); the walk finds them as any
other. For such a sweep one more line says how many of the runs its store holds (read through its verified
index) have an offline wandb run here: `wandb_export` logs the others (a sample, above `EXPORT_ALL`).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from rw_sweeps.core import results, store
from rw_sweeps.sweeps.wandb_export import EXPORT_ALL, SAMPLE
from rw_sweeps.sweeps.status import shown  # a planted name's control characters, as rw-status prints them

BATCH = 256  # offline runs per `wandb sync` command (a path is ~100 bytes; ARG_MAX is 128 KiB at the least)
WANDB_LINKS = frozenset({"latest-run", "debug.log", "debug-internal.log"})  # wandb's own, in a `wandb/` folder


def _links_inside(run: Path) -> list[str]:
    """The links in an offline run folder other than its `logs/` (wandb's own log links, never uploaded)."""
    found, stack = [], [run]
    while stack:
        folder = stack.pop()
        for e in os.scandir(folder):
            if e.is_symlink():
                if not (folder == run / "logs"):
                    found.append(e.path)
            elif e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
    return found


def offline_runs(sweep: Path) -> tuple[list[Path], list[str]]:
    """(the sweep's offline wandb run folders, in path order; a line for each link not followed and each run
    not synced because of one). The walk never follows a link."""
    sweep = Path(sweep)
    runs: list[Path] = []
    links: list[str] = []  # every link met outside wandb's own
    unread: list[str] = []
    stack = [sweep]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            unread.append(f"not read: {folder}: {exc.strerror or exc}")
            continue
        for e in entries:
            path = Path(e.path)
            if e.is_symlink():
                if not (folder.name == "wandb" and e.name in WANDB_LINKS):
                    links.append(str(path))
            elif not e.is_dir(follow_symlinks=False):
                continue
            elif folder.name == "wandb" and e.name.startswith("offline-run-"):
                runs.append(path)  # its own files are checked below; nothing in it is a sweep's folder
            else:
                stack.append(path)
    lines = [f"not followed: {link}: a symbolic link" for link in sorted(links)] + unread
    ok = []
    for run in sorted(runs):
        home = run.parent.parent  # the folder the run was logged from: its uploads are read from under it
        planted = [link for link in links if Path(link).is_relative_to(home)]
        try:
            planted += _links_inside(run)
        except OSError as exc:
            planted.append(f"{run}: {exc.strerror or exc}")
        if planted:
            lines.append(f"not synced: {run}: a symbolic link in its folder ({planted[0]})")
        else:
            ok.append(run)
    return ok, lines


def stored_logged(sweep: Path, runs: list[Path]) -> tuple[int, int] | None:
    """(the runs the sweep's store holds, how many of them have one of the offline runs `runs`, which end in
    their wandb id: `results.run_id` of the run's would-be folder), or None for a sweep without a store."""
    if not store.present(sweep):
        return None
    ids = {r.name.rsplit("-", 1)[-1] for r in runs}
    names = store.index(sweep).runs
    return len(names), sum(results.run_id(Path(sweep) / n) in ids for n in names)


def wandb_sync(runs: list[Path], flags: list[str]) -> int:
    """`wandb sync FLAGS RUN…` in batches, every batch whatever the others did; the first non-zero exit
    status, else 0. wandb prints as it goes."""
    status = 0
    for i in range(0, len(runs), BATCH):
        cmd = [sys.executable, "-m", "wandb", "sync", *flags, "--", *map(str, runs[i:i + BATCH])]  # `--`: a folder named -x is a path
        code = subprocess.run(cmd).returncode
        status = status or code
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rw_sweeps.sweeps.sync",
                                 description="Upload every offline wandb run of a sweep (wandb sync).")
    ap.add_argument("sweep", type=Path, metavar="SWEEP", help="the sweep folder (hydra.sweep.dir) or a run folder")
    ap.add_argument("--dry-run", action="store_true", help="wandb sync's own: list what it would upload, upload nothing")
    ap.add_argument("--include-synced", action="store_true", help="upload runs wandb sync has marked synced, again")
    ap.add_argument("-p", "--project", help="wandb sync's: the project of every run uploaded")
    ap.add_argument("-e", "--entity", help="wandb sync's: the entity of every run uploaded")
    args = ap.parse_args(argv)
    if args.sweep.is_symlink():
        ap.error(f"{shown(args.sweep)} is a symbolic link; not followed")
    if not args.sweep.is_dir():
        ap.error(f"not a folder: {shown(args.sweep)}")
    runs, lines = offline_runs(args.sweep)
    for line in lines:
        print(shown(line), flush=True)
    refused = sum(ln.startswith("not synced") for ln in lines)
    print(f"sync {shown(args.sweep)}: {len(runs)} offline wandb run(s) to wandb sync"
          + (f", {refused} not synced (a link in its folder)" if refused else ""), flush=True)
    held = stored_logged(args.sweep, runs)
    if held is not None:
        print(f"sync {shown(args.sweep)}: its store holds {held[0]:,} run(s), {held[1]:,} of them with an offline "
              f"wandb run here (python -m rw_sweeps.sweeps.wandb_export {shown(args.sweep)} logs the others; a sweep "
              f"above {EXPORT_ALL:,} runs, a sample of {SAMPLE:,})", flush=True)
    flags = (["--dry-run"] if args.dry_run else []) + (["--include-synced"] if args.include_synced else []) \
        + (["--project", args.project] if args.project else []) + (["--entity", args.entity] if args.entity else [])
    status = wandb_sync(runs, flags) if runs else 0
    return status or (1 if lines else 0)  # a link, a run not synced or a folder not read: not all is uploaded


if __name__ == "__main__":
    sys.exit(main())
