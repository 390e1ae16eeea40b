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
import io
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import yaml

from . import contract, readers, seal
from .config import canonical
from .contract import CHECKPOINT, CONFIG, HISTORY, SNAPSHOTS, SUMMARY  # noqa: F401 - the contract's names
from .readers import Broken, GiB
from . import safefs
from .safefs import atomic_write, write_with
from .yamltext import Templates


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


def jsonl(rows: list[dict]) -> str:
    """One JSON object per line (compact separators with orjson; the same values either way)."""
    if orjson is not None:
        return b"".join([orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows]).decode()
    return "".join([_json(r) + "\n" for r in rows])


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 4× faster, the same YAML
_configs = Templates(lambda d: yaml.dump(d, Dumper=_Dumper, sort_keys=False))  # a grid's configs share a shape


def config_text(cfg: dict) -> str:
    """config.yaml's text for a run's config."""
    return _configs.text(cfg)


def write_config(run_dir: Path, cfg: dict) -> None:
    atomic_write(Path(run_dir) / CONFIG, config_text(cfg))


def write_run(run_dir: Path, cfg: dict, history: list[dict], snapshots: list[dict]) -> None:
    """Everything but the summary, which `write_summary` adds last: its presence marks the run finished."""
    run_dir = Path(run_dir)
    write_config(run_dir, cfg)
    atomic_write(run_dir / HISTORY, jsonl(history))
    atomic_write(run_dir / SNAPSHOTS, jsonl(snapshots))


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


CHECKPOINT_CAP = 64 * GiB  # read whole into memory; only a regular file is read, never a FIFO or device


def save_checkpoint(run_dir: Path, blob: dict) -> None:
    """The training state of an unfinished run (`rw_sweeps.core.training.checkpoint`: tensors and plain data),
    sealed (`rw_sweeps.core.seal`) over its config's identity, its folder's run_id and every value it holds:
    `load_checkpoint` resumes only what this user's code wrote for this run in this folder."""
    import torch  # torch: only where a run trains

    sealed = sealed_checkpoint(blob, run_dir)
    write_with(Path(run_dir) / CHECKPOINT, lambda fh: torch.save(sealed, fh))


def sealed_checkpoint(blob: dict, run_dir: Path) -> dict:
    """The training state with its seal, for the run of `run_dir` (a folder's file, or a job's store file)."""
    blob = {k: v for k, v in blob.items() if k != "seal"}
    return {**blob, "seal": seal.seal(*_sealed_parts(blob, run_dir))}


def has_checkpoint(run_dir: Path) -> bool:
    """Is there anything at the checkpoint's name (one stat; `load_checkpoint` judges what it is)?"""
    return safefs.lexists(Path(run_dir) / CHECKPOINT)


def _say(line: str) -> None:
    print(line, flush=True)


def load_checkpoint(cfg: dict, run_dir: Path, say=_say) -> dict | None:
    """The run's checkpoint if it is this run's own, else None: read as a regular file only (never through a
    link, never a FIFO), loaded with `weights_only=True` (tensors and plain containers: a pickle that would run
    code is refused), its seal verified (written by this user's code for this folder, not edited since) and its
    config this run's (`same_run`). A checkpoint refused is one line through `say` — `<run_dir>: its checkpoint
    is not this run's (<why>); starting over` (stdout; `say=None`: silent) — and the run starts over (its next
    checkpoint replaces the file)."""
    blob, why = _read_checkpoint(cfg, Path(run_dir))
    if why is not None and say is not None:
        say(f"{run_dir}: its checkpoint is not this run's ({why}); starting over")
    return blob


def _read_checkpoint(cfg: dict, run_dir: Path) -> tuple[dict | None, str | None]:
    """(the checkpoint, None) if it is this run's own, else (None, why); (None, None) if there is none."""
    import torch  # torch: only where a run trains

    try:
        fh, st = readers.open_regular(run_dir / CHECKPOINT, CHECKPOINT)  # a regular file, no link, never blocking
        with fh:
            if st.st_size > CHECKPOINT_CAP:
                raise Broken(run_dir / CHECKPOINT, f"{CHECKPOINT} is {st.st_size:,} bytes; its cap is {CHECKPOINT_CAP:,}")
            raw = fh.read(st.st_size + 1)
        if len(raw) != st.st_size:
            return None, "it changed while it was read"
    except FileNotFoundError:
        return None, None
    except (Broken, OSError) as exc:  # a link, a FIFO, a folder, over its cap, unreadable
        return None, _reason(exc.why if isinstance(exc, Broken) else str(exc))
    try:
        blob = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torn, foreign, or a pickle that would run code
        return None, _reason(f"it does not load as tensors and plain data: {type(exc).__name__}")
    return checked_checkpoint(blob, cfg, run_dir)


def checked_checkpoint(blob, cfg: dict, run_dir: Path) -> tuple[dict | None, str | None]:
    """(the state, None) if `blob`, as loaded, is this run's own: sealed for `run_dir` by this user's code, of
    this config; else (None, why)."""
    if not isinstance(blob, dict) or not isinstance(blob.get("config"), dict):
        return None, "not a checkpoint: no config"
    stored = blob.pop("seal", None)
    if stored is None:
        return None, "it has no seal"
    try:
        parts = _sealed_parts(blob, run_dir)
        verified = seal.verify(stored, *parts)
    except Exception as exc:  # noqa: BLE001 - a config the schemas cannot read, a value no checkpoint holds, no key
        return None, _reason(f"it cannot be checked: {type(exc).__name__}: {exc}")
    if not verified:
        return None, "its seal does not verify: edited, or written for another folder or by another user"
    if not same_run(blob["config"], cfg):
        changed = differing_keys(blob["config"], cfg)
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return None, f"a run of another config: {', '.join(changed[:3]) or 'its config'}{more} differ"
    return blob, None


def _reason(text: str, cap: int = 200) -> str:
    """A refusal's reason on one short line."""
    text = " ".join(str(text).split())
    return text if len(text) <= cap else text[:cap - 1] + "…"


def _sealed_parts(blob: dict, run_dir: Path) -> tuple[bytes, ...]:
    """What a checkpoint's seal is over (the blob without its `seal` key, written for `run_dir`): the identity
    of its config as sorted JSON, the folder's run_id and the digest of every value it holds (`digest`)."""
    who = json.dumps(identity(blob["config"]), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return b"rw-sweeps checkpoint", who.encode(), run_id(run_dir).encode(), digest(blob)


def digest(value) -> bytes:
    """SHA-256 of a canonical encoding of plain data and tensors, walked in a fixed order: mappings by sorted
    key, sequences in order, every tensor by dtype, shape and bytes, every scalar by type and exact value (a
    float by its 8 bytes). Two values digest alike only if they hold the same things; a type it does not know
    raises TypeError."""
    h = hashlib.sha256()
    _walk(value, h.update)
    return h.digest()


def _walk(x, put) -> None:
    import torch  # torch: only where a run trains

    def walk(x) -> None:
        if x is None:
            put(b"N")
        elif isinstance(x, bool):
            put(b"T" if x else b"F")
        elif isinstance(x, int):
            text = str(x).encode()
            put(b"i%d:" % len(text) + text)
        elif isinstance(x, float):
            put(b"f" + struct.pack("<d", x))
        elif isinstance(x, str):
            text = x.encode("utf-8", "surrogatepass")
            put(b"s%d:" % len(text) + text)
        elif isinstance(x, (bytes, bytearray)):
            put(b"b%d:" % len(x) + bytes(x))
        elif isinstance(x, dict):
            items = sorted(x.items(), key=lambda kv: (type(kv[0]).__name__, str(kv[0])))
            put(b"d%d:" % len(items))
            for k, v in items:
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            if all(type(v) is float for v in x):  # the common case (a history's, a snapshot's numbers): one pass
                put(b"v%d:" % len(x) + struct.pack(f"<{len(x)}d", *x))
                return
            put(b"l%d:" % len(x))
            for v in x:
                walk(v)
        elif isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous().reshape(-1)
            head = f"{t.dtype}{tuple(x.shape)}".encode()
            put(b"t%d:" % len(head) + head)
            put(t.view(torch.uint8).numpy().data if t.numel() else b"")
        elif isinstance(x, np.ndarray):
            head = f"{x.dtype.str}{x.shape}".encode()
            put(b"a%d:" % len(head) + head)
            put(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, np.generic):
            walk(x.item())
        else:
            raise TypeError(f"a checkpoint holds no {type(x).__name__}")

    walk(x)


def drop_checkpoint(run_dir: Path) -> None:
    safefs.unlink(Path(run_dir) / CHECKPOINT)
