"""Reading a sweep's store: which runs it holds, as the contract judged them, and each run's record.

`index(sweep)` lists `<sweep>/store/` through the sweep folder's handle, reads every head within its cap (a
regular file, no link), verifies its seal (`shard.verify_head`) and the size of the body it names, and maps
each run to its record. A file that is no record (torn, truncated, planted, edited, copied under another
name, a link, a FIFO, a body of the wrong size) is `refused`, with one line, and its runs are not done here: a
launch trains them again. A run two heads hold (a failed run trained again, a run trained over with
`overwrite`, two jobs that raced) is read from the newest (the time its job wrote the head, sealed in it) and
named in `duplicates`. Nothing is read without a bound.

The index is cached per process by the store folder's listing (name, size, inode and mtime of each file), so
the many readers of one launch (placement, the skip, status) read each head once.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import orjson
import pyarrow as pa

from .. import readers, safefs
from ..contract import Verdict
from . import shard
from .shard import BODY, HEAD, ID, Refused

STORE = "store"  # the store folder's name in a sweep folder


@dataclass
class Index:
    """What a sweep's store holds: `runs` by name → (shard id, row in its head, status); the heads' bytes and
    metadata by shard id; the shard files refused, with why; runs held by more than one shard."""
    sweep: str
    runs: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    heads: dict[str, tuple[bytes, dict]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    _records: dict[str, tuple[dict, dict]] = field(default_factory=dict)

    def record(self, name: str) -> tuple[dict, dict] | None:
        """(config, summary) of the run `name`, parsed from its head; None when the store has no such run."""
        if name not in self.runs:
            return None
        if name not in self._records:
            sid, row, _ = self.runs[name]
            table = shard.read_head(self.heads[sid][0], columns=["_config", "_summary"]).slice(row, 1)
            config = json.loads(table.column("_config")[0].as_py())
            summary = json.loads(table.column("_summary")[0].as_py())
            self._records[name] = (config, summary)
        return self._records[name]

    def configs(self) -> dict[str, dict]:
        """Every stored run's config by name (one pass over each head's `_config` column)."""
        out = {}
        for sid, (raw, _) in self.heads.items():
            t = shard.read_head(raw, columns=["_run", "_config"])
            for name, text in zip(t.column("_run").to_pylist(), t.column("_config").to_pylist()):
                if self.runs.get(name, (None,))[0] == sid:
                    out[name] = json.loads(text)
        return out

    def verdict(self, name: str) -> Verdict | None:
        """The contract's verdict on the stored run `name` (its record was judged before it was sealed), or
        None when the store holds no such run."""
        rec = self.record(name)
        if rec is None:
            return None
        config, summary = rec
        state = summary.get("status")
        why = None if state == "done" else f"its record says {state}"
        return Verdict(state, summary, config, why)


_cache: dict[tuple, tuple[tuple, Index]] = {}  # (sweep, bodies hashed) → (its listing's key, its index)
_cache_lock = threading.Lock()


def present(sweep) -> bool:
    """Does the sweep folder hold a store (a real folder named `store`, never a link)?"""
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(sweep, STORE)).st_mode)
    except OSError:
        return False


def listing(sweep) -> dict[str, os.stat_result]:
    """The store folder's entries by name, each lstat'ed through the folder's handle ({} without a store)."""
    if not present(sweep):
        return {}
    try:
        fd = safefs.open_dir(os.path.join(sweep, STORE))
    except (OSError, safefs.PlantedLink):
        return {}
    try:
        out = {}
        for name in os.listdir(fd):
            try:
                out[name] = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
        return out
    finally:
        os.close(fd)


def index(sweep, bodies: bool = True) -> Index:
    """The sweep's store, read and verified (see the module's doc). Every reader asks the same: each head's seal
    verified and its body hashed against it (streamed, 1 MiB at a time, the bodies two at a time). A shard is
    read once per process while its files are unchanged (`_shard`), so a later index (the next poll, the launch
    after placement) reads only what is new. `bodies=False`: the body's hash is left to the reader of that
    body (`body_rows`, which hashes the bodies it reads)."""
    sweep = os.path.abspath(sweep)
    entries = listing(sweep)
    key = tuple(sorted((n, s.st_size, s.st_ino, s.st_mtime_ns, s.st_mode) for n, s in entries.items()))
    with _cache_lock:
        for held in (True, bodies):  # an index whose bodies were hashed serves a reader of heads too
            hit = _cache.get((sweep, held))
            if hit is not None and hit[0] == key:
                return hit[1]
    out = Index(sweep)
    heads = [n for n in sorted(entries) if n.endswith(HEAD)]
    sid_of = sweep_id(sweep) if heads else None
    with ThreadPoolExecutor(2) as pool:  # hashing releases the GIL: two bodies at once
        shards = list(pool.map(lambda n: _shard(sweep, n, entries, bodies, sid_of), heads))
    read: list[tuple] = []  # (when written, shard id, its runs, their states): the newest record of a run wins
    for name, got in zip(heads, shards):
        if isinstance(got, Refused):
            out.refused[got.name] = got.why
            continue
        sid, raw, meta, names, states = got
        out.heads[sid] = (raw, meta)
        read.append((meta.get("written", 0), sid, names, states))
    for _, sid, names, states in sorted(read, key=lambda r: (r[0] if type(r[0]) is int else 0, r[1])):
        again = out.runs.keys() & names if out.runs else set()
        if again or len(set(names)) < len(names):  # a run an older head (or this one) holds: this, newer, wins
            for row, (run, state) in enumerate(zip(names, states)):
                if run in out.runs:
                    out.duplicates.setdefault(run, [out.runs[run][0]]).append(sid)
                out.runs[run] = (sid, row, state)
        else:
            out.runs.update(zip(names, zip(itertools.repeat(sid), range(len(names)), states)))
    with _cache_lock:
        _cache[(sweep, bodies)] = (key, out)
    return out


_shards: dict[tuple, tuple] = {}  # (sweep, head) → (its files' stat keys, bodies hashed, what `_shard` read)


def sweep_id(sweep) -> str | None:
    """The store's `sweep.id` (32 hex digits, read as a regular file), or None when it has none that reads."""
    try:
        text = readers.read_bytes(os.path.join(sweep, STORE, shard.SWEEP_ID), 64, shard.SWEEP_ID).decode("ascii")
    except (OSError, readers.Broken, UnicodeDecodeError):
        return None
    return text.strip() if shard.SWEEP_ID_TEXT.match(text) else None


def _shard(sweep: str, name: str, entries: dict, bodies: bool, sweep_id: str | None):
    """(shard id, head bytes, metadata, runs, states) of the head `name`, verified (and its body hashed with
    `bodies`), or the Refused that says why not; memoised on the stat of its two files."""
    sid = name[:-len(HEAD)]
    body = entries.get(sid + BODY)
    stamp = (sweep_id, *((s.st_size, s.st_ino, s.st_mtime_ns, s.st_mode) if s is not None else None
                         for s in (entries.get(name), body)))
    with _cache_lock:
        hit = _shards.get((sweep, name))
    if hit is not None and hit[0] == stamp and (hit[1] or not bodies):
        return hit[2]
    try:
        if not ID.match(sid):
            raise Refused(name, "not a shard's name")
        fh, st = readers.open_regular(os.path.join(sweep, STORE, name), name)  # no link, no FIFO, never blocking
        with fh:
            raw = shard.read_head_file(fh, st.st_size, name)
        meta = shard.verify_head(sid, raw, sweep_id)
        if body is None or not stat.S_ISREG(body.st_mode) or body.st_size != meta["body"]["bytes"]:
            raise Refused(sid + BODY, "missing, not a regular file, or not the size its head was sealed with")
        if bodies:
            _hash_body(os.path.join(sweep, STORE, sid + BODY), sid, meta)
        t = shard.read_head(raw, columns=["_run", "status"])
        got = (sid, raw, meta, t.column("_run").to_pylist(), t.column("status").to_pylist())
    except Refused as exc:
        got = exc
    except (OSError, readers.Broken, pa.ArrowException) as exc:
        got = Refused(name, getattr(exc, "why", None) or f"cannot be read ({type(exc).__name__}: {exc})")
    with _cache_lock:
        _shards[(sweep, name)] = (stamp, bodies, got)
    return got


def _hash_body(path: str, sid: str, meta: dict) -> None:
    """Refused unless the body file hashes to what its head names; read a block at a time, within its cap."""
    h, size = hashlib.sha256(), 0
    fh, st = readers.open_regular(path, sid + BODY)
    with fh:
        if st.st_size > shard.BODY_CAP:
            raise Refused(sid + BODY, f"{st.st_size:,} bytes; its cap is {shard.BODY_CAP:,}")
        while block := fh.read(1 << 20):
            size += len(block)
            if size > shard.BODY_CAP:
                raise Refused(sid + BODY, f"more than its cap of {shard.BODY_CAP:,} bytes")
            h.update(block)
    want = meta.get("body") or {}
    if size != want.get("bytes") or h.hexdigest() != want.get("sha256"):
        raise Refused(sid + BODY, "it is not the body its head was sealed with (edited, truncated or replaced)")


def body_rows(sweep, names: list[str]) -> dict[str, tuple[list[dict], list[dict]]]:
    """{run: (history rows, snapshot rows)} of the stored runs `names`, each body read once and verified
    against its head, then parsed (`_rows`). A body that does not verify is Refused."""
    idx = index(sweep, bodies=False)  # each body read here is hashed against its head below, before it is read
    by_shard: dict[str, list[str]] = {}
    for n in names:
        if n in idx.runs:
            by_shard.setdefault(idx.runs[n][0], []).append(n)
    out = {}
    for sid, runs in by_shard.items():
        path = os.path.join(idx.sweep, STORE, sid + BODY)
        try:
            raw = readers.read_bytes(path, shard.BODY_CAP, sid + BODY)
        except (FileNotFoundError, readers.Broken) as exc:
            raise Refused(sid + BODY, getattr(exc, "why", None) or "missing") from None
        shard.verify_body(sid, idx.heads[sid][1], raw)
        t = shard.read_body(raw, runs)
        for run, hist, snaps in zip(t.column("_run").to_pylist(), t.column("history").to_pylist(),
                                    t.column("snapshots").to_pylist()):
            out[run] = (_rows(hist), _rows(snaps))
    return out


def _rows(text: str) -> list[dict]:
    """The rows of a verified body's JSONL text, parsed in one call: the text is what the writer judged
    (`contract.judge_record`) and sealed, and it hashed to its head's digest just now, so the readers' rules
    for a stranger's file (`contract.rows`) were met when it was written."""
    return orjson.loads("[" + text.rstrip("\n").replace("\n", ",") + "]") if text else []


def has_folder(run_dir) -> bool:
    """Is the run at `run_dir` held by a run folder: a real folder (no link) with its config.yaml or summary.json?
    Else its sweep's store speaks for it: an empty folder, a link or a file planted at a stored run's name
    hides no record."""
    try:
        if not stat.S_ISDIR(os.lstat(run_dir).st_mode):
            return False
    except OSError:
        return False
    return any(os.path.lexists(os.path.join(run_dir, f)) for f in ("summary.json", "config.yaml"))


CLIMB = 16  # folders above a run looked at for its sweep's store: any `hydra.sweep.subdir` depth in use


def sweep_of(run_dir) -> tuple[str, str] | None:
    """(the sweep folder, the run's name) of a run that a store holds, for a run folder path that is not there
    (a stored run has no folder): the nearest folder above it, up to CLIMB levels, with a store."""
    path = os.path.abspath(run_dir)
    parts = []
    for _ in range(CLIMB):
        path, part = os.path.split(path)
        if not part:
            return None
        parts.insert(0, part)
        if present(path):
            return path, "/".join(parts)
    return None
