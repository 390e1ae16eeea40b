"""Hostile damages to a run folder's contract files, shared by tests/test_hostile.py and tests/test_trust_corpus.py.

`apply(run_dir, name, kind, arg, other, marker)` plants damage `kind` (its variant picked by `arg`) in
`run_dir/name` and says whether the file's content, as the contract reads it, is still the same (only a cut
inside trailing whitespace, or one that leaves every key that can change a result as it was, can be). Nothing
here writes outside the folders it is given, and nothing follows a link it plants.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import yaml

from .conftest import ROOT

SUMMARY, CONFIG, HISTORY, SNAPSHOTS = "summary.json", "config.yaml", "history.jsonl", "snapshots.jsonl"
FILES = (CONFIG, SUMMARY, HISTORY, SNAPSHOTS)
MiB, GiB = 1 << 20, 1 << 30
STATES = ("done", "failed", "diverged", "unfinished", "corrupt")

DEEP = 200_000
DEEP_JSON = "[" * DEEP + "]" * DEEP


def _bomb() -> str:
    """The billion laughs: nine levels of nine aliases, under a kilobyte; a loader that honours aliases
    builds 9**9 (387 million) strings from it."""
    lines = ["lol0: &lol0 [" + ", ".join(['"' + 'lol' * 8 + '"'] * 9) + "]"]
    lines += [f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


ALIAS_BOMB = _bomb()
HUGE_INT = "123456789012345678901234567890"   # 30 digits: beyond int64 and uint64
NONFINITE = ("NaN", "Infinity", "-Infinity", "1e999")


def tag_payload(marker: Path) -> str:
    """A YAML value that a loader honouring tags would turn into `touch marker`."""
    return f'!!python/object/apply:os.system ["touch {marker}"]'


# ------------------------------------------------------------------------------------------ edits of values
def _set_json_field(obj_text: str, key: str, raw: str) -> str:
    """A JSON object's text with `key`'s value replaced by the raw JSON text `raw` (which may be invalid JSON)."""
    obj = json.loads(obj_text)
    obj[key] = "\u0000SENTINEL\u0000"
    return json.dumps(obj).replace(json.dumps(obj[key]), raw)


def set_config_value(text: str, dotted: str, raw: str) -> str:
    """config.yaml's text with the plain scalar of `dotted` (a `key: value` line in its block) replaced by `raw`."""
    *parents, leaf = dotted.split(".")
    lines = text.splitlines(keepends=True)
    indent, start = 0, 0
    for p in parents:
        for i in range(start, len(lines)):
            if lines[i] == " " * indent + p + ":\n":
                start, indent = i + 1, indent + 2
                break
        else:
            raise KeyError(dotted)
    for i in range(start, len(lines)):
        if lines[i].startswith(" " * indent + leaf + ": "):
            lines[i] = f"{' ' * indent}{leaf}: {raw}\n"
            return "".join(lines)
    raise KeyError(dotted)


def _edit_row(text: str, row: int, key: str, raw: str) -> str:
    rows = [ln for ln in text.splitlines() if ln.strip()]
    rows[row % len(rows)] = _set_json_field(rows[row % len(rows)], key, raw)
    return "\n".join(rows) + "\n"


def _replace_row(text: str, row: int, line: str) -> str:
    rows = [ln for ln in text.splitlines() if ln.strip()]
    rows[row % len(rows)] = line
    return "\n".join(rows) + "\n"


# the variants of each damage, by file: what `arg` picks among
SUMMARY_NUM = ("test_acc", "test_loss", "wall_s")
SUMMARY_INT = ("steps", "seed", "eval_step", "wall_s", "test_acc")
CONFIG_NUM = ("optim.lr", "optim.eps", "data.p")
CONFIG_INT = ("seed", "optim.steps", "data.K", "model.M")
WRONG_TYPE = {SUMMARY: [("test_acc", '"high"'), ("steps", '"5"'), ("status", "1"), ("seed", "0.5"),
                        ("parent_positions", '"96"'), ("trap", '"no"')],
              HISTORY: [("step", '"5"'), ("step", "5.0"), ("step", "-1"), ("step", "null"), ("test_acc", '"high"'),
                        ("test_loss", "[1]")],
              SNAPSHOTS: [("step", '"5"'), ("step", "null"), ("step", "2.5")],
              CONFIG: [("optim.steps", "five"), ("data.K", "[6]"), ("seed", "zero"), ("model.M", "{a: 1}"),
                       ("data.p", "high"), ("optim.lr", "'1.0'")]}
ROWS = 6   # a history of this sweep has 6 rows (steps 0..5), its snapshots 4 (0, 1, 2, 5): `row % len` picks one


def variants(name: str, kind: str) -> int:
    """How many variants `kind` has for file `name` (`arg` is taken modulo it; truncation: any byte)."""
    table = {"empty": 1, "nul": 1, "deep": 6, "huge": 1, "link_other": 1, "link_devzero": 1, "fifo": 1,
             "folder": 1, "other_run": 1, "alias_bomb": 2, "tag": 3,
             "nonfinite": len(NONFINITE) * (len(SUMMARY_NUM) if name == SUMMARY else
                                            len(CONFIG_NUM) if name == CONFIG else ROWS),
             "hugeint": (len(SUMMARY_INT) if name == SUMMARY else len(CONFIG_INT) if name == CONFIG else 2 * ROWS),
             "wrongtype": len(WRONG_TYPE[name]) * (1 if name in (SUMMARY, CONFIG) else ROWS)}
    return table[kind]


def kinds(name: str) -> list[str]:
    """The damages of a file besides truncation (the YAML-only ones for config.yaml)."""
    out = ["empty", "nul", "deep", "huge", "nonfinite", "hugeint", "wrongtype", "link_other", "link_devzero",
           "fifo", "folder", "other_run"]
    return out + (["alias_bomb", "tag"] if name == CONFIG else [])


class Planted(NamedTuple):
    same: bool   # the file's content, as the contract reads it, is unchanged
    what: str    # the damage, in words (for a failure's message)


def apply(run_dir: Path, name: str, kind: str, arg: int, other: Path, marker: Path) -> Planted:
    """Plant damage `kind` (variant `arg`) in `run_dir/name`; `other` is another finished run's folder, `marker` the
    path a tag would create."""
    f = Path(run_dir) / name
    text = f.read_text()
    size = len(text.encode())
    n = arg
    if kind == "truncate":
        cut = arg % size
        os.truncate(f, cut)
        return Planted(_same_content(name, text, text.encode()[:cut].decode("utf-8", "replace")),
                       f"{name} cut to its first {cut} of {size} bytes")
    what = kind
    if kind == "empty":
        f.write_bytes(b"")
    elif kind == "nul":
        f.write_bytes(b"\0" * size)
        what = f"{size} NUL bytes"
    elif kind == "deep":
        depth = (65, 1000, DEEP)[n % 3]
        deep = "[" * depth + "]" * depth
        whole = n // 3 % 2 == 0   # the whole file, or one value in it
        if name == CONFIG:
            f.write_text(deep + "\n" if whole else text + f"deep: {deep}\n")
        elif name == SUMMARY:
            f.write_text(deep if whole else _set_json_field(text, "test_acc", deep))
        else:
            f.write_text(_replace_row(text, n, deep) if whole else _edit_row(text, n, "deep", deep))
        what = f"{'the whole file' if whole else 'a value'} nested {depth} deep"
    elif kind == "huge":
        os.truncate(f, 2 * GiB)        # sparse: no disk, no time
        what = "a 2 GiB sparse file"
    elif kind == "nonfinite":
        bad = NONFINITE[n % len(NONFINITE)]
        n //= len(NONFINITE)
        if name == SUMMARY:
            key = SUMMARY_NUM[n % len(SUMMARY_NUM)]
            f.write_text(_set_json_field(text, key, bad))
        elif name == CONFIG:
            key, bad = CONFIG_NUM[n % len(CONFIG_NUM)], {"NaN": ".nan", "Infinity": ".inf", "-Infinity": "-.inf",
                                                         "1e999": "1.0e999"}[bad]
            f.write_text(set_config_value(text, key, bad))
        elif name == HISTORY:
            key = f"row {n % ROWS}: test_acc"
            f.write_text(_edit_row(text, n, "test_acc", bad))
        else:
            key, bad = f"row {n % 4}: a", f"[{bad}, 0.0]"
            f.write_text(_edit_row(text, n, "a", bad))
        what = f"{key}={bad}"
    elif kind == "hugeint":
        if name == SUMMARY:
            key = SUMMARY_INT[n % len(SUMMARY_INT)]
            f.write_text(_set_json_field(text, key, HUGE_INT))
        elif name == CONFIG:
            key = CONFIG_INT[n % len(CONFIG_INT)]
            f.write_text(set_config_value(text, key, HUGE_INT))
        else:   # a row's step, or a metric of a row
            field = "step" if n % 2 else ("test_acc" if name == HISTORY else "V")
            key = f"row {n // 2 % (ROWS if name == HISTORY else 4)}: {field}"
            f.write_text(_edit_row(text, n // 2, field, HUGE_INT))
        what = f"{key}={HUGE_INT}"
    elif kind == "wrongtype":
        key, raw = WRONG_TYPE[name][n % len(WRONG_TYPE[name])]
        if name == SUMMARY:
            f.write_text(_set_json_field(text, key, raw))
        elif name == CONFIG:
            f.write_text(set_config_value(text, key, raw))
        else:   # variant 0 of the row: the last one (a done summary is checked against it); else an earlier row
            back = n // len(WRONG_TYPE[name])
            f.write_text(_edit_row(text, -1 - back, key, raw))
            key = f"{'the last row' if back == 0 else f'row -{1 + back}'}: {key}"
        what = f"{key}={raw}"
    elif kind == "link_other":
        f.unlink()
        f.symlink_to(Path(other) / name)
        what = f"a link to {Path(other) / name}"
    elif kind == "link_devzero":
        f.unlink()
        f.symlink_to("/dev/zero")
        what = "a link to /dev/zero"
    elif kind == "fifo":
        f.unlink()
        os.mkfifo(f)
        what = "a FIFO"
    elif kind == "folder":
        f.unlink()
        f.mkdir()
        (f / name).write_text(text)   # the genuine file, one level down
        what = "a folder"
    elif kind == "other_run":
        f.unlink()
        shutil.copyfile(Path(other) / name, f)
        what = f"a copy of {Path(other) / name}"
    elif kind == "alias_bomb":
        nested = "bomb:\n" + "".join(f"  {ln}\n" for ln in ALIAS_BOMB.splitlines())
        f.write_text(ALIAS_BOMB if n % 2 == 0 else text + nested)
        what = "an alias bomb" + ("" if n % 2 == 0 else " under a key of its own")
    elif kind == "tag":
        payload = tag_payload(marker)
        f.write_text((f"{payload}\n", set_config_value(text, "seed", payload), text + f"evil: {payload}\n")[n % 3])
        what = ("a tag as the whole file", "a tag as seed's value", "a tag under a key of its own")[n % 3]
    else:
        raise ValueError(kind)
    return Planted(False, f"{name}: {what}")


def _json_rows(text: str) -> list:
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def _same_content(name: str, before: str, after: str) -> bool:
    """Does a cut file read as the original did? JSON files: the same values; config.yaml: the same run
    (`results.identity`: keys that cannot change a result, such as wandb.*, do not count) and still valid."""
    try:
        if name == SUMMARY:
            return json.loads(after) == json.loads(before)
        if name in (HISTORY, SNAPSHOTS):
            return _json_rows(after) == _json_rows(before)
        from rw_sweeps.core import contract, results

        got = yaml.safe_load(after)   # a prefix of a plain config this project wrote: safe to load
        return (isinstance(got, dict) and contract.config_problem(got) is None
                and results.identity(got) == results.identity(yaml.safe_load(before)))
    except Exception:  # noqa: BLE001 - unreadable: not the same
        return False


# ------------------------------------------------------------------------------------------ bounded calls
class Hung(AssertionError):
    pass


def within(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs) in a daemon thread: its value (or its exception, raised again), or Hung after `seconds`
    (a call stuck on a FIFO cannot be stopped, but as a daemon thread it does not keep the test process alive)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise Hung(f"{getattr(fn, '__name__', fn)} did not return within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux


_MEASURED = """
import atexit, runpy, sys
# VmHWM is this image's own peak: getrusage's ru_maxrss survives execve, so after subprocess's vfork it would
# report the test runner's peak whenever that is larger.
def _peak():
    with open("/proc/self/status") as f:
        kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    print(f"MAXRSS_KB {kb}", file=sys.stderr)
atexit.register(_peak)
what, sys.argv = sys.argv[1], sys.argv[1:]
if what.endswith(".py"):
    runpy.run_path(what, run_name="__main__")
else:
    runpy.run_module(what, run_name="__main__", alter_sys=True)
"""


def run_measured(what: str, *args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """`python launch.py ARGS` (what="launch.py") or `python -m MODULE ARGS` in a subprocess that reports its own
    peak resident memory: (the completed process with that line taken out of its stderr, the peak in MB)."""
    target = str(ROOT / what) if what.endswith(".py") else what
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-c", _MEASURED, target, *args], cwd=ROOT, env=env, text=True,
                       capture_output=True, timeout=timeout)
    lines = r.stderr.splitlines()
    peak = [int(ln.split()[1]) for ln in lines if ln.startswith("MAXRSS_KB ")]
    r.stderr = "".join(ln + "\n" for ln in lines if not ln.startswith("MAXRSS_KB "))
    assert peak, r.stderr[-2000:]
    return r, peak[-1] / 1024


# ------------------------------------------------------------------------------------------ sweeps
def copy_sweep(src: Path, dst: Path) -> Path:
    """A copy of a finished sweep folder (without its analysis cache)."""
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("runs.parquet", ".runs.parquet.seal"))
    return dst


def retraining_lines(stdout: str) -> dict[str, str]:
    """{folder: why} of a launch's `retraining <folder>: <why>` lines (each folder once: asserted)."""
    out: dict[str, str] = {}
    for ln in stdout.splitlines():
        if ln.startswith("retraining "):
            folder, why = ln[len("retraining "):].split(": ", 1)
            assert folder not in out, f"{folder} said twice:\n{stdout}"
            out[folder] = why
    return out


def regular_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under a folder, by relative path, read without following links (FIFOs are skipped)."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(folder))] = p.read_bytes()
    return out
