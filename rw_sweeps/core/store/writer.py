"""Writing a sweep's store: one `Writer` per packed job, the only process that writes its files.

A job's writer has a random id (`w<12 hex>`); each flush writes one shard, `<id>-<n>` (`shard.encode`): the
body, then the head, each a fresh file renamed into place through the sweep folder's handle
(`rw_sweeps.core.safefs`), never modified after. No file is written by two processes, so jobs on several
SLURM nodes or GPUs need no lock on a shared file system. Before a record is sealed the contract judges it
(`contract.judge_record`): a run whose results break it is written `failed`, with why.

The job's checkpoint is one file, `<id>.ckpt.pt`: every unfinished run's training state, each sealed for
its run as a run folder's checkpoint is (`rw_sweeps.core.results`). A run's state leaves it when its record
is flushed, and the file goes when none is left; a later job that resumes runs from an earlier job's file
removes that file once every run in it is stored.
"""
from __future__ import annotations

import io
import os
import secrets
import stat
import threading
from pathlib import Path

import orjson

from .. import contract, readers, safefs
from ..results import CHECKPOINT_CAP, clean, jsonl
from ..config import canonical
from ..table import parquet_safe, run_row
from . import shard
from .index import STORE, index, listing, present, sweep_id

SHARD_RUNS = 4096          # runs per shard at most: a GPU job of 100,000 runs flushes in parts
SHARD_BYTES = 256 << 20    # a body's text before a flush, at most (a run larger than that is a shard alone)

_active: dict[str, "Writer"] = {}  # run folder path → the writer of the job training it (in this process)
_lock = threading.Lock()


def writer_for(run_dir) -> "Writer | None":
    """The writer of the job that trains `run_dir` in this process, or None (the run has a folder)."""
    return _active.get(os.path.abspath(run_dir))


class Writer:
    """The store files of one packed job (see the module's doc)."""

    def __init__(self, sweep_dir, runs: list[str], overrides: dict[str, list] | None = None,
                 hydra: str | None = None):
        self.sweep = os.path.abspath(sweep_dir)
        self.folder = Path(self.sweep, STORE)
        self.id = "w" + secrets.token_hex(6)
        self.flushes = 0
        self.states: dict[str, dict] = {}     # run name → its sealed checkpoint blob
        self.resumed: dict[str, set] = {}     # an earlier job's checkpoint file → the runs it holds
        self.paths = {os.path.join(self.sweep, n): n for n in runs}
        self.overrides = overrides or {}
        self.hydra = hydra  # the job's hydra.yaml text, kept in each head's metadata
        safefs.ensure_dir(self.folder)
        self.sweep_id = _own_sweep_id(self.sweep)
        with _lock:
            for p in self.paths:
                _active[p] = self

    def name(self, run_dir) -> str:
        return self.paths[os.path.abspath(run_dir)]

    def close(self) -> None:
        """This job trains its runs no more: they are no longer its to write."""
        with _lock:
            for p in self.paths:
                if _active.get(p) is self:
                    del _active[p]

    # ------------------------------------------------------------------------------------ records
    def write(self, entries: list[dict]) -> dict[int, str]:
        """Store the runs' records (`entry`: cfg, summary, history, snapshots, run_dir) in shards of at most
        SHARD_RUNS runs and SHARD_BYTES of text; then their checkpoints are dropped. Returns, by index, why a
        run's record could not be made (its summary breaks the contract): that run alone is not stored. A
        write that fails (a full disk) raises, with `stored`: the runs of the shards written before it."""
        part: list[tuple] = []
        size = 0
        refused: dict[int, str] = {}
        flushed: list[int] = []
        for i, e in enumerate(entries):
            # the summary as its JSON reads back (a str subclass is a str, NaN is null), judged as a folder's is
            summary = orjson.loads(orjson.dumps(clean(e["summary"]), option=orjson.OPT_SERIALIZE_NUMPY))
            hist, snaps = jsonl(e["history"]), jsonl(e["snapshots"])
            try:  # judged as a folder's files are (a NaN in a row, written as null, is null to the judge)
                summary = contract.judge_record(e["cfg"], summary, e["history"], e["snapshots"], Path(e["run_dir"]))
            except contract.Broken as exc:
                refused[i] = exc.why
                continue
            e["summary"].update(status=summary["status"], error=summary.get("error"))
            if part and (len(part) >= SHARD_RUNS or size + len(hist) + len(snaps) > SHARD_BYTES):
                self._flush(part, flushed)
                part, size = [], 0
            part.append((i, e, summary, hist, snaps))
            size += len(hist) + len(snaps)
        if part:
            self._flush(part, flushed)
        for i, e in enumerate(entries):  # stored: their training states are not kept
            if i not in refused:
                self.states.pop(self.name(e["run_dir"]), None)
        self._checkpoint_or_drop()
        return refused

    def _flush(self, part: list[tuple], flushed: list[int]) -> None:
        """One shard of `part`'s records; their indices are added to `flushed`. An error raised carries
        `stored`, the indices of the shards written before it (stored all the same)."""
        try:
            self._shard(part)
        except BaseException as exc:
            exc.stored = list(flushed)
            raise
        flushed += [i for i, *_ in part]

    def _shard(self, part: list[tuple]) -> None:
        rows, keys, book = [], set(), {k: [] for k in shard.BOOK}
        body = {"_run": [], "history": [], "snapshots": []}
        for _, e, summary, hist, snaps in part:
            name = self.name(e["run_dir"])
            row, cfg_keys = run_row(canonical(e["cfg"]), summary)
            rows.append(row)
            keys |= cfg_keys
            book["_run"].append(name)
            book["_config"].append(orjson.dumps(e["cfg"]).decode())
            book["_summary"].append(orjson.dumps(summary, option=orjson.OPT_SERIALIZE_NUMPY).decode())
            book["_overrides"].append(orjson.dumps(list(self.overrides.get(name) or [])).decode())
            body["_run"].append(name)
            body["history"].append(hist)
            body["snapshots"].append(snaps)
        columns = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r)}
        heads = {**book, **parquet_safe({k: v for k, v in columns.items() if k not in book})}
        sid = f"{self.id}-{self.flushes:05d}"
        self.flushes += 1
        head_raw, body_raw = shard.encode(sid, heads, body, sorted(keys), self.sweep_id, hydra=self.hydra)
        safefs.atomic_write(self.folder / (sid + shard.BODY), body_raw)
        safefs.atomic_write(self.folder / (sid + shard.HEAD), head_raw)  # last: the runs are stored

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoints(self, blobs: dict[str, dict]) -> None:
        """Every unfinished run's state in the job's one checkpoint file (`blobs`: run folder → sealed blob)."""
        for run_dir, blob in blobs.items():
            self.states[self.name(run_dir)] = blob
        self._checkpoint_or_drop()

    def _checkpoint_or_drop(self) -> None:
        import torch  # torch: only a job that trains writes a checkpoint

        path = self.folder / (self.id + shard.CHECKPOINT)
        if self.states:
            states = dict(self.states)
            safefs.write_with(path, lambda fh: torch.save(states, fh))
        else:
            safefs.unlink(path)
        for old, runs in list(self.resumed.items()):  # an earlier job's states, all now stored: gone
            if not runs & set(self.states) and all(_stored(self.sweep, r) for r in runs):
                safefs.unlink(self.folder / old)
                del self.resumed[old]


def _own_sweep_id(sweep: str) -> str:
    """The store's `sweep.id`, made if it has none: a fresh file linked into place, so that of two jobs making
    it at once one wins and both read the winner's (a rename would let the later replace the earlier)."""
    found = sweep_id(sweep)
    if found is not None:
        return found
    safefs.create_once(Path(sweep, STORE, shard.SWEEP_ID), (secrets.token_hex(16) + "\n").encode())
    found = sweep_id(sweep)
    if found is None:
        raise OSError(f"{os.path.join(sweep, STORE, shard.SWEEP_ID)}: not the store's id (32 hex digits); "
                      "remove it only if the store holds no record")
    return found


def _stored(sweep: str, name: str) -> bool:
    return name in index(sweep).runs


def stored_sweep(sweep_dir) -> bool:
    """Is `sweep_dir` a sweep whose runs are stored (it has a store folder)?"""
    return present(sweep_dir)


def earlier_states(job: Writer) -> dict[str, tuple[dict | None, str]]:
    """The training states that earlier jobs' checkpoint files hold for this job's runs: {run: (blob as
    loaded, file)}, the newest file's where two hold a run; each file read as a run folder's checkpoint is (a
    regular file within its cap, `weights_only`), a file that does not load is passed over. Whose state a
    blob is, `results.checked_checkpoint` decides (its seal and config)."""
    import torch  # torch: only a job that resumes runs reads a checkpoint

    entries = {n: s for n, s in listing(job.sweep).items()
               if n.endswith(shard.CHECKPOINT) and shard.ID.match(n[:-len(shard.CHECKPOINT)] + "-00000")
               and n != job.id + shard.CHECKPOINT}
    mine = set(job.paths.values())
    out: dict[str, tuple[dict | None, str]] = {}
    for name in sorted(entries, key=lambda n: entries[n].st_mtime_ns):
        try:
            raw = readers.read_bytes(job.folder / name, CHECKPOINT_CAP, name)
            states = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
            if not isinstance(states, dict):
                raise TypeError("not a mapping of runs to their states")
        except Exception as exc:  # noqa: BLE001 - torn, foreign, planted: it resumes nothing, in one line
            why = getattr(exc, "why", None) or f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
            print(f"not a checkpoint: {job.folder / name}: {why}; it resumes no run", flush=True)
            continue
        held = {r for r in states if isinstance(r, str)}
        for run in held & mine:
            out[run] = (states[run], name)
        if held & mine:
            job.resumed[name] = held
        elif held and all(_stored(job.sweep, r) for r in held):  # a job killed between its flush and its
            safefs.unlink(job.folder / name)                     # checkpoint's removal: nothing left to resume
    return out


def remove_orphans(sweep) -> list[str]:
    """Remove the bodies whose head was never written (a job killed between the two renames of a flush): a
    body alone is no record and nothing reads it. Called by a launch once it holds the sweep's lock, when no
    job of another launch writes the store. Only names a writer makes (`shard.ID`); the names removed."""
    entries = listing(sweep)
    gone = []
    for name, st in entries.items():
        sid = name[:-len(shard.BODY)] if name.endswith(shard.BODY) else None
        if sid is not None and shard.ID.match(sid) and sid + shard.HEAD not in entries and stat.S_ISREG(st.st_mode):
            safefs.unlink(Path(sweep, STORE, name))
            gone.append(name)
    return gone
