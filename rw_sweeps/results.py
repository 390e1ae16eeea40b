"""The run-folder contract (README, "Results"): config.yaml, summary.json, history.jsonl, snapshots.jsonl.

Every file is written to a temporary name in the same folder and renamed into place, so a reader (or a
resumed sweep) never sees half a file; summary.json is written last and marks the run as finished.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import yaml

SUMMARY, CONFIG, HISTORY, SNAPSHOTS = "summary.json", "config.yaml", "history.jsonl", "snapshots.jsonl"


def atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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
    """The run's summary, or None when it is missing or unreadable (an unfinished run)."""
    try:
        return json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None


def read_config(run_dir: Path) -> dict | None:
    try:
        return yaml.safe_load((Path(run_dir) / CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return None


def same_run(a: dict | None, b: dict | None) -> bool:
    """Two configs train the same run: equal but for where they are logged (wandb settings)."""
    if a is None or b is None:
        return False
    return {k: v for k, v in a.items() if k != "wandb"} == {k: v for k, v in b.items() if k != "wandb"}
