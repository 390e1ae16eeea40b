"""The run-folder contract (README, "Results"): config.yaml, summary.json, history.jsonl, snapshots.jsonl,
and the checkpoint.pt of an unfinished run.

Every file is written to a temporary name in the same folder and renamed into place, so a reader (or a
resumed sweep) never sees half a file; summary.json is written last and marks the run as finished. Files
get the permissions the umask allows (group-readable on a shared file system), as `open` would give them.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import yaml

SUMMARY, CONFIG, HISTORY, SNAPSHOTS, CHECKPOINT = ("summary.json", "config.yaml", "history.jsonl",
                                                   "snapshots.jsonl", "checkpoint.pt")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's own 0600 would hide results from the group


def run_id(run_dir: Path) -> str:
    """Deterministic per folder, so a re-run or requeued job continues the same wandb run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clean(x):
    """JSON has no NaN/inf: write them as null (the status field says why)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(clean(r)) + "\n" for r in rows)


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 4× faster, the same YAML


def write_config(run_dir: Path, cfg: dict) -> None:
    atomic_write(Path(run_dir) / CONFIG, yaml.dump(cfg, Dumper=_Dumper, sort_keys=False))


def write_run(run_dir: Path, cfg: dict, history: list[dict], snapshots: list[dict]) -> None:
    """Everything but the summary, which `write_summary` adds last: its presence marks the run finished."""
    run_dir = Path(run_dir)
    write_config(run_dir, cfg)
    atomic_write(run_dir / HISTORY, _jsonl(history))
    atomic_write(run_dir / SNAPSHOTS, _jsonl(snapshots))


def write_summary(run_dir: Path, summary: dict) -> None:
    atomic_write(Path(run_dir) / SUMMARY, json.dumps(clean(summary), indent=1) + "\n")


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary, or None when it is missing, unreadable or not a JSON object (an unfinished run)."""
    try:
        s = json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def read_config(run_dir: Path) -> dict | None:
    """The run's config, or None when it is missing, unreadable (bad bytes, bad YAML) or not a mapping."""
    try:
        c = yaml.safe_load((Path(run_dir) / CONFIG).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return c if isinstance(c, dict) else None


def complete(run_dir: Path) -> bool:
    """Every file of the contract is there and parses: a summary says `done` only together with them."""
    for name in (HISTORY, SNAPSHOTS):
        try:
            with open(Path(run_dir) / name, encoding="utf-8") as fh:
                for line in fh:
                    if not isinstance(json.loads(line), dict):
                        return False
        except (OSError, ValueError):
            return False
    return True


def same_run(a: dict | None, b: dict | None) -> bool:
    """Two configs train the same run: equal but for where they are logged (wandb settings)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return {k: v for k, v in a.items() if k != "wandb"} == {k: v for k, v in b.items() if k != "wandb"}


def save_checkpoint(run_dir: Path, blob: dict) -> None:
    """The training state of an unfinished run (`rw_sweeps.training.checkpoint`), written atomically."""
    import torch

    path = Path(run_dir) / CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{CHECKPOINT}.{os.getpid()}.tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_checkpoint(cfg: dict, run_dir: Path) -> dict | None:
    """A run's checkpoint if it exists and belongs to this exact config (else it is ignored)."""
    import torch

    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - a torn or foreign file: start over
        return None
    return blob if isinstance(blob, dict) and same_run(blob.get("config"), cfg) else None


def drop_checkpoint(run_dir: Path) -> None:
    (Path(run_dir) / CHECKPOINT).unlink(missing_ok=True)
