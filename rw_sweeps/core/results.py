"""The run-folder contract (README, "Results"): config.yaml, summary.json, history.jsonl, snapshots.jsonl,
and the checkpoint.pt of an unfinished run.

Every file goes through the one atomic writer (`rw_sweeps.core.safefs`: a fresh temp name opened with
O_EXCL|O_NOFOLLOW, then a rename), so a reader (or a resumed sweep) never sees half a file and a planted
link is never followed; a run's summary.json is written right after its own files and marks it finished.
Checkpoints hold only tensors and plain data and are loaded with `weights_only=True`: a planted pickle
cannot run code.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import yaml

from .safefs import atomic_write, read_bytes, write_with
from .yamltext import Templates

from . import contract
from .contract import CHECKPOINT, CONFIG, HISTORY, SNAPSHOTS, SUMMARY  # noqa: F401 - the contract's names
from .readers import Broken


def run_id(run_dir: Path) -> str:
    """Deterministic per folder, so a re-run or requeued job continues the same wandb run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


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
    """The run's summary if it meets the contract (`contract.read_summary`), else None (missing or broken)."""
    try:
        return contract.read_summary(run_dir)
    except (FileNotFoundError, Broken):
        return None


def read_config(run_dir: Path) -> dict | None:
    """The run's config.yaml as a mapping if it can be read under the contract, else None (missing or broken:
    a link, a FIFO, too large, bad YAML, an anchor or alias, not a mapping)."""
    try:
        return contract.read_config(run_dir)
    except (FileNotFoundError, Broken):
        return None


# Where a run is logged, how often it is saved and what number its task returns: never what it computes, so
# a run that differs only in these is the same run (found done, resumed from its checkpoint).
NOT_RESULTS = ("checkpoint_every", "objective", "wandb")


def identity(cfg: dict) -> dict:
    """The part of a run's config that determines its results, as the current schemas state it."""
    from .config import canonical

    return {k: v for k, v in canonical(cfg).items() if k not in NOT_RESULTS}


def same_run(a: dict | None, b: dict | None) -> bool:
    """Two configs train the same run: equal but for `NOT_RESULTS`."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return identity(a) == identity(b)


def differing_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs (`NOT_RESULTS` left out at the top)."""
    if not prefix:
        a, b = identity(a), identity(b)
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differing_keys(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}")
    return out


def save_checkpoint(run_dir: Path, blob: dict) -> None:
    """The training state of an unfinished run (`rw_sweeps.core.training.checkpoint`: tensors and plain data)."""
    import torch

    write_with(Path(run_dir) / CHECKPOINT, lambda fh: torch.save(blob, fh))


def has_checkpoint(run_dir: Path) -> bool:
    """Is there anything at the checkpoint's name (one stat; `load_checkpoint` judges what it is)?"""
    return os.path.lexists(Path(run_dir) / CHECKPOINT)


def load_checkpoint(cfg: dict, run_dir: Path) -> dict | None:
    """A run's checkpoint if it exists and belongs to this config (`same_run`), else None. It is read with
    `weights_only=True` (tensors and plain containers only: a pickle that would run code is refused) and
    never through a link planted at its name."""
    import io

    import torch

    try:
        raw = read_bytes(Path(run_dir) / CHECKPOINT)
    except OSError:  # missing, or a link: start over
        return None
    try:
        blob = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a torn, foreign or code-carrying file: start over
        return None
    return blob if isinstance(blob, dict) and same_run(blob.get("config"), cfg) else None


def drop_checkpoint(run_dir: Path) -> None:
    (Path(run_dir) / CHECKPOINT).unlink(missing_ok=True)
