"""A shard: the records of the runs one job finished in one flush, as two Parquet files written once.

- `<id>.body.parquet`: a row per run, `_run`, `history` and `snapshots` (the run's history.jsonl and
  snapshots.jsonl text, as a run folder would hold them), zstd-compressed, row groups of `BODY_GROUP` runs;
- `<id>.runs.parquet`, the head, written last: a row per run with the runs table's columns
  (`rw_sweeps.core.table.run_row`: typed, so a table of a million runs is read without parsing a record),
  and `_run`, `_config`, `_summary`, `_overrides` (JSON text: the record itself). Its footer's metadata
  names the shard, its runs, its body's size and SHA-256, holds its job's `hydra.yaml` text (a job's Hydra
  config, kept per job rather than per run) and the head's **seal**.

Why two files: a reader of the runs table (the phase diagram) reads and verifies only heads, ~1 % of the
bytes; a reader of a history verifies and reads the body it is in.

The seal (`rw_sweeps.core.seal`: HMAC-SHA256 under the user's key) covers every byte of the head file as
written, the seal's own 64 characters read as zeros, the shard's id and its sweep's id (the store's
`sweep.id`, made once with the store: so a copy under another name, or into another sweep, is no record): an edited, truncated, planted or renamed head does not verify, and the body it names must hash to
what the head says. Parquet's page checksums are written and checked as well, so a flipped bit says where.
A head is judged before it is sealed (`rw_sweeps.core.store.writer`): a sealed record is one the contract
found done, failed or diverged when its run ended.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq

from .. import seal
from . import arrow
from ..readers import GiB

HEAD, BODY, CHECKPOINT = ".runs.parquet", ".body.parquet", ".ckpt.pt"
SWEEP_ID = "sweep.id"  # the store's own random name, made with it: sealed into every head (a copy is no record)
SWEEP_ID_TEXT = re.compile(r"[0-9a-f]{32}\n?\Z")
ID = re.compile(r"w[0-9a-f]{12}-[0-9]{5}\Z")  # a writer's random id and its flush number
META = b"rw_sweeps.store"
FORMAT = 1
SEAL_HEX = 64
_ZEROS = "0" * SEAL_HEX
BOOK = ("_run", "_config", "_summary", "_overrides")  # the record's own columns; the rest is the runs table's
BODY_COLUMNS = ("history", "snapshots")
BODY_GROUP = 64   # runs per row group of a body: one run's history reads ~1/64 of its shard
HEAD_CAP = 1 * GiB   # a head of 4,096 runs is ~1 MB
BODY_CAP = 16 * GiB  # a body holds at most `writer.SHARD_BYTES` but for one run larger than that
# no Arrow schema copy in the footer (`store_schema`): the key-value metadata, and the seal in it, is said once
_OPTIONS = dict(compression="zstd", write_page_checksum=True, write_statistics=["_run"], store_schema=False)


class Refused(ValueError):
    """A shard file that is no record of this sweep: `why` is one line."""

    def __init__(self, name: str, why: str):
        self.name, self.why = name, why
        super().__init__(f"{name}: {why}")


def encode(shard_id: str, heads: dict[str, list], body: dict[str, list], config_keys: list[str],
           sweep_id: str, hydra: str | None = None) -> tuple[bytes, bytes]:
    """(the head's bytes, the body's bytes) of a shard of the sweep `sweep_id` (its store's `sweep.id`):
    `heads` and `body` are columns (`_run` first in each)."""
    body_raw = _parquet(pa.table({k: pa.array(v, type=pa.large_string() if k in BODY_COLUMNS else None)
                                  for k, v in body.items()}), row_group_size=BODY_GROUP)
    meta = {"format": FORMAT, "shard": shard_id, "runs": len(heads["_run"]), "written": time.time_ns(),
            "body": {"bytes": len(body_raw), "sha256": hashlib.sha256(body_raw).hexdigest()},
            "config_keys": sorted(config_keys), "hydra": hydra, "seal": _ZEROS}
    raw = _parquet(pa.table(heads), row_group_size=max(1, len(heads["_run"])), meta={META: json.dumps(meta)})
    footer = _footer(raw)
    if raw.count(_ZEROS.encode(), footer) != 1:  # cannot happen: the metadata is the footer's only such text
        raise RuntimeError("the head's seal has no single place in its footer")
    mark = seal.seal(b"rw-sweeps store", sweep_id.encode(), shard_id.encode(), raw).encode()
    at = raw.index(_ZEROS.encode(), footer)
    return raw[:at] + mark + raw[at + SEAL_HEX:], body_raw


def _parquet(table: pa.Table, row_group_size: int, meta: dict | None = None) -> bytes:
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, **_OPTIONS) as w:
        w.write_table(table, row_group_size=row_group_size)
        if meta:
            w.add_key_value_metadata(meta)
    return sink.getvalue()


def _footer(raw: bytes) -> int:
    """Where a Parquet file's footer starts (its length is the 4 bytes before the closing magic)."""
    if len(raw) < 12 or raw[:4] != b"PAR1" or raw[-4:] != b"PAR1":
        raise ValueError("not a whole Parquet file")
    n = int.from_bytes(raw[-8:-4], "little")
    if not 0 < n <= len(raw) - 12:
        raise ValueError("its footer's length is out of the file")
    return len(raw) - 8 - n


FOOTER_CAP = 16 << 20  # a head's footer: its schema and metadata (a few KB for the runs table's columns)


def read_head_file(fh, size: int, name: str) -> bytes:
    """A head's bytes from its open file of `size` bytes, read whole only if its footer describes a file of
    that size (its column chunks end where the footer starts): a planted sparse or padded file costs a few
    reads, not its size in memory."""
    if size < 12 or size > HEAD_CAP:
        raise Refused(name, f"{size:,} bytes: no head of this store (its cap is {HEAD_CAP:,})")
    fh.seek(size - 8)
    tail = fh.read(8)
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or not 0 < n <= min(FOOTER_CAP, size - 12):
        raise Refused(name, "not a whole Parquet file (its footer is missing or out of bounds)")
    fh.seek(size - 8 - n)
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + fh.read(n) + tail))
        ends = [min(o for o in (c.dictionary_page_offset, c.data_page_offset) if o) + c.total_compressed_size
                for g in range(md.num_row_groups) for c in map(md.row_group(g).column, range(md.num_columns))]
    except Exception as exc:  # noqa: BLE001 - a footer that does not parse
        raise Refused(name, f"not a whole head of this store ({type(exc).__name__}: {_short(exc)})") from None
    if max(ends, default=4) != size - 8 - n:
        raise Refused(name, "its footer does not describe the file (padded, cut or grown)")
    fh.seek(0)
    raw = fh.read(size + 1)
    if len(raw) != size:
        raise Refused(name, "it changed while it was read")
    return raw


def verify_head(shard_id: str, raw: bytes, sweep_id: str | None) -> dict:
    """The head's metadata if `raw` is the head this user's code sealed for `shard_id` in the sweep `sweep_id`
    (its store's `sweep.id`), else Refused."""
    name = shard_id + HEAD
    try:
        footer = _footer(raw)
        meta = json.loads(pq.read_metadata(pa.BufferReader(raw)).metadata[META])
        mark = meta["seal"]
    except Exception as exc:  # noqa: BLE001 - torn, truncated, foreign
        raise Refused(name, f"not a whole head of this store ({type(exc).__name__}: {_short(exc)})") from None
    if not isinstance(mark, str) or len(mark) != SEAL_HEX or raw.count(mark.encode(), footer) != 1:
        raise Refused(name, "its seal is missing or malformed")
    at = raw.index(mark.encode(), footer)
    zeroed = raw[:at] + _ZEROS.encode() + raw[at + SEAL_HEX:]
    if sweep_id is None:
        raise Refused(name, f"the store has no {SWEEP_ID} naming its sweep: no head of it is a record")
    if not seal.verify(mark, b"rw-sweeps store", sweep_id.encode(), shard_id.encode(), zeroed):
        raise Refused(name, "its seal does not verify: edited, copied from another name or another sweep, or "
                            "another user's")
    if meta.get("format") != FORMAT or meta.get("shard") != shard_id:
        raise Refused(name, f"a shard of format {meta.get('format')!r}; this version reads {FORMAT}")
    return meta


def read_head(raw: bytes, columns=None) -> pa.Table:
    """The head's table (`columns`: a selection, read alone) from bytes `verify_head` accepted."""
    return arrow.read(raw, columns)


def verify_body(shard_id: str, meta: dict, raw: bytes) -> None:
    """Refused unless `raw` is the body the head's metadata names (its size and SHA-256)."""
    want = meta.get("body") or {}
    if len(raw) != want.get("bytes") or hashlib.sha256(raw).hexdigest() != want.get("sha256"):
        raise Refused(shard_id + BODY, "it is not the body its head was sealed with (edited, truncated or replaced)")


def read_body(raw: bytes, runs: list[str] | None = None) -> pa.Table:
    """The body rows of `runs` (all when None), from verified bytes; row groups without them are skipped."""
    return arrow.read(raw) if runs is None else arrow.read_rows(raw, "_run", runs)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 120 else text[:119] + "…"
