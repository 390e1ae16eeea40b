"""python -m rw_sweeps.sweeps.wandb_export SWEEP [--workers N] [--mode offline|online] [--force]

Replays a sweep's finished runs (the source of truth: config.yaml, history.jsonl, summary.json, or the record
the sweep's store holds) into one wandb run per training run, the shape `wandb.granularity=run` logs
(`rw_sweeps.sweeps.tracking.replay_run`): id derived from the run's folder, group = the sweep,
job_type=train, the config, the history (x-axis `step`), the summary. A run folder's offline files go into
`<run>/wandb/`; a stored run has no folder (`rw_sweeps.core.store`: a folder made for it would be a run with
no summary), so its go into `<sweep>/wandb_store/<run id>/wandb/` (`STORED_HOME`). Per-run dashboards for a
sweep of any size, without slowing the sweep.

A sweep of more than `EXPORT_ALL` runs is no sweep to browse run by run (a million wandb runs): its export
logs a fixed sample of `SAMPLE` runs (the runs whose names hash lowest: the same runs at every export) and
one wandb run, job_type=cells, in `<sweep>/wandb_store/cells/`, whose `cells` table has a row per cell (the
values of the config keys the sweep varies, the seed and wandb's keys apart): its runs, how many are done
and succeeded (`metrics.succeeded`), and the mean, min and max test_acc of its done runs. It says so in one
line. A stored run is read through the store's verified readers (its head's record and table columns,
`store.body_rows` for its history), as the contract judged it.

Runs already exported (the marker `tracking.EXPORTED` — in the run folder, or in a stored run's
`wandb_store/<run id>/` — names this run id and mode, and the hash of its summary.json as the folder holds it;
per-run logging during a sweep writes it too) are skipped, `--force` redoes them; unfinished runs (no
summary.json) are skipped. N worker processes, each with one wandb service, take contiguous slices of the
runs (a stored run's slice: runs of few shards, each body read once). Prints one line: exported, skipped
(already / unfinished), failed; before it, the first failures, a line each. A run whose wandb run raised, or
any of whose writes of wandb's own logs failed (a full disk), is failed, not marked exported, and exported by
the next call.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

from rw_sweeps.core import contract, readers, results, safefs, store, wandb_io
from rw_sweeps.core.config import canonical
from rw_sweeps.core.errors import one_line
from rw_sweeps.core.metrics import SUCCESS_TOL
from rw_sweeps.core.table import run_row

from . import show, tracking
from .planner import varying

EXPORT_ALL = 10_000  # runs of a sweep exported one wandb run each; above it, a sample and the per-cell table
SAMPLE = 1_000       # runs a larger sweep's export logs (its wandb runs: ~0.15 s each, ~12 files each)
STORED_HOME = "wandb_store"  # <sweep>/wandb_store/: the wandb runs of its stored runs (by run id) and its cells
CELLS = "cells"              # … and the per-cell table's run, in wandb_store/cells/


def run_folders(sweep: Path) -> list[Path]:
    """The sweep's run folders (numbered job folders, or any sub-folder holding a run's config.yaml), in
    job order; a run folder given itself is its own sweep of one."""
    sweep = Path(sweep)
    if (sweep / "config.yaml").exists():
        return [sweep]
    out = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
           and (contract.job_number(p.name) is not None or (p / "config.yaml").exists())]
    return sorted(out, key=lambda p: (contract.job_number(p.name) is None, contract.job_number(p.name) or 0, p.name))


def runs_of(sweep: Path) -> tuple[list[Path], list[str]]:
    """(the sweep's run folders, the names of the runs its store holds that no folder does), each in order
    (a stored run in its shard's order: a slice of them reads few bodies). A folder that holds none of a
    run's files at a stored run's name is not that run's (`show.stored`)."""
    folders = run_folders(Path(sweep))
    if not store.present(sweep):
        return folders, []
    top = set(os.listdir(sweep))  # a stored run whose first part names nothing here has no folder: one listing
    names = [n for n in store.index(sweep).runs if n.split("/", 1)[0] not in top or show.stored(Path(sweep), n)]
    shadowed = set(names)
    return [d for d in folders if d.name not in shadowed or d == Path(sweep)], names


OVERRIDES_CAP = show.OVERRIDES_CAP  # bytes of a job's `.hydra/overrides.yaml` (a list of `key=value` lines)


def _overrides(run_dir: Path) -> list[str] | None:
    """The job's overrides as Hydra recorded them (`.hydra/overrides.yaml`), read as every planted file is
    (`readers`: a regular file within its cap, plain YAML), never through a linked `.hydra`; else None."""
    if (run_dir / ".hydra").is_symlink():
        return None
    try:
        value = readers.read_yaml(run_dir / ".hydra" / "overrides.yaml", OVERRIDES_CAP)
    except (OSError, readers.Broken):
        return None
    return value if isinstance(value, list) and all(isinstance(o, str) for o in value) else None


def names(dirs: list[Path]) -> dict[Path, str]:
    """A wandb name for each run folder whose Hydra job recorded its overrides: its values of the keys the
    sweep varies, as the launcher names a run (`planner.varying`); what a folder whose config.yaml has no
    `wandb.name` (written by an older version) is named by. A stored run's config has its `wandb.name`."""
    jobs = {d: o for d in dirs if (o := _overrides(d)) is not None}
    return {d: tracking.name_of(v) for d, v in zip(jobs, varying(list(jobs.values())))}


# ------------------------------------------------------------------------------------------ one run's entry
def _shaped(verdict: contract.Verdict, history: list[dict], run_dir: Path, home: Path, mode: str,
            name: str = "") -> dict | None:
    """The run as `tracking.replay_run` takes it (its wandb files in `home`), or None when its config names no
    wandb settings; `name`: its wandb name where its config records none."""
    summary, cfg = verdict.summary, verdict.config
    if not isinstance(cfg.get("wandb"), dict):
        return None
    cfg = {**cfg, "wandb": {**cfg["wandb"], "mode": mode}}
    if not cfg["wandb"].get("name") and name:
        cfg["wandb"]["name"] = name
    if not cfg["wandb"].get("group"):
        cfg["wandb"]["group"] = "/".join(run_dir.resolve().parent.parts[-2:])
    return {"cfg": cfg, "run_dir": home, "run_id": results.run_id(run_dir), "history": history, "summary": summary}


def _entry(run_dir: Path, mode: str, name: str = "") -> dict | None:
    """A run folder as `tracking.replay_run` takes it, or None when it is unfinished (or unreadable)."""
    verdict = contract.judge(run_dir)  # the launcher's and analysis's one judgement
    if verdict.state not in contract.STATUSES or not isinstance(verdict.config.get("wandb"), dict):
        return None
    try:
        history = list(contract.rows(run_dir, results.HISTORY))
    except (OSError, readers.Broken):
        history = [] if verdict.summary.get("status") == "failed" else None  # a failed run may have none
    if history is None:
        return None
    return _shaped(verdict, history, run_dir, run_dir, mode, name)


def stored_home(sweep: Path, name: str) -> Path:
    """Where a stored run's wandb files go: `<sweep>/wandb_store/<run id>/` (never its would-be folder)."""
    return Path(sweep) / STORED_HOME / results.run_id(Path(sweep) / name)


def _stored_verdict(sweep: Path, name: str) -> contract.Verdict:
    """The contract's verdict on a stored run, its config as the current schemas state it (as `judge` gives a
    folder's)."""
    v = store.index(sweep).verdict(name)
    return contract.Verdict(v.state, v.summary, canonical(v.config), v.why)


def _summary_sha1(summary: dict) -> str:
    """The hash of the summary.json a stored run's folder would hold (`show.summary_text`)."""
    return hashlib.sha1(show.summary_text(summary).encode()).hexdigest()


def stored_exported(sweep: Path, name: str, mode: str) -> bool:
    """The stored run's marker says it is logged, with this very summary, as its run id in this mode."""
    run_id = results.run_id(Path(sweep) / name)
    try:
        m = readers.read_json(stored_home(sweep, name) / tracking.EXPORTED, tracking.MARKER_CAP)
    except (OSError, readers.Broken):
        return False
    rec = store.index(sweep).record(name)
    return (isinstance(m, dict) and rec is not None and m.get("run") == name and m.get("run_id") == run_id
            and m.get("mode") == mode and m.get("summary_sha1") == _summary_sha1(rec[1]))


def _mark_stored(sweep: Path, name: str, e: dict, mode: str) -> None:
    safefs.atomic_write(stored_home(sweep, name) / tracking.EXPORTED, json.dumps(
        {"run": name, "run_id": e["run_id"], "mode": mode, "summary_sha1": _summary_sha1(e["summary"])}))


# ------------------------------------------------------------------------------------------ the workers
def _replay(e: dict, where: str, errors: list[str]) -> bool:
    """One entry replayed; False (its line in `errors`) if wandb raised or a write of its logs failed."""
    try:
        tracking.replay_run(e)
    except Exception as exc:  # noqa: BLE001 - one bad run never stops the others
        errors.append(f"{where}: {one_line(exc)}")
        wandb_io.said()  # its failed log writes: the error above says this run failed
        return False
    lost = wandb_io.said(lead="", again=None)  # writes of its logs that failed (a full disk): not exported
    if lost is not None:
        errors.append(f"{where}: {lost}")
    return lost is None


def _stored_entries(sweep: Path, names: list[str], mode: str):
    """(name, entry, why) of each stored run, its shard's body read once for the runs of it that follow: the
    entry (None where its config names no wandb settings), or why its body is refused (it does not verify)."""
    idx = store.index(sweep)
    i = 0
    while i < len(names):
        sid = idx.runs[names[i]][0]
        j = i
        while j < len(names) and idx.runs[names[j]][0] == sid:
            j += 1
        group = names[i:j]
        try:
            bodies = store.body_rows(sweep, group)
        except (store.Refused, readers.Broken) as exc:
            why = f"{store.STORE}/{exc.name}: {exc.why}" if isinstance(exc, store.Refused) else exc.why
            for n in group:
                yield n, None, why
        else:
            for n in group:
                yield n, _shaped(_stored_verdict(sweep, n), bodies[n][0], sweep / n, stored_home(sweep, n), mode), None
        i = j


def _export(args: tuple) -> tuple[int, int, int, list[str]]:
    """One worker: its slice of run folders and stored runs → (exported, skipped unfinished, failed, error
    lines)."""
    dirs, sweep, stored_names, mode, named = args
    done = unfinished = failed = 0
    errors: list[str] = []
    for d in dirs:
        e = _entry(Path(d), mode, named.get(d, ""))
        if e is None:
            unfinished += 1
        elif _replay(e, d, errors):
            done += 1
        else:
            failed += 1
    for n, e, why in _stored_entries(Path(sweep), stored_names, mode):
        if why is not None:
            failed += 1
            errors.append(f"{Path(sweep) / n}: {why}")
        elif e is None:
            unfinished += 1  # as a folder whose config names no wandb settings
        elif _replay(e, str(Path(sweep) / n), errors):
            _mark_stored(Path(sweep), n, e, mode)
            done += 1
        else:
            failed += 1
    return done, unfinished, failed, errors


# ------------------------------------------------------------------------------------------ a large sweep
def sample(names: list[str], k: int) -> set[str]:
    """The `k` run names that hash lowest (SHA-1 of the name): the same runs at every export of the sweep,
    spread over its grid as a random draw would be."""
    return set(sorted(names, key=lambda n: hashlib.sha1(n.encode()).digest())[:k])


def _skip_value(key: str) -> bool:
    """Keys that split no cell: the seed (what a cell pools over) and wandb's (where a run is logged)."""
    return key == "seed" or key.startswith("wandb.")


def _hashable(v):
    """A cell's value as a set holds it: null and NaN alike (a head's null, a frame's NaN)."""
    return None if v is None or isinstance(v, float) and v != v else v


def _sources(sweep: Path, folder_rows: list[dict], stored_names: list[str], columns=None):
    """The run rows of the sweep as pandas frames: the folders' rows, then each head's columns (`columns`,
    those it has; all when None) for the stored runs it is the first to hold."""
    import pandas as pd  # pandas and Arrow: only a large sweep's cells need them

    from rw_sweeps.core.store import arrow

    if folder_rows:
        frame = pd.DataFrame(folder_rows)
        yield frame if columns is None else frame[[c for c in columns if c in frame.columns]]
    if not stored_names:
        return
    idx = store.index(sweep)
    wanted = set(stored_names)
    for sid, (raw, meta) in idx.heads.items():
        have = store.shard.read_head(raw, columns=["_run"]).column("_run").to_pylist()
        keep = [n in wanted and idx.runs[n][0] == sid for n in have]
        if not any(keep):
            continue
        present = set(arrow.parquet(raw).schema_arrow.names)
        cols = [c for c in (meta.get("config_keys") or [] if columns is None else columns) if c in present]
        yield arrow.to_pandas(store.shard.read_head(raw, columns=cols))[keep]


def swept(sweep: Path, folder_rows: list[dict], folder_keys: set, stored_names: list[str]) -> list[str]:
    """The config keys whose value differs between runs (a run that lacks a key has it as null), in a run
    row's order; the seed and wandb's keys apart."""
    keys = set(folder_keys)
    if stored_names:
        keys |= {k for _, meta in store.index(sweep).heads.values() for k in meta.get("config_keys") or []}
    seen: dict[str, set] = {}
    for frame in _sources(sweep, folder_rows, stored_names):
        for k in keys:
            values = seen.setdefault(k, set())
            if len(values) < 2:
                values.update(map(_hashable, frame[k].unique()) if k in frame.columns else [None])
    return [k for k in sorted(keys) if len(seen.get(k, ())) > 1 and not _skip_value(k)]


def cell_table(sweep: Path, folder_rows: list[dict], folder_keys: set,
               stored_names: list[str]) -> tuple[list[str], list[list]]:
    """(columns, rows) of the per-cell table: a row per value combination of the swept keys (`swept`), with
    its runs, done and succeeded counts, success rate, and the mean, min and max test_acc of its done runs."""
    import pandas as pd  # pandas: only a sweep above EXPORT_ALL runs has its cells tabled

    keys = swept(sweep, folder_rows, folder_keys, stored_names)
    frames = list(_sources(sweep, folder_rows, stored_names, [*keys, "status", "test_acc", "opt_acc"]))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for c in (*keys, "status", "test_acc", "opt_acc"):
        if c not in df.columns:
            df[c] = None
    done = df["status"] == "done"
    acc, opt = pd.to_numeric(df["test_acc"], errors="coerce"), pd.to_numeric(df["opt_acc"], errors="coerce")
    df = df.assign(_done=done, _success=done & (acc >= opt - SUCCESS_TOL), _acc=acc.where(done))
    by = [df[k].astype(object).where(df[k].notna(), None) for k in keys] or [pd.Series(0, index=df.index)]
    g = df.groupby(by, dropna=False, sort=False).agg(
        runs=("_done", "size"), done=("_done", "sum"), success=("_success", "sum"),
        test_acc_mean=("_acc", "mean"), test_acc_min=("_acc", "min"), test_acc_max=("_acc", "max"))
    cols = [*keys, "runs", "done", "success", "success_rate", "test_acc_mean", "test_acc_min", "test_acc_max"]
    rows = []
    for combo, r in zip(g.index, g.itertuples(index=False)):
        combo = list(combo) if isinstance(combo, tuple) else [combo]
        rows.append([*(_plain(v) for v in combo[:len(keys)]), int(r.runs), int(r.done), int(r.success),
                     int(r.success) / int(r.runs), *(_plain(v) for v in (r.test_acc_mean, r.test_acc_min, r.test_acc_max))])
    return cols, sorted(rows, key=lambda row: [_order(v) for v in row[:len(keys)]])


def _plain(v):
    """A table cell as plain JSON: numpy scalars as Python's, NaN as null."""
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and v != v else v


def _order(v) -> tuple:
    if isinstance(v, (bool, int, float)):
        return (0, float(v), "")
    return (2, 0.0, "") if v is None else (1, 0.0, str(v))


def cells_id(sweep: Path) -> str:
    """Deterministic per sweep folder, so a re-export replaces the cells run, never adds a second."""
    return hashlib.sha1(f"cells:{Path(sweep).resolve()}".encode()).hexdigest()[:16]


def log_cells(sweep: Path, w: dict, mode: str, cols: list[str], rows: list[list], runs: int, logged: int) -> None:
    """The per-cell table as one wandb run, job_type=cells, in `<sweep>/wandb_store/cells/` (its project,
    entity, group and tags those of `w`, a run's wandb settings)."""
    wandb = wandb_io.wandb()
    folder = safefs.owned_dirs(Path(sweep), STORED_HOME, CELLS)
    safefs.owned_dirs(folder, "wandb")
    safefs.owned_dirs(folder, ".wandb_data")
    run_id = cells_id(sweep)
    if mode == "offline":
        wandb_io.drop_partial(folder / "wandb", run_id)
    # the table is staged under WANDB_DATA_DIR: inside the sweep, so that the folder syncs from another machine
    os.environ["WANDB_DATA_DIR"] = str(folder / ".wandb_data")
    keys = cols[:cols.index("runs")]
    run = wandb.init(project=w.get("project") or "rw-sweeps", entity=w.get("entity"),
                     group=w.get("group") or "/".join(Path(sweep).resolve().parts[-2:]), job_type=CELLS,
                     tags=list(w.get("tags") or []), id=run_id, name=f"cells {len(rows)} of {runs} runs",
                     resume="allow", mode=mode, dir=str(folder), reinit="create_new",
                     config={"sweep": str(sweep), "runs": runs, "cells": len(rows), "swept": keys, "logged": logged},
                     settings=wandb.Settings(**wandb_io.SETTINGS))
    try:
        run.log({CELLS: wandb_io.table(cols, rows)})
        run.summary.update({"runs": runs, "cells": len(rows), "logged": logged})
    finally:
        run.finish()
        wandb_io.readable(folder / ".wandb_data")


def _folder_rows(dirs: list[Path]) -> tuple[list[dict], set, dict | None]:
    """The finished run folders' rows (`table.run_row`), their config keys, and a run's wandb settings."""
    rows, keys, w = [], set(), None
    for d in dirs:
        v = contract.judge(d)
        if v.state in contract.STATUSES:
            row, k = run_row(v.config, v.summary)
            rows.append(row)
            keys |= k
            w = w or v.config.get("wandb")
    return rows, keys, w


def _cells(sweep: Path, dirs: list[Path], stored_names: list[str], mode: str, logged: int, counts: dict) -> None:
    """The per-cell table of a large sweep, logged (`log_cells`); a failure is counted and said."""
    try:
        rows, keys, w = _folder_rows(dirs)
        if w is None and stored_names:
            w = store.index(sweep).record(stored_names[0])[0].get("wandb")
        cols, table = cell_table(Path(sweep), rows, keys, stored_names)
        counts["cells"] = (len(table), cols[:cols.index("runs")])
        log_cells(Path(sweep), w if isinstance(w, dict) else {}, mode, cols, table, len(dirs) + len(stored_names), logged)
    except Exception as exc:  # noqa: BLE001 - the sample's runs are logged whatever this does
        counts["failed"] += 1
        counts["errors"].append(f"{Path(sweep) / STORED_HOME / CELLS}: {one_line(exc)}")
    wandb_io.said()


# ------------------------------------------------------------------------------------------ the export
def export(sweep: Path, workers: int = 2, mode: str = "offline", force: bool = False) -> dict:
    """Export the sweep's finished runs (a sample and the per-cell table above EXPORT_ALL runs); returns the
    counts (exported, skipped, unfinished, failed, errors; and `sampled`: (runs, sample) and `cells`: (how
    many, the swept keys) for a large sweep)."""
    sweep = Path(sweep)
    dirs, stored_names = runs_of(sweep)
    every_dir, every_stored = dirs, stored_names
    total = len(dirs) + len(stored_names)
    counts = {"exported": 0, "skipped": 0, "unfinished": 0, "failed": 0, "errors": []}
    if total > EXPORT_ALL:
        chosen = sample([str(d.relative_to(sweep)) for d in dirs] + stored_names, SAMPLE)
        dirs = [d for d in dirs if str(d.relative_to(sweep)) in chosen]
        stored_names = [n for n in stored_names if n in chosen]
        counts["sampled"] = (total, len(chosen))
    todo = [d for d in dirs if force or not tracking.is_exported(d, results.run_id(d), mode)]
    todo_stored = [n for n in stored_names if force or not stored_exported(sweep, n, mode)]
    counts["skipped"] = len(dirs) - len(todo) + len(stored_names) - len(todo_stored)
    if todo or todo_stored:
        named = {str(d): n for d, n in names(every_dir).items()} if todo else {}  # over the whole sweep: what varies in it
        for done, unfinished, failed, errors in _run_workers(sweep, todo, todo_stored, workers, mode, named):
            counts["exported"] += done
            counts["unfinished"] += unfinished
            counts["failed"] += failed
            counts["errors"] += errors
    if "sampled" in counts:
        _cells(sweep, every_dir, every_stored, mode, counts["sampled"][1], counts)
    return counts


def _run_workers(sweep: Path, dirs: list[Path], stored_names: list[str], workers: int, mode: str, named: dict):
    """Each worker's counts: contiguous slices of the folders, then of the stored runs (in shard order)."""
    items = [("dir", str(d)) for d in dirs] + [("stored", n) for n in stored_names]
    n = max(1, min(workers, len(items)))
    size = -(-len(items) // n)
    slices = [([w for k, w in part if k == "dir"], str(sweep), [w for k, w in part if k == "stored"], mode, named)
              for part in (items[i:i + size] for i in range(0, len(items), size))]
    if len(slices) == 1:
        return [_export(slices[0])]
    with mp.get_context("spawn").Pool(len(slices)) as pool:  # spawn: wandb's service and threads do not survive a fork
        return pool.map(_export, slices, chunksize=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rw_sweeps.sweeps.wandb_export",
                                 description="Replay a sweep's finished runs into one wandb run per training run.")
    ap.add_argument("sweep", type=Path, metavar="SWEEP", help="the sweep folder (hydra.sweep.dir) or a run folder")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--mode", default="offline", choices=["offline", "online"],
                    help="offline (default; `wandb sync` uploads later) or online")
    ap.add_argument("--force", action="store_true", help="export again the runs already exported")
    args = ap.parse_args(argv)
    if not args.sweep.is_dir():
        ap.error(f"not a folder: {args.sweep}")
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    c = export(args.sweep, args.workers, args.mode, args.force)
    if "sampled" in c:
        cells, keys = c.get("cells", (0, []))
        print(f"wandb export {args.sweep}: {c['sampled'][0]:,} runs, above {EXPORT_ALL:,}: {c['sampled'][1]:,} of "
              f"them logged (a fixed sample, the same at every export) and the table of its {cells:,} cells "
              f"({', '.join(keys) or 'one setting'}) in {args.sweep / STORED_HOME / CELLS}", flush=True)
    for line in c["errors"][:5]:
        print(f"failed {line}", file=sys.stderr)
    refused = store.index(args.sweep).refused if store.present(args.sweep) else {}
    for file, why in refused.items():  # its runs are no record: not exported, and the export says so
        print(f"not a record: {args.sweep / store.STORE / file}: {why}; no run is exported from it", file=sys.stderr)
    print(f"wandb export {args.sweep}: {c['exported']} exported, {c['skipped'] + c['unfinished']} skipped "
          f"({c['skipped']} already exported, {c['unfinished']} unfinished), {c['failed']} failed", flush=True)
    return 1 if c["failed"] or refused else 0


if __name__ == "__main__":
    sys.exit(main())
