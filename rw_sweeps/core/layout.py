"""Where a sweep's runs are: each run's folder, named relative to the sweep folder, for every `hydra.sweep.subdir`.

A run folder is `<sweep>/<subdir>`, and the subdir may be any relative path: Hydra's default `${hydra.job.num}`
(`0`, `1`, …), `p${data.p}`, `${hydra.job.override_dirname}` or `${hydra.job.num}/run` (`0/run`). So a run is
named by its path relative to the sweep folder, `/`-separated (`0/run`), never by its last part (every run
of `${hydra.job.num}/run` is `run`), and every reader of a sweep finds its runs here: the launcher's
placement, status, analysis and the adaptive sweeper's record.

`run_folders` is the union of the names a sweep's record gives (the runs a launch expects, made or not) and
the run folders present: a folder holding one of a run's files (`RUN_FILES`), found at any depth up to
`DEPTH` without entering a run folder, a link or a folder of wandb's; and a numbered folder (a job number)
that holds nothing a run could be below, which is a run not yet started. Links are named, never followed
(`problem` says why such a name is no run). The core owns this so that `analysis`, which imports no sweep
module, finds the runs the launcher made.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from rw_sweeps.core import contract, readers, store

# A folder holding any of these is a run folder (not a folder of run folders): its config and results, the
# checkpoint of a run being trained, and the job files Hydra writes as a job starts.
RUN_FILES = (contract.CONFIG, contract.SUMMARY, contract.CHECKPOINT, contract.HISTORY, ".hydra")
# Folders below a sweep that hold no run however deep they go: wandb's own (its offline runs hold a
# `files/config.yaml` of wandb's) and the project's packed-job and analysis runs.
NOT_RUNS = frozenset({"wandb", "wandb_jobs", "wandb_analysis", "store", "wandb_store"})
DEPTH = 4  # how deep a run folder is looked for where no record names it (`a/b/c/d`: every subdir in use)
LINK = "the run folder is a symbolic link; it is not followed"
NOT_A_FOLDER = "not a folder"


def valid_name(name) -> bool:
    """A run's name as a record may give it: a relative `/`-separated path inside the sweep folder (no `..`, no
    absolute path, no empty part, no NUL), so that nothing named by a planted record lies outside it."""
    if type(name) is not str or not name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def name_of(sweep_dir, run_dir) -> str | None:
    """A run folder's name relative to its sweep folder (`0/run`), or None for a folder outside it."""
    rel = os.path.relpath(os.path.abspath(run_dir), os.path.abspath(sweep_dir))
    name = Path(rel).as_posix()
    return name if valid_name(name) else None


def holds_run(path) -> bool:
    """Does the folder hold one of a run's files (lexists: a planted link counts as there, and is judged)?"""
    return any(os.path.lexists(os.path.join(path, f)) for f in RUN_FILES)


def run_folders(sweep_dir, recorded=(), depth: int = DEPTH) -> list[str]:
    """Every run of the sweep folder by its name (see the module's doc), in `order`: the valid names of
    `recorded` (a record's runs, present or not) and the run folders present."""
    return list(runs(sweep_dir, recorded, depth))


def runs(sweep_dir, recorded=(), depth: int = DEPTH) -> dict[str, str | None]:
    """`run_folders` with each run's `problem` (None: a folder, or nothing there yet), in `order`. The walk
    knows what it met (a folder it saw as one needs no second look), so a reader of every run pays one
    look-up a run, not two."""
    met: dict[str, str | None] = {}
    unstarted: set[str] = set()
    _walk(str(sweep_dir), "", depth, met, unstarted)
    recorded = [n for n in recorded if valid_name(n)]
    if store.present(sweep_dir):  # the runs its store holds have no folder
        stored = [n for n in store.index(sweep_dir).runs if valid_name(n)]
        named = set(recorded)
        recorded = recorded + [n for n in stored if n not in named]
    if recorded:  # a record names the runs: a link, a file or an empty numbered folder it does not name is no run
        named = set(recorded)
        met = {n: why for n, why in met.items() if n in named or (why is None and n not in unstarted)}
    for n in recorded:
        if n not in met:
            # the walk named every job number's entry of the sweep folder that is no folder, or a folder that
            # holds a run or nothing: a job number it did not meet has nothing at its place, or a folder (a
            # store's million names need no look-up each)
            met[n] = None if contract.job_number(n) is not None else problem(sweep_dir, n)
    # a folder that holds a run is no run itself (a link at `0` where the record names `0/run` is named once)
    above = {n[:i] for n in met if "/" in n for i in range(len(n)) if n[i] == "/"}
    return {n: met[n] for n in sorted(met.keys() - above, key=order)}


def _walk(folder: str, prefix: str, depth: int, out: dict, unstarted: set) -> tuple[bool, bool]:
    """Add the runs below `folder` to `out`; (whether one was found, whether `folder` holds a subfolder)."""
    try:
        it = os.scandir(folder)
    except OSError:  # not a folder, gone, unreadable: nothing below it is known
        return False, False
    found = has_sub = False
    with it:
        for e in it:
            if e.name.startswith((".", "_")) or e.name in NOT_RUNS:
                continue
            name = prefix + e.name
            numbered = contract.job_number(e.name) is not None
            try:
                is_dir = e.is_dir(follow_symlinks=False)
                linked_dir = not is_dir and e.is_symlink() and e.is_dir()
            except OSError:
                is_dir = linked_dir = False
            if not is_dir:  # a link, a file or a FIFO at a run's place is named (and judged no run), not entered
                if numbered or linked_dir:
                    out[name] = LINK if e.is_symlink() else NOT_A_FOLDER
                    found = True
                has_sub = has_sub or linked_dir
                continue
            has_sub = True
            if holds_run(e.path):
                out[name] = None
                found = True
                continue
            below, subs = _walk(e.path, name + "/", depth - 1, out, unstarted) if depth > 1 else (False, False)
            if below:
                found = True
            elif numbered and not subs:  # a job's folder with nothing in it yet: a run not yet started
                out[name] = None
                unstarted.add(name)
                found = True
    return found, has_sub


RECORD = ".rw_sweep.json"  # the sweep's record (rw_sweeps.sweeps.status owns its format)


def recorded(sweep_dir) -> list[str]:
    """The valid run names the sweep's record gives (its `runs`), read by the readers' rules; none when there
    is no record or it cannot be read (rw-status says why): for readers that import no sweep module."""
    try:
        rec = readers.read_json(os.path.join(sweep_dir, RECORD), contract.RECORD_CAP, RECORD)
    except (OSError, readers.Broken):
        return []
    names = rec.get("runs") if isinstance(rec, dict) else None
    return [n for n in names if valid_name(n)] if isinstance(names, list) else []


def problem(sweep_dir, name: str) -> str | None:
    """Why the entry `name` of the sweep folder is no run folder that can be read — a link on its path (never
    followed), not a folder, not looked up — or None (a folder, or nothing there yet)."""
    path = str(sweep_dir)
    parts = name.split("/")
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as e:  # a name too long to look up, a folder we may not enter
            return f"cannot be looked up ({e.strerror})"
        if stat.S_ISLNK(mode):
            return LINK if i == len(parts) - 1 else f"{'/'.join(parts[:i + 1])} on its path is a symbolic link; it is not followed"
        if not stat.S_ISDIR(mode):
            return NOT_A_FOLDER
    return None


def order(name: str) -> tuple:
    """Runs in job order part by part (`2` before `10`, `2/run` before `10/run`), other names after, by name."""
    if "/" not in name:  # the default subdir's names, without a generator each
        return ((0, int(name), ""),) if name.isascii() and name.isdigit() else ((1, 0, name),)
    return tuple((0, n, "") if (n := contract.job_number(p)) is not None else (1, 0, p) for p in name.split("/"))
