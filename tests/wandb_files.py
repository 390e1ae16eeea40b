"""Read a real offline wandb run file (`run-<id>.wandb`): a LevelDB-style log of protobuf Records.

wandb ≥ 0.20 no longer ships a Python reader; the format is stable: a 7-byte header (":W&B", magic, version),
then 32 KiB blocks of records, each a 7-byte header (crc32, length, type: full/first/middle/last).
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK, HEADER = 32768, 7


def records(path: Path) -> list:
    buf = Path(path).read_bytes()
    assert buf[:4] == b":W&B", "not a wandb run file"
    pos, out, frag = 7, [], b""
    while pos + HEADER <= len(buf):
        if BLOCK - pos % BLOCK < HEADER:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", buf[pos:pos + HEADER])
        pos += HEADER
        data, pos = buf[pos:pos + length], pos + length
        if kind == 0 and length == 0:
            break
        if kind == 1:
            out.append(data)
        elif kind == 2:
            frag = data
        elif kind == 3:
            frag += data
        elif kind == 4:
            out.append(frag + data)
    recs = []
    for d in out:
        r = pb.Record()
        r.ParseFromString(d)
        recs.append(r)
    return recs


def finished(path: Path, timeout_s: float = 30.0) -> list:
    """The records of a finished run's file, once they end with its `exit` record: wandb's service process
    (wandb-core) may still be writing the file when `run.finish()` has returned (seen: a 7-byte file, its
    header alone, read right after `tracking.wait()`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = records(path)
        if recs and recs[-1].WhichOneof("record_type") == "exit" or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(run_dir: Path) -> dict:
    """The run's id, group, job type, tags, name, config, history rows and final summary, from its .wandb file."""
    files = sorted(Path(run_dir).glob("wandb/*run-*/run-*.wandb"))
    assert files, f"no wandb run file under {run_dir}"
    info = {"history": [], "summary": {}, "config": {}}
    for r in finished(files[-1]):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            info.update(id=r.run.run_id, group=r.run.run_group, job_type=r.run.job_type, tags=list(r.run.tags),
                        project=r.run.project, name=r.run.display_name)
            info["config"].update({_key(i): json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            info["config"].update({_key(i): json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            info["history"].append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            info["summary"].update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    return info


def read_table(run_dir: Path, key: str) -> list[dict]:
    """The rows (column → value) of the wandb.Table the run logged under `key`, from the file its offline
    run holds (the summary's `<key>/path`)."""
    files = sorted(Path(run_dir).glob("wandb/*run-*"))
    assert files, f"no wandb run under {run_dir}"
    path = read_run(run_dir)["summary"][f"{key}/path"]
    table = json.loads((files[-1] / "files" / path).read_text())
    return [dict(zip(table["columns"], row)) for row in table["data"]]
