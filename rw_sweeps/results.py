"""The run-folder contract (README, "Results"): config.yaml, summary.json, history.jsonl, snapshots.jsonl,
and the checkpoint.pt of an unfinished run.

Every file is written to a temporary name in the same folder and renamed into place, so a reader (or a
resumed sweep) never sees half a file; summary.json is written last and marks the run as finished. Files
get the permissions the umask allows (group-readable on a shared file system), as `open` would give them.
Writing costs a few syscalls per file: no temp-file module, no mkdir unless the folder is missing.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import secrets
from pathlib import Path

import yaml

from .yamltext import Templates

SUMMARY, CONFIG, HISTORY, SNAPSHOTS, CHECKPOINT = ("summary.json", "config.yaml", "history.jsonl",
                                                   "snapshots.jsonl", "checkpoint.pt")


def run_id(run_dir: Path) -> str:
    """Deterministic per folder, so a re-run or requeued job continues the same wandb run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


_HOST_TOKEN = secrets.token_hex(4)  # with the pid and a counter: temp names unique per write, across hosts
_count = itertools.count()


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to a temp name in the same folder (created if need be), then rename it into place.
    os.open's mode goes through the umask, as open()'s does."""
    path = Path(path)
    tmp = f"{path.parent}/.{path.name}.{os.getpid()}-{_HOST_TOKEN}-{next(_count)}.tmp"
    data = text.encode("utf-8")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
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


try:  # 10–20× faster float formatting; writes NaN/inf as null itself
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; the standard library gives the same values
    orjson = None


def _json(x) -> str:
    """json.dumps with NaN/inf as null. The common case has none: dump once, and clean only a row whose
    text shows one (a string that merely contains the word costs a second, exact pass, nothing more)."""
    text = json.dumps(x)
    if "NaN" in text or "Infinity" in text:
        text = json.dumps(clean(x), allow_nan=False)
    return text


def _jsonl(rows: list[dict]) -> str:
    """One JSON object per line (compact separators with orjson; the same values either way)."""
    if orjson is not None:
        return b"".join([orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows]).decode()
    return "".join([_json(r) + "\n" for r in rows])


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 4× faster, the same YAML
_configs = Templates(lambda d: yaml.dump(d, Dumper=_Dumper, sort_keys=False))  # a grid's configs share a shape


def write_config(run_dir: Path, cfg: dict) -> None:
    atomic_write(Path(run_dir) / CONFIG, _configs.text(cfg))


def write_run(run_dir: Path, cfg: dict, history: list[dict], snapshots: list[dict]) -> None:
    """Everything but the summary, which `write_summary` adds last: its presence marks the run finished."""
    run_dir = Path(run_dir)
    write_config(run_dir, cfg)
    atomic_write(run_dir / HISTORY, _jsonl(history))
    atomic_write(run_dir / SNAPSHOTS, _jsonl(snapshots))


def write_summary(run_dir: Path, summary: dict) -> None:
    atomic_write(Path(run_dir) / SUMMARY, json.dumps(clean(summary), indent=1, allow_nan=False) + "\n")


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
