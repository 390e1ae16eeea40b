"""Sweep and run folders -> one tidy table (one row per run), per the README's results contract.

Every run folder is judged by the contract's one function (`rw_sweeps.core.contract.judge`), the same the
launcher skips by, so a run is `done` here exactly when a relaunch would skip it; the training code is
never imported. Each sweep is consolidated into `<sweep>/runs.parquet`, sealed with the user's key
(`rw_sweeps.core.seal`) and trusted row by row only where the run's files still hash to what the row was
built from: a warm load reads and hashes the files, and parses none of them. A sweep with a store
(`rw_sweeps.core.store`) needs no cache: its verified heads are the table, read column by column, and a
stored run's history is read from its shard's body alone.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import sys
import typing
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from rw_sweeps.core import contract, layout, readers, seal, store
from rw_sweeps.core.config import RunConfig, WandbConfig, canonical   # (importing it registers every option)
from rw_sweeps.core.registry import GROUPS, OPTIONS
from rw_sweeps.core.console import shown
from rw_sweeps.core.errors import one_line
from rw_sweeps.core import results, safefs
from rw_sweeps.core.safefs import atomic_write, write_with
from rw_sweeps.core.store import arrow, shard
from rw_sweeps.core.table import ECHOED, LEGACY_NORMALIZE, flatten_config, run_row  # noqa: F401 - the row's owner

CACHE_NAME = "runs.parquet"
SEAL_NAME = ".runs.parquet.seal"   # the cache's seal (rw_sweeps.core.seal), beside it
CACHE_VERSION = 5   # bump when the row format changes: old caches are then rebuilt
CACHE_CAP = 256 << 20  # bytes (100,000 runs cache in ~30 MB): a larger file is not read, the cache is rebuilt
_META_KEY = b"rw_sweeps.analysis"
_BOOK = ["_run", "_digest"]   # cache-only columns: the run's folder name, the digest of its files
# a run the sweep's record names that has neither a folder nor a verified record in its store
NOT_STORED = "no run folder, and no record in the sweep's store that verifies: not trained yet, or its shard refused"


def load_runs(*paths, refresh: bool = False, progress: bool | None = None,
              cache: bool = True, columns=None) -> pd.DataFrame:
    """Load sweep folders and/or single run folders into one DataFrame, one row per run.

    Columns: every config key under its dotted name (`data.p`, `init.sigma`, `optim.lr`, ...),
    `init` = the chosen init's name, every summary.json field, and `path` (the run folder),
    `sweep` (its sweep folder, or the run folder itself for a single run), `run` (folder name).
    Folders without a usable summary are not rows; they are listed in `df.attrs["skipped"]`
    as {path, status: unfinished|corrupt, reason}. `df.attrs["config_keys"]` names the config
    columns. `progress=None` shows a tqdm bar only on a terminal.

    A sweep's stored runs (`rw_sweeps.core.store`) are rows alike, read from its verified heads; a shard file
    the store refuses is skipped as corrupt, naming the file. `columns`: the columns to keep (None: all; a
    name no run has is left out), besides `path`, `sweep` and `run`; for stored runs only those are read.
    """
    want = None if columns is None else set(columns) | set(_BOOK) | {"_run"}
    frames, skipped, config_keys = [], [], set()
    for p in _flatten_args(paths):
        p = Path(p).resolve()
        if not p.is_dir():
            raise FileNotFoundError(f"no such folder: {p}")
        if _is_run_dir(p):
            row, cfg_keys, problem = _read_run(p)
            if problem:
                skipped.append(problem)
                continue
            row.update(path=str(p), sweep=str(p), run=p.name)
            frames.append(pd.DataFrame([row]))
            config_keys |= cfg_keys
        else:
            df, skip, cfg_keys = _load_sweep(p, refresh=refresh, progress=progress, cache=cache, want=want)
            frames.append(df)
            skipped += skip
            config_keys |= cfg_keys
    frames = [f for f in frames if len(f)]
    df = (frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True, sort=False) if frames
          else pd.DataFrame())
    if want is not None and len(df):
        _warn_missing(columns, df.columns, "load_runs", stacklevel=3)
        df = df[[c for c in df.columns if c in want or c in ("path", "sweep", "run")]]
        config_keys &= want
    if not len(df):   # the CLI's "no finished runs" line; a warning, as a sweep not trained yet is no mistake
        warnings.warn(f"load_runs: no finished runs in {' '.join(str(p) for p in _flatten_args(paths))} "
                      f"({len(skipped)} folders skipped: see attrs['skipped'])", stacklevel=2)
    if len(df):
        if len(frames) > 1:
            df = df.drop_duplicates("path", ignore_index=True)   # a run given twice (sweep + run)
        for k in INT_FIELDS:   # a step that can be null (never broke, not locked): an integer or <NA>
            if k in df.columns and df[k].dtype.kind in "fiO":
                v = pd.to_numeric(df[k], errors="coerce")
                if bool((v.dropna() % 1 == 0).all()):
                    df[k] = v.astype("Int64")
        for k in BOOL_FIELDS:  # a flag some summaries lack (`trap`: eq. 2.1's, not gpt's): True, False or <NA>
            if k in df.columns and str(df[k].dtype) != "boolean" and df[k].dtype.kind in "bO" \
                    and _only(df[k], "boolean"):
                df[k] = df[k].astype("boolean")
        for k in TEXT_FIELDS:  # text even where no run of the load has one (`error` of done runs): `.str` works
            if k in df.columns and str(df[k].dtype) != "str" and _only(df[k], "string"):
                df[k] = df[k].astype("str")
        df = _schema_typed(df, config_keys)
        if "init.sigma" in df.columns and "init" in df.columns:
            # zero init is the σ = 0 point of the σ axis (V = W = 0, `phase.zero_init`): a groupby on σ keeps
            # its runs; `has_key` still says σ is no key of its option
            df["init.sigma"] = df["init.sigma"].where(df["init"] != "zero", 0.0)
    df.attrs = {"config_keys": Shared(sorted(config_keys)), "skipped": Shared(skipped)}
    return df


def _only(values: pd.Series, kind: str) -> bool:
    """Are the column's values, nulls (None, NaN, <NA>) aside, all of `kind` ("boolean", "string"), or none there
    at all? Asked of a million stored runs' column at C speed (`infer_dtype`), never a call per value."""
    return pd.api.types.infer_dtype(values, skipna=True) in (kind, "empty")


class Shared(list):
    """A list in `DataFrame.attrs` that pandas shares instead of deep-copying: pandas deep-copies `attrs` into the
    result of every operation (`NDFrame.__finalize__`), and the list of every config key and skipped folder
    copied that way cost the report ~20 % of its time. It equals, compares and reads as the list it is; it is
    shared by the frames derived from one load (change a copy, not it), and pickles as a plain list."""

    def __deepcopy__(self, memo) -> "Shared":
        return self

    def __reduce__(self):
        return list, (list(self),)


def config_keys(df: pd.DataFrame) -> list[str]:
    """The config columns of a loaded table (also after a round trip through Parquet)."""
    keys = df.attrs.get("config_keys")
    if keys is None:   # a frame built by hand: dotted names and the contract's top-level keys
        top = {"init", "seed", "precision", "eval_every", "snapshot_steps", "checkpoint_every",
               "experiment"}
        keys = [c for c in df.columns if "." in c or c in top]
    return [k for k in keys if k in df.columns]


def load_history(runs, columns=None) -> pd.DataFrame:
    """Long-form histories: one row per (run, evaluated step) with the history's metrics.

    `runs` is a loaded table (its `columns`, e.g. ["data.p", "seed"], are copied onto every
    row, ready for seaborn's hue/style; a name the table lacks is a warning naming it), or folders: a path
    or a list of them, each a run folder (also one still being written) or a sweep folder (its runs as
    `load_runs` reads them); a folder that is not there is an error. Unreadable lines are skipped:
    a run still being written must not break a plot. A stored run (no folder; its sweep's store
    holds it) is read from its shard's body, each body once; a body that does not verify is a
    warning naming the file, and its runs have no rows.
    """
    frames = []
    for path, extra, (rows, _) in _run_rows(_as_runs(runs, columns, "load_history"), columns, contract.HISTORY):
        if rows:
            frames.append(pd.DataFrame(rows).assign(path=path, **extra))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_snapshots(runs, columns=None) -> pd.DataFrame:
    """Long-form snapshots: one row per (run, snapshot step); `V`, `A`, `attention`,
    `h_example`, `h_var` become numpy arrays (None where the run stored null). Stored runs as
    `load_history` reads them."""
    frames = []
    for path, extra, (_, rows) in _run_rows(_as_runs(runs, columns, "load_snapshots"), columns, contract.SNAPSHOTS):
        for r in rows:
            for k in ("V", "A", "attention", "h_example", "h_var"):
                if r.get(k) is not None:
                    r[k] = np.asarray(r[k], dtype=float)
        if rows:
            frames.append(pd.DataFrame(rows).assign(path=path, **extra))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _run_rows(runs, columns, name: str):
    """(path, extra columns, (history rows, snapshot rows)) of each run in order: a folder's file `name` read
    as always (the other list empty), a stored run's both from its body (`stored_rows`)."""
    items = list(_iter_runs(runs, columns))
    stored = dict(stored_rows([(path, where) for path, where, _ in items]))
    for path, _, extra in items:
        if path in stored:
            yield path, extra, stored.pop(path)
        else:   # a folder (or nothing: a stored run whose body was refused reads as no file)
            rows = list(_read_jsonl(Path(path) / name))
            yield path, extra, (rows, rows)


def stored_rows(runs):
    """(path, (history rows, snapshot rows)) of each of `runs` — (path, (sweep, name) or None: where its store
    holds it, if known) — that a sweep's store holds and no folder does, shard by shard: each body is read once
    (`store.body_rows`), and a shard's runs are yielded before the next body is read. A body that does not
    verify is a warning naming its file; a run whose text breaks its caps is a warning naming the run: their
    runs are not yielded."""
    by_shard: dict[tuple[str, str], dict[str, str]] = {}
    indexes: dict[str, store.Index | None] = {}   # by sweep: its store's, once per call
    for path, where in runs:
        if store.has_folder(path):  # a folder: read as a folder
            continue
        where = where or store.sweep_of(path)
        if where is None:
            continue
        if where[0] not in indexes:
            indexes[where[0]] = store.index(where[0], bodies=False) if store.present(where[0]) else None
        index = indexes[where[0]]
        held = index.runs.get(where[1]) if index is not None else None
        if held is not None:
            by_shard.setdefault((index.sweep, held[0]), {})[where[1]] = path
    for (sweep, sid), names in by_shard.items():
        for name, rows in _bodies(sweep, sid, list(names)).items():
            yield names[name], rows


def _bodies(sweep: str, sid: str, names: list[str]) -> dict:
    """`store.body_rows` of one shard's runs; a refused body (a warning) reads as none, and a run whose rows
    break the contract's caps (a warning) is left out, the others read one by one."""
    try:
        got = store.body_rows(sweep, names)
    except store.Refused as e:
        warnings.warn(f"skipping {len(names)} stored run(s): {Path(sweep, store.STORE, e.name)}: {e.why}")
        return {}
    except readers.Broken as e:
        if len(names) == 1:
            warnings.warn(f"skipping the stored run {Path(sweep, names[0])}: {e.why}")
            return {}
        return {k: v for n in names for k, v in _bodies(sweep, sid, [n]).items()}
    if len(got) < len(names):   # the index body_rows reads by refused the shard (its body hashed otherwise)
        file = sid + shard.BODY
        why = store.index(sweep).refused.get(file) or "not in the sweep's store any more"
        warnings.warn(f"skipping {len(names) - len(got)} stored run(s): {Path(sweep, store.STORE, file)}: {why}")
    return got


# ---------------------------------------------------------------------------------------------
# one sweep, through its Parquet cache

def _load_sweep(sweep: Path, refresh: bool, progress, cache: bool, want: set | None = None):
    try:  # its files are read, and its cache written, through the sweep folder's handle
        safefs.hold(sweep, create=False)
    except OSError:
        pass  # a link given as the sweep (the user's own choice) or a missing one: reached by path, as given
    # the table is the heads', of the shards the contract finds whole (each head sealed, its body hashed against
    # it), as the launcher and rw-status find them
    index = store.index(sweep) if store.present(sweep) else None
    recorded = layout.recorded(sweep)
    if index is None or _may_hold_runs(sweep):  # at every depth hydra.sweep.subdir puts them (`0/run`)
        names = layout.runs(sweep, recorded)
        folders = _held_as_folders(sweep, index)
    else:  # no run folder to walk: the store's runs, and the record's others not there yet
        names = {n: None for n in sorted((n for n in recorded if n not in index.runs), key=_run_order)}
        folders = set()
    if index is not None:  # a stored run has no folder: its row is its head's; a folder there is the run (`judge`)
        names = {n: why for n, why in names.items() if n not in index.runs or n in folders}
    # a store sweep's table is its heads: no cache is written there (its few run folders are read, or a cache
    # an earlier version wrote is used)
    df, skipped, config_keys = _folder_rows(sweep, names, refresh, progress, cache, stored=index is not None)
    if index is not None:
        table, skips, keys = _stored_rows(sweep, index, want, folders)
        skipped += skips
        config_keys |= keys
        if table.num_rows:
            stored = arrow.to_pandas(table)
            df = pd.concat([df, stored], ignore_index=True, sort=False) if len(df) else stored
    if len(df):
        df = df.iloc[_run_order_of(df["_run"])].reset_index(drop=True)
        df["path"] = str(sweep) + os.sep + df["_run"]
        df["sweep"] = str(sweep)
        df["run"] = df.pop("_run")
        df = df.drop(columns=[c for c in _BOOK if c in df.columns])
        df, copies = _without_copies(df)
        skipped += copies
    return df, skipped, config_keys


def _folder_rows(sweep: Path, names: dict, refresh: bool, progress, cache: bool, stored: bool):
    """The rows of the sweep's run folders `names` (name -> problem), through the sweep's Parquet cache
    (never written in a sweep with a store: `stored`), each with `_run`; the folders skipped; the config keys."""
    cached, meta = (pd.DataFrame(), {}) if refresh or not cache else _read_cache(sweep)
    # run folder -> (its row in the cache, the digest of the files that row was read from)
    known = ({r: (i, d) for i, (r, d) in enumerate(zip(cached["_run"].tolist(), cached["_digest"].tolist()))}
             if len(cached) else {})
    keep, todo, skipped = [], [], []
    for name, why in names.items():
        path = os.path.join(sweep, name)
        if why is not None:  # a link on its path (never followed), a file at a run's place
            skipped.append(_skip(path, "corrupt", why))
            continue
        try:
            digest = _digest(path)
        except readers.Broken:
            # a file the key cannot hash within its caps (one the judge may never read: a failed run's
            # snapshots): the judge alone decides, every time, and the row is never taken from the cache
            digest = ""
        if digest is None:                 # a numbered job folder with nothing in it yet
            skipped.append(_skip(path, "unfinished", NOT_STORED if stored and not store.has_folder(path)
                                 else "no config.yaml or summary.json"))
            continue
        i, old = known.get(name, (None, None))
        if digest and old == digest:
            keep.append(i)
        else:
            todo.append((name, digest))

    new_rows, config_keys = [], set(meta.get("config_keys", []))
    bar = tqdm(todo, desc=f"reading {shown(sweep.name)}", unit="run", disable=_quiet(progress, len(todo)))
    for name, digest in bar:
        row, cfg_keys, problem = _read_run(Path(sweep, name))
        if problem:
            skipped.append(problem)
            continue
        row.update(_run=name, _digest=digest)
        new_rows.append(row)
        config_keys |= cfg_keys

    parts = [cached.iloc[keep]] if keep else []
    if new_rows:
        parts.append(pd.DataFrame(new_rows))
    df = pd.concat(parts, ignore_index=True, sort=False) if parts else pd.DataFrame()
    changed = bool(new_rows) or len(keep) != len(cached)
    if cache and not stored and changed:
        _write_cache(sweep, df, sorted(config_keys))
    return df, skipped, config_keys


# ---------------------------------------------------------------------------------------------
# a sweep's store: its heads are the table

def _may_hold_runs(sweep: Path) -> bool:
    """Has the sweep folder an entry the walk of `layout.runs` would look at: a folder or a link, or a file at
    a job's number? A store sweep without one has no run folder, and its million stored runs need no look-up
    each (`layout.runs` asks for every name it is given)."""
    try:
        with os.scandir(sweep) as it:
            for e in it:
                if e.name.startswith((".", "_")) or e.name in layout.NOT_RUNS:
                    continue
                if e.is_dir(follow_symlinks=False) or e.is_symlink() or contract.job_number(e.name) is not None:
                    return True
    except OSError:
        return True
    return False


def _held_as_folders(sweep: Path, index) -> set[str]:
    """The stored runs that also have a folder (an older launch's, or a copy): `contract.judge` reads the
    folder, and so does the table. One listing of the sweep answers for every run whose first part is not
    in it, so a million stored runs cost no look-up each."""
    if index is None:
        return set()
    try:
        top = set(os.listdir(sweep))
    except OSError:
        return set()
    return {n for n in index.runs if n.partition("/")[0] in top and store.has_folder(os.path.join(sweep, n))}


def _stored_rows(sweep: Path, index, want: set | None, folders: set) -> tuple[pa.Table, list, set]:
    """The stored runs' rows as one Arrow table (`_run` and the runs table's columns; `want`: a selection, read
    alone), the store's refused files (corrupt) and its runs held twice (copies), and the config keys the
    heads name. A run held twice is read from the head the index chose; a run with a folder, from the folder."""
    skipped = [_skip(Path(sweep, store.STORE, f), "corrupt", why) for f, why in sorted(index.refused.items())]
    skipped += [_skip(Path(sweep, run), "copy", f"held by {len(sids)} shards of the store ({', '.join(sids)}); "
                                               f"read from {index.runs[run][0]}, counted once")
                for run, sids in index.duplicates.items() if run not in folders]

    def read(sid: str) -> pa.Table:
        raw = index.heads[sid][0]
        have = arrow.parquet(raw).schema_arrow.names
        t = shard.read_head(raw, columns=[c for c in have if c == "_run" or (
            c not in shard.BOOK and (want is None or c in want))])
        if folders or index.duplicates:   # only the rows this head holds for the table
            runs = t.column("_run").to_pylist()
            t = t.filter(pa.array([index.runs.get(r, ("",))[0] == sid and r not in folders for r in runs]))
        return t

    # Arrow decodes without the GIL: the heads are read side by side, one per core
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        tables = [t for t in pool.map(read, index.heads) if t.num_rows]
    keys = {k for sid, (_, meta) in index.heads.items() for k in meta.get("config_keys", ())}
    if not tables:
        return pa.table({"_run": pa.array([], pa.string())}), skipped, keys
    # the heads in the order of their first run: columns first met in an earlier run come first, as a
    # folder sweep's table has them
    tables.sort(key=lambda t: _run_order(t.column("_run")[0].as_py()))
    return _concat(tables), skipped, keys


def _concat(tables: list[pa.Table]) -> pa.Table:
    """The heads as one table: a column some shards lack is null there; one typed differently by two shards
    (an int in one, a float in another) is promoted, and one that is text in any shard (`table.parquet_safe`:
    an int in some runs and text in others) is text in all."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    text = {f.name for t in tables for f in t.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}
    out = []
    for t in tables:
        for i, f in enumerate(t.schema):
            if f.name in text and not (pa.types.is_string(f.type) or pa.types.is_null(f.type)):
                t = t.set_column(i, f.name, t.column(i).cast(pa.string()))
        out.append(t)
    return pa.concat_tables(out, promote_options="permissive")


def _run_order_of(names: pd.Series) -> np.ndarray:
    """The positions of `names` in run order (`layout.order`): a sweep of a million numbered runs is sorted
    as integers by Arrow (a stable sort), without a key built per run."""
    text = pa.array(names, type=pa.large_string(), from_pandas=True)
    if len(text) and pc.all(pc.match_substring_regex(text, r"^[0-9]{1,18}$")).as_py():
        return pc.sort_indices(pc.cast(text, pa.int64())).to_numpy()
    keys = [_run_order(n) for n in names.tolist()]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def _without_copies(df: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """A run is counted once however many folders hold it: a copy of a run folder (a backup `cp -a 0 X`)
    carries the run's own `run_id`, which no other run of the sweep has (it is made from the folder the run
    was trained in). Of the folders with one run_id the one it was made from stays (else the first in run
    order); the others are listed as copies, each in one line."""
    if "run_id" not in df.columns or not df["run_id"].duplicated().any():
        return df, []
    drop, copies = [], []
    for rid, idx in df.groupby("run_id", sort=False).groups.items():
        if len(idx) < 2 or not isinstance(rid, str):
            continue
        rows = list(idx)
        own = [i for i in rows if results.run_id(df.at[i, "path"]) == rid]
        keep = own[0] if own else rows[0]
        for i in rows:
            if i != keep:
                drop.append(i)
                copies.append(_skip(df.at[i, "path"], "copy", f"a copy of {df.at[keep, 'run']} (the same run_id "
                                                             f"{rid}); counted once"))
    return df.drop(index=drop).reset_index(drop=True), copies


_FILES = ((contract.CONFIG, contract.CAPS[contract.CONFIG], None),
          (contract.SUMMARY, contract.CAPS[contract.SUMMARY], None),
          (contract.HISTORY, contract.FILE_CAPS[contract.HISTORY], contract.LINE_CAPS[contract.HISTORY]),
          (contract.SNAPSHOTS, contract.FILE_CAPS[contract.SNAPSHOTS], contract.LINE_CAPS[contract.SNAPSHOTS]))


def _digest(path) -> str | None:
    """One digest of the contract files a run's row and its judgement come from (a missing file counts as
    such); None when the folder has neither a config nor a summary. Broken for a file that is not one."""
    parts = [readers.digest(os.path.join(path, name), cap, name, line_cap) for name, cap, line_cap in _FILES]
    if parts[0] is None and parts[1] is None:
        return None
    return b"".join(p if p is not None else b"-" * 16 for p in parts).hex()


def _read_cache(sweep: Path):
    """The sweep's cache, if its seal verifies (it was written by this user's analysis); else nothing."""
    f = sweep / CACHE_NAME
    try:
        raw = readers.read_bytes(f, CACHE_CAP, CACHE_NAME)
        mark = readers.read_bytes(sweep / SEAL_NAME, 1024, SEAL_NAME).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return pd.DataFrame(), {}
    except readers.Broken as e:
        warnings.warn(f"ignoring the cache: {e}")
        return pd.DataFrame(), {}
    if not seal.verify(mark, b"runs.parquet", raw):   # planted, edited or another user's: rebuilt
        return pd.DataFrame(), {}
    try:
        table = arrow.read(raw)
        meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
        if meta.get("version") != CACHE_VERSION or not set(_BOOK) <= set(table.column_names):
            return pd.DataFrame(), {}      # another format (or the CLI's output table): rebuild
        if not _cache_types_ok(table):     # a column the contract makes numeric holds text: rebuild
            return pd.DataFrame(), {}
        df = arrow.to_pandas(table)
        df.attrs = {}
        return df, meta
    except Exception as e:                 # a torn or foreign file is only a slower load
        warnings.warn(f"ignoring unreadable cache {f}: {e}")
        return pd.DataFrame(), {}


def _cache_types_ok(table) -> bool:
    """Every column the results contract types (config keys and summary fields) has an Arrow type that
    agrees with it (a null column, written when every value was None, agrees with anything)."""
    for key, kind in {**CONTRACT_TYPES, **SUMMARY_TYPES}.items():
        if key not in table.column_names:
            continue
        t = table.schema.field(key).type
        if pa.types.is_null(t):
            continue
        numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
        ok = {str: pa.types.is_string(t) or pa.types.is_large_string(t), bool: pa.types.is_boolean(t),
              int: numeric}.get(kind, numeric)
        if not ok:
            return False
    return True


def _write_cache(sweep: Path, df: pd.DataFrame, config_keys):
    f = sweep / CACHE_NAME
    if not _ours(sweep):  # a folder of the user's own that holds a runs.parquet: theirs, never replaced
        warnings.warn(f"{f} is not this project's cache (no sweep folder, and no seal of yours): left as it "
                      "is; the runs are read uncached")
        return
    try:
        table = pa.Table.from_pandas(_parquet_safe(df), preserve_index=False)
        meta = {**(table.schema.metadata or {}),
                _META_KEY: json.dumps({"version": CACHE_VERSION, "config_keys": config_keys})}
        table = table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        raw = sink.getvalue().to_pybytes()
        write_with(f, lambda fh: fh.write(raw))  # the one atomic writer
        atomic_write(sweep / SEAL_NAME, seal.seal(b"runs.parquet", raw) + "\n")
    except OSError as e:                   # a read-only sweep folder still loads, just uncached
        warnings.warn(f"could not write cache {f}: {e}")


def _ours(sweep: Path) -> bool:
    """May the cache be written in `sweep`: no runs.parquet there, one this user's analysis sealed, or the
    folder is a launch's sweep (its record `.rw_sweep.json`), where the name is the cache's by the results
    contract and a planted one is rebuilt. Elsewhere (a folder of the user's own) the file is theirs."""
    if safefs.lexists(sweep / layout.RECORD):
        return True
    try:
        raw = readers.read_bytes(sweep / CACHE_NAME, CACHE_CAP, CACHE_NAME)
        mark = readers.read_bytes(sweep / SEAL_NAME, 1024, SEAL_NAME).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return not safefs.lexists(sweep / CACHE_NAME)  # none (a missing seal alone: the file is not ours)
    except (OSError, readers.Broken):
        return False
    return seal.verify(mark, b"runs.parquet", raw)


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Arrow needs one type per column: a key that is an int in one run and a string in another
    (e.g. `model.pos_denom`) is stored as text."""
    df = df.copy()
    for c in df.columns[df.dtypes == object]:
        kinds = {type(v) for v in df[c] if v is not None and v == v}
        if len(kinds) > 1 and not kinds <= {int, float, bool}:
            df[c] = [None if v is None or v != v else str(v) for v in df[c]]
    return df


# ---------------------------------------------------------------------------------------------
# one run folder

# The columns whose type a table relies on (a number written as text would make the column mixed, and
# Parquet refuses it): the contract's summary fields, and the config keys every run has.
_NUM = (int, float)
_KINDS = {"int": int, "num": _NUM, "bool": bool, "str": str}
SUMMARY_TYPES = {k: _KINDS[f.kind] for k, f in contract.SUMMARY_FIELDS.items() if f.kind in _KINDS}
CONTRACT_TYPES = {"seed": int, "data.K": int, "data.N": int, "data.n_train": int, "data.n_test": int,
                  "optim.steps": int, "eval_every": int, "optim.lr": _NUM, "optim.eps": _NUM, "optim.name": str}
STATUSES = contract.STATUSES
INT_FIELDS = tuple(k for k, kind in SUMMARY_TYPES.items() if kind is int)  # nullable integers: Int64
BOOL_FIELDS = tuple(k for k, kind in SUMMARY_TYPES.items() if kind is bool)  # nullable: boolean
TEXT_FIELDS = tuple(k for k, kind in SUMMARY_TYPES.items() if kind is str)  # str, NaN where null


def _read_run(path: Path):
    """-> (row, config keys, None) or (None, None, skip record), as the contract judges the folder."""
    verdict = contract.judge(path)
    if verdict.state == "unfinished":
        return None, None, _skip(path, "unfinished", verdict.why)
    if verdict.state == "corrupt":
        return None, None, _skip(path, "corrupt", verdict.why)
    # a key older versions lacked, at its default; the row as the store writes it (`rw_sweeps.core.table`)
    row, cfg_keys = run_row(canonical(verdict.config), verdict.summary)
    return row, cfg_keys, None


@functools.lru_cache(maxsize=1)
def schema_dtypes() -> dict[str, str]:
    """The pandas dtype of each config key that the schema types as an integer or a bool in every option that
    has it: nullable (`Int64`, `boolean`), so that a key which some runs' options lack is <NA> there and an
    integer stays one (`model.n_layer` 1, not 1.0, beside a run of a model without layers)."""
    hints: dict[str, set] = {}

    def add(key, cls, f):
        hint = typing.get_type_hints(cls)[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = typing.get_origin(hint) is typing.Union and len(args) == 1
        hints.setdefault(key, set()).add(args[0] if optional else hint)   # Optional[int] is int

    for f in dataclasses.fields(RunConfig):
        if f.name not in (*GROUPS, "wandb"):
            add(f.name, RunConfig, f)
    for f in dataclasses.fields(WandbConfig):
        add(f"wandb.{f.name}", WandbConfig, f)
    for group in GROUPS:
        for cls in OPTIONS[group].values():
            for f in dataclasses.fields(cls):
                add("init" if (group, f.name) == ("init", "name") else f"{group}.{f.name}", cls, f)
    nullable = {int: "Int64", bool: "boolean"}
    return {k: nullable[t] for k, (t, *more) in hints.items() if not more and t in nullable}


# the column naming each group's option: a key `group.x` belongs to the runs whose option has a field x
OPTION_COLUMNS = {"data": "data.name", "model": "model.name", "init": "init", "optim": "optim.name"}


def has_key(df: pd.DataFrame, key: str) -> pd.Series:
    """Which runs' options have the config key (`optim.beta1`: the adam runs, not the gd ones): a run whose
    option lacks it is <NA> there, and that is no value of the key. Top-level keys, and a run of an option
    this version does not know, count where they have a value."""
    group, _, field = key.partition(".")
    name = OPTION_COLUMNS.get(group)
    if not field or name is None or name not in df.columns or key == name:
        return df[key].notna() if key in df.columns else pd.Series(False, index=df.index)
    own = {o: field in {f.name for f in dataclasses.fields(cls)} for o, cls in OPTIONS[group].items()}
    codes, options = pd.factorize(df[name])   # one look-up per option, not one per run (a million of them)
    answers = np.array([own.get(o) if isinstance(o, str) else None for o in options] + [None], dtype=object)
    known = pd.Series(answers[codes], index=df.index)   # code -1 (no option): the None at the end
    return known.where(known.notna(), df[key].notna()).astype(bool)


def _schema_typed(df: pd.DataFrame, keys) -> pd.DataFrame:
    """The config columns in their schema's nullable dtype (`schema_dtypes`); a column whose values do not fit
    it (a folder of another version) is left as read."""
    types = schema_dtypes()
    for k in keys:
        if k in df.columns and k in types and str(df[k].dtype) != types[k]:
            try:
                df[k] = df[k].astype(types[k])
            except (TypeError, ValueError):
                pass
    return df


def _read_jsonl(f: Path):
    """The rows of a history or snapshots file that meet the contract; a file that breaks it (a link, a FIFO,
    a line over its cap) yields what came before, with a warning: a run still being written must not break
    a plot."""
    try:
        for row in contract.rows(f.parent, f.name):
            yield row
    except FileNotFoundError:
        return
    except readers.Broken as e:
        warnings.warn(f"skipping the rest of {f}: {e.why}")


# ---------------------------------------------------------------------------------------------
# small helpers

def _is_run_dir(p: Path) -> bool:
    return os.path.lexists(p / "config.yaml") or os.path.lexists(p / "summary.json")


def _iter_runs(runs, columns):
    """(path, (sweep, run) where a stored run of the table is, else None, extra columns) of each run."""
    if isinstance(runs, pd.DataFrame):
        cols = [c for c in (columns or []) if c in runs.columns]
        located = {"sweep", "run"} <= set(runs.columns)
        for rec in runs[list(dict.fromkeys(["path", *(["sweep", "run"] if located else []), *cols]))].to_dict("records"):
            path = rec.pop("path")
            where = (rec["sweep"], rec["run"]) if located and isinstance(rec["sweep"], str) else None  # NaN: a folder
            if located:   # the table's own columns, copied only where asked for
                for k in ("sweep", "run"):
                    if k not in cols:
                        rec.pop(k)
            yield path, where, rec
    else:
        for p in ([runs] if isinstance(runs, (str, Path)) else runs):
            yield str(p), None, {}


def _as_runs(runs, columns, caller: str):
    """`load_history`'s `runs` as `_iter_runs` reads it: a table as it is; a path or paths as run folders, and
    a sweep folder as `load_runs`'s table of it. A run a sweep's store holds has no folder, and is one. A folder
    that is not there, or anything else, is one line."""
    if isinstance(runs, pd.DataFrame):
        _warn_missing(columns or [], runs.columns, caller, stacklevel=4)
        return runs
    paths = [runs] if isinstance(runs, (str, os.PathLike)) else runs
    try:
        paths = list(paths)
    except TypeError:
        paths = None
    if paths is None or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise TypeError(f"{caller}: runs={runs!r:.80}: give load_runs' table, or run or sweep folders (a path or a "
                        "list of them)")
    tables, folders = [], []
    for p in paths:
        if _is_run_dir(Path(p)) or (not os.path.isdir(p) and store.sweep_of(p) is not None):
            folders.append(str(p))
        elif os.path.isdir(p):
            tables.append(load_runs(p, progress=False))
        else:
            raise FileNotFoundError(f"{caller}: no such run or sweep folder: {p}")
    if not tables:
        return folders
    table = pd.concat([pd.DataFrame({"path": folders}), *tables], ignore_index=True, sort=False)
    _warn_missing(columns or [], table.columns, caller, stacklevel=4)
    return table


def _warn_missing(asked, have, caller: str, stacklevel: int) -> None:
    """One warning naming the asked-for columns no run has (left out), with close names: pandas would raise at
    `read_parquet(columns=...)`, but a field some tasks' summaries lack (`trap`, not gpt's) is no mistake."""
    missing = [c for c in asked if c not in have]
    if not missing:
        return
    close = {c: difflib.get_close_matches(str(c), [str(h) for h in have], 1, 0.6) for c in missing}
    hints = ", ".join(f"{c!r}" + (f" (did you mean {close[c][0]!r}?)" if close[c] else "") for c in missing)
    warnings.warn(f"{caller}: columns= names no column of the runs, left out: {hints}", stacklevel=stacklevel)


def _flatten_args(paths):
    for p in paths:
        if isinstance(p, (list, tuple)):
            yield from p
        else:
            yield p


def _skip(path, status, reason):
    return {"path": str(path), "status": status, "reason": reason}


def _short(e: Exception) -> str:
    return one_line(e)[:200]


def _quiet(progress, n) -> bool:
    if progress is None:                   # a bar only for long reads, and only on a terminal
        return not (n >= 100 and sys.stderr.isatty())
    return not progress


def _run_order(name: str):
    """Job folders in numeric order (2 before 10, 2/run before 10/run), others after, by name."""
    return layout.order(name)
