"""Sweep and run folders -> one tidy table (one row per run), per the README's results contract.

Only the results contract is read (config.yaml, summary.json, history.jsonl, snapshots.jsonl);
the training code is never imported. Each sweep is consolidated into `<sweep>/runs.parquet`,
refreshed from the mtimes of its runs' files, so a warm load of 10,000 runs is a few stats each.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from tqdm import tqdm

from rw_sweeps.core.errors import one_line
from rw_sweeps.core.safefs import write_with

from .fastyaml import load_yaml

CACHE_NAME = "runs.parquet"
CACHE_VERSION = 3   # bump when the row format changes: old caches are then rebuilt
_META_KEY = b"rw_sweeps.analysis"
_BOOK = ["_run", "_cfg_mtime", "_cfg_size", "_sum_mtime", "_sum_size"]   # cache-only columns


def load_runs(*paths, refresh: bool = False, progress: bool | None = None,
              cache: bool = True) -> pd.DataFrame:
    """Load sweep folders and/or single run folders into one DataFrame, one row per run.

    Columns: every config key under its dotted name (`data.p`, `init.sigma`, `optim.lr`, ...),
    `init` = the chosen init's name, every summary.json field, and `path` (the run folder),
    `sweep` (its sweep folder, or the run folder itself for a single run), `run` (folder name).
    Folders without a usable summary are not rows; they are listed in `df.attrs["skipped"]`
    as {path, status: unfinished|corrupt, reason}. `df.attrs["config_keys"]` names the config
    columns. `progress=None` shows a tqdm bar only on a terminal.
    """
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
            df, skip, cfg_keys = _load_sweep(p, refresh=refresh, progress=progress, cache=cache)
            frames.append(df)
            skipped += skip
            config_keys |= cfg_keys
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()
    if len(df):
        df = df.drop_duplicates("path", ignore_index=True)   # a run given twice (sweep + run)
        for k in INT_FIELDS:   # a step that can be null (never broke, not locked): an integer or <NA>
            if k in df.columns and df[k].dtype.kind in "fiO":
                v = pd.to_numeric(df[k], errors="coerce")
                if bool((v.dropna() % 1 == 0).all()):
                    df[k] = v.astype("Int64")
    df.attrs = {"config_keys": sorted(config_keys), "skipped": skipped}
    return df


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
    row, ready for seaborn's hue/style) or a list of run folders. Unreadable lines are skipped:
    a run still being written must not break a plot.
    """
    frames = []
    for path, extra in _iter_runs(runs, columns):
        rows = list(_read_jsonl(Path(path) / "history.jsonl"))
        if rows:
            frames.append(pd.DataFrame(rows).assign(path=path, **extra))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_snapshots(runs, columns=None) -> pd.DataFrame:
    """Long-form snapshots: one row per (run, snapshot step); `V`, `A`, `attention`,
    `h_example`, `h_var` become numpy arrays (None where the run stored null)."""
    frames = []
    for path, extra in _iter_runs(runs, columns):
        rows = list(_read_jsonl(Path(path) / "snapshots.jsonl"))
        for r in rows:
            for k in ("V", "A", "attention", "h_example", "h_var"):
                if r.get(k) is not None:
                    r[k] = np.asarray(r[k], dtype=float)
        if rows:
            frames.append(pd.DataFrame(rows).assign(path=path, **extra))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---------------------------------------------------------------------------------------------
# one sweep, through its Parquet cache

def _load_sweep(sweep: Path, refresh: bool, progress, cache: bool):
    cached, meta = (pd.DataFrame(), {}) if refresh or not cache else _read_cache(sweep)
    # run folder -> (its row in the cache, the file stamps that row was read from)
    stamps = ({r: (i, s) for i, (r, *s) in enumerate(zip(*(cached[c].tolist() for c in _BOOK)))}
              if len(cached) else {})
    keep, todo, skipped = [], [], []
    for entry in _run_entries(sweep):
        stats = _stat_run(entry.path)
        if stats is None:                  # a numbered job folder with nothing in it yet
            skipped.append(_skip(entry.path, "unfinished", "no config.yaml or summary.json"))
            continue
        i, old = stamps.get(entry.name, (None, None))
        if old is not None and tuple(old) == stats:
            keep.append(i)
        else:
            todo.append((entry, stats))

    new_rows, config_keys = [], set(meta.get("config_keys", []))
    bar = tqdm(todo, desc=f"reading {sweep.name}", unit="run", disable=_quiet(progress, len(todo)))
    for entry, stats in bar:
        row, cfg_keys, problem = _read_run(Path(entry.path))
        if problem:
            skipped.append(problem)
            continue
        row.update(zip(_BOOK, (entry.name, *stats)))
        new_rows.append(row)
        config_keys |= cfg_keys

    parts = [cached.iloc[keep]] if keep else []
    if new_rows:
        parts.append(pd.DataFrame(new_rows))
    df = pd.concat(parts, ignore_index=True, sort=False) if parts else pd.DataFrame()
    changed = bool(new_rows) or len(keep) != len(cached)
    if cache and changed:
        _write_cache(sweep, df, sorted(config_keys))
    if len(df):
        names = df["_run"].tolist()
        df = df.iloc[sorted(range(len(df)), key=lambda i: _run_order(names[i]))]
        df = df.reset_index(drop=True)
        df["path"] = [os.path.join(sweep, r) for r in df["_run"]]
        df["sweep"] = str(sweep)
        df["run"] = df.pop("_run")
        df = df.drop(columns=[c for c in _BOOK if c in df.columns])
    return df, skipped, config_keys


def _run_entries(sweep: Path):
    """Candidate run folders: numbered job folders (even empty ones count as unfinished), and
    any other visible sub-folder holding a run's files."""
    with os.scandir(sweep) as it:
        for e in it:
            if e.name.startswith((".", "_")) or not e.is_dir():
                continue
            if e.name.isdigit() or _is_run_dir(Path(e.path)):
                yield e


def _stat_run(path):
    """(config mtime, size, summary mtime, size); -1 for a missing file; None if both missing."""
    out = []
    for name in ("config.yaml", "summary.json"):
        try:
            st = os.stat(os.path.join(path, name))
            out += [st.st_mtime_ns, st.st_size]
        except FileNotFoundError:
            out += [-1, -1]
    return None if out[0] == out[2] == -1 else tuple(out)


def _read_cache(sweep: Path):
    f = sweep / CACHE_NAME
    if not f.exists():
        return pd.DataFrame(), {}
    try:
        table = pq.read_table(f)
        meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
        if meta.get("version") != CACHE_VERSION or not set(_BOOK) <= set(table.column_names):
            return pd.DataFrame(), {}      # another format (or the CLI's output table): rebuild
        if not _cache_types_ok(table):     # a column the contract makes numeric holds text: rebuild
            return pd.DataFrame(), {}
        df = table.to_pandas()
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
    try:
        table = pa.Table.from_pandas(_parquet_safe(df), preserve_index=False)
        meta = {**(table.schema.metadata or {}),
                _META_KEY: json.dumps({"version": CACHE_VERSION, "config_keys": config_keys})}
        table = table.replace_schema_metadata(meta)
        write_with(f, lambda fh: pq.write_table(table, fh))  # the one atomic writer
    except OSError as e:                   # a read-only sweep folder still loads, just uncached
        warnings.warn(f"could not write cache {f}: {e}")


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

# Keys of the results contract whose type a table column relies on (a number written as text would make
# the column mixed, and Parquet refuses it): such a folder is corrupt, never a crash.
_NUM = (int, float)
CONTRACT_TYPES = {"seed": int, "data.K": int, "data.N": int, "data.n_train": int, "data.n_test": int,
                  "model.M": int, "optim.steps": int, "eval_every": int, "data.p": _NUM, "init.sigma": _NUM,
                  "optim.lr": _NUM, "optim.eps": _NUM, "model.pos_scale": _NUM, "model.normalize": str,
                  "model.ffn": str, "optim.name": str, "optim.beta1": _NUM, "optim.beta2": _NUM,
                  "optim.adam_eps": _NUM}
# Keys added after some run folders were written. An old folder trained what they now default to (plain GD,
# the FFN after the attention), so it reads as such: a table mixing old and new runs shows no false axis.
# summary.json's fields that the tables compute with, and their types (None is allowed for each: a metric
# that is undefined); a run whose summary says otherwise is corrupt, and so is one of an unknown status.
SUMMARY_TYPES = {**{k: _NUM for k in ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention",
                                      "v_pi_cosine", "pred_dist", "attention_spread", "opt_acc", "wall_s",
                                      "parents_attention")},
                 **{k: int for k in ("eval_step", "symmetry_break_step", "prediction_break_step", "locked_position",
                                      "steps")},
                 "trap": bool, "error": str}
STATUSES = ("done", "failed", "diverged")
# summary.json's copies of config keys (for a reader of the one file): the table has the config's own column
# (`data.p`, `optim.lr`, `init.sigma`, …), once; σ of a zero-init run is no column (it has none)
ECHOED = ("p", "K", "N", "M", "model", "data", "sigma", "lr", "eps", "seed", "precision", "init")
INT_FIELDS = tuple(k for k, kind in SUMMARY_TYPES.items() if kind is int)  # nullable integers: Int64
LEGACY_DEFAULTS = {"model.ffn": "after", "optim.name": "gd", "optim.beta1": 0.9, "optim.beta2": 0.999,
                   "optim.adam_eps": 1e-8}
LEGACY_NORMALIZE = {True: "whole", False: "none"}   # model.normalize was a bool before it said where


def _read_run(path: Path):
    """-> (row, config keys, None) or (None, None, skip record)."""
    try:
        with open(path / "summary.json", "rb") as f:
            summary = json.load(f)
    except FileNotFoundError:
        return None, None, _skip(path, "unfinished", "no summary.json")
    except (ValueError, OSError) as e:
        return None, None, _skip(path, "corrupt", f"summary.json: {_short(e)}")
    if not isinstance(summary, dict):
        return None, None, _skip(path, "corrupt", "summary.json is not a JSON object")
    if summary.get("status") not in STATUSES:
        return None, None, _skip(path, "corrupt", f"summary.json: status={summary.get('status')!r} is not one of "
                                 f"{', '.join(STATUSES)}")
    for key, kind in SUMMARY_TYPES.items():
        v = summary.get(key)
        if v is not None and not _is(v, kind):
            what = "number" if kind is _NUM else kind.__name__
            return None, None, _skip(path, "corrupt", f"summary.json: {key}={v!r} is not a {what}")
    try:
        with open(path / "config.yaml", encoding="utf-8") as f:
            config = load_yaml(f.read())
    except FileNotFoundError:
        return None, None, _skip(path, "corrupt", "no config.yaml")
    except (yaml.YAMLError, OSError, ValueError) as e:
        return None, None, _skip(path, "corrupt", f"config.yaml: {_short(e)}")
    if not isinstance(config, dict):
        return None, None, _skip(path, "corrupt", "config.yaml is not a mapping")
    row = flatten_config(config)
    if isinstance(row.get("model.normalize"), bool):
        row["model.normalize"] = LEGACY_NORMALIZE[row["model.normalize"]]
    for key, value in LEGACY_DEFAULTS.items():
        row.setdefault(key, value)
    for key, kind in CONTRACT_TYPES.items():   # the results contract's types (README, "Results")
        v = row.get(key)
        if v is not None and not _is(v, kind):
            what = "number" if kind is _NUM else kind.__name__
            return None, None, _skip(path, "corrupt", f"config.yaml: {key}={v!r} is not a {what}")
    if summary.get("status") == "done":
        for name in ("history.jsonl", "snapshots.jsonl"):
            if not os.path.isfile(path / name) or os.path.getsize(path / name) == 0:
                return None, None, _skip(path, "corrupt", f"a done run without its {name}")
    cfg_keys = set(row)
    for k, v in summary.items():           # the config wins where both say it (seed, init, ...)
        if k not in ECHOED:
            row.setdefault(k, json.dumps(v) if isinstance(v, (list, dict)) else v)
    return row, cfg_keys, None


def _is(v, kind) -> bool:
    """isinstance, where a bool is no number (JSON's true is not 1)."""
    return isinstance(v, kind) and (kind is bool or not isinstance(v, bool))


def flatten_config(config: dict, prefix: str = "") -> dict:
    """{"data": {"p": 0.5}} -> {"data.p": 0.5}; `init.name` becomes `init` (the chosen option);
    lists become JSON text so that every cell stays hashable and Parquet-friendly."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, key + "."))
        elif isinstance(v, (list, dict)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    if not prefix:   # `init` names the chosen option, in the place of `init.name`
        out = {("init" if k == "init.name" else k): v for k, v in out.items()}
    return out


def _read_jsonl(f: Path):
    try:
        with open(f, "rb") as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict):
                    yield r
    except FileNotFoundError:
        return


# ---------------------------------------------------------------------------------------------
# small helpers

def _is_run_dir(p: Path) -> bool:
    return (p / "config.yaml").exists() or (p / "summary.json").exists()


def _iter_runs(runs, columns):
    if isinstance(runs, pd.DataFrame):
        cols = [c for c in (columns or []) if c in runs.columns]
        for rec in runs[["path", *cols]].to_dict("records"):
            yield rec.pop("path"), rec
    else:
        for p in ([runs] if isinstance(runs, (str, Path)) else runs):
            yield str(p), {}


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
    """Job folders in numeric order (2 before 10), others after, by name."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)
