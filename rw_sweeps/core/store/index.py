"""Reading a sweep's store: which runs it holds, as the contract judged them, and each run's record.

`index(sweep)` lists `<sweep>/store/` through the sweep folder's handle, reads every head within its cap (a
regular file, no link), verifies its seal (`shard.verify_head`) and the size of the body it names, and maps
each run to its record. A file that is no record (torn, truncated, planted, edited, copied under another
name, a link, a FIFO, a body of the wrong size) is `refused`, with one line, and its runs are not done here: a
launch trains them again. A run two heads hold (two jobs raced, or a requeued job finished it again) is read
from the first in shard order and named in `duplicates`. Nothing is read without a bound.

The index is cached per process by the store folder's listing (name, size, inode and mtime of each file), so
the many readers of one launch (placement, the skip, status) read each head once.
"""
from __future__ import annotations

import itertools
import json
import os
import stat
import threading
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
    """The sweep's store, read and verified (see the module's doc); cached while its listing is unchanged.
    `bodies`: each body is hashed against its head too (streamed, 1 MiB at a time), as every reader that
    decides whether a run is done (the contract's judge, placement and the skip, status) asks; the runs
    table (`analysis.load_runs`), which reads heads alone, checks a body's size, and its hash where it reads
    the body (`body_rows`)."""
    sweep = os.path.abspath(sweep)
    entries = listing(sweep)
    key = (bodies, tuple(sorted((n, s.st_size, s.st_ino, s.st_mtime_ns, s.st_mode) for n, s in entries.items())))
    with _cache_lock:
        for held in (True, bodies):  # an index whose bodies were hashed serves a reader of heads too
            hit = _cache.get((sweep, held))
            if hit is not None and hit[0][1] == key[1]:
                return hit[1]
    out = Index(sweep)
    for name in sorted(entries):
        if not name.endswith(HEAD):
            continue
        sid = name[:-len(HEAD)]
        if not ID.match(sid):
            out.refused[name] = "not a shard's name"
            continue
        try:
            raw = readers.read_bytes(os.path.join(sweep, STORE, name), shard.HEAD_CAP, name)
            meta = shard.verify_head(sid, raw)
            body = entries.get(sid + BODY)
            if body is None or not stat.S_ISREG(body.st_mode) or body.st_size != meta["body"]["bytes"]:
                raise Refused(sid + BODY, "missing, not a regular file, or not the size its head was sealed with")
            if bodies:
                _hash_body(os.path.join(sweep, STORE, sid + BODY), sid, meta)
            t = shard.read_head(raw, columns=["_run", "status"])
        except Refused as exc:
            out.refused[exc.name] = exc.why
            continue
        except (OSError, readers.Broken, pa.ArrowException) as exc:
            out.refused[name] = getattr(exc, "why", None) or f"cannot be read ({type(exc).__name__}: {exc})"
            continue
        out.heads[sid] = (raw, meta)
        names, states = t.column("_run").to_pylist(), t.column("status").to_pylist()
        again = out.runs.keys() & names if out.runs else set()
        if again or len(set(names)) < len(names):  # a run another head (or this one) holds already: the first's
            for row, (run, state) in enumerate(zip(names, states)):
                if run in out.runs:
                    out.duplicates.setdefault(run, [out.runs[run][0]]).append(sid)
                else:
                    out.runs[run] = (sid, row, state)
        else:
            out.runs.update(zip(names, zip(itertools.repeat(sid), range(len(names)), states)))
    with _cache_lock:
        _cache[(sweep, bodies)] = (key, out)
    return out


def _hash_body(path: str, sid: str, meta: dict) -> None:
    """Refused unless the body file hashes to what its head names; read a block at a time, within its cap."""
    import hashlib

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


def sweep_of(run_dir) -> tuple[str, str] | None:
    """(the sweep folder, the run's name) of a run that a store holds, for a run folder path that is not there
    (a stored run has no folder): the nearest folder above it, up to `layout.DEPTH` levels, with a store."""
    path = os.path.abspath(run_dir)
    parts = []
    for _ in range(4):
        path, part = os.path.split(path)
        if not part:
            return None
        parts.insert(0, part)
        if present(path):
            return path, "/".join(parts)
    return None
