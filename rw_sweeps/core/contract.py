"""The run-folder contract: what each file a run writes holds, and the one judgement of a finished run.

A run folder (README, "Results") holds `config.yaml`, `summary.json`, `history.jsonl`, `snapshots.jsonl`
and, while unfinished, `checkpoint.pt`. Each is read through `rw_sweeps.core.readers` (regular files only,
capped, strict JSON, plain YAML) and checked against the format below. `judge` is the one function that
says what a folder holds — the launcher (placement, skip), `run.done_summary`, analysis, status and the
wandb export all ask it, so they cannot disagree:

- **done**: a valid summary with status `done`; a valid config (its schema, read without opening any file
  it names: the recorded `data.Pi` serves for `data.Pi_file`); the summary's copies of config keys equal
  the config's; a history whose steps rise from its first row to the last, which is the summary's
  `steps` and `eval_step` and the config's `optim.steps`, with the summary's metrics equal to that row's;
  snapshots that parse, each at a step;
- **failed** / **diverged**: a valid summary with that status and a valid config (retrained on a relaunch,
  shown by analysis);
- **unfinished**: no summary yet;
- **corrupt**: anything else, with one line saying why (retrained on a relaunch, listed by analysis).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import readers
from .config import canonical, stored
from .errors import ConfigError
from .readers import Broken, GiB, KiB, MiB
from .summary_fields import ECHOES, SUMMARY_FIELDS, Field  # noqa: F401 - the format this contract checks

SUMMARY, CONFIG, HISTORY, SNAPSHOTS, CHECKPOINT = ("summary.json", "config.yaml", "history.jsonl",
                                                   "snapshots.jsonl", "checkpoint.pt")

# Size caps, each far above what a run writes (a summary is ~1 KB, a config ~1 KB plus data.Pi, a history
# row ~0.3 KB, a snapshot row K² floats): memory is bounded by these, whatever is planted.
CAPS = {SUMMARY: 1 * MiB, CONFIG: 16 * MiB}
LINE_CAPS = {HISTORY: 1 * MiB, SNAPSHOTS: 32 * MiB}  # a snapshot row of K = 1,000 (V alone) is ~20 MB
FILE_CAPS = {HISTORY: 1 * GiB, SNAPSHOTS: 8 * GiB}
RECORD_CAP = 256 * MiB  # a sweep's `.rw_sweep.json` (100,000 runs is ~5 MB)
LOCK_CAP = 64 * KiB     # a lock's holder record
STATUSES = ("done", "failed", "diverged")


def check_summary(s, path) -> dict:
    """The summary if it meets the contract (every required field there, every known field of its type and
    bounds; a field older versions did not write may be missing), else Broken naming the first field that
    does not."""
    if not isinstance(s, dict):
        raise Broken(path, "summary.json is not a JSON object")
    for key, f in SUMMARY_FIELDS.items():
        if key not in s:
            if f.required:
                raise Broken(path, f"summary.json has no {key!r}")
            continue
        bad = f.check(s[key])
        if bad:
            raise Broken(path, f"summary.json: {key}={_show(s[key])} {bad}")
    if s["status"] not in STATUSES:
        raise Broken(path, f"summary.json: status={_show(s['status'])} is not one of {', '.join(STATUSES)}")
    return s


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "…"


# ------------------------------------------------------------------------------------------ the files
def read_summary(run_dir) -> dict:
    """The run's summary, checked (`check_summary`); FileNotFoundError if there is none, Broken if bad."""
    path = Path(run_dir) / SUMMARY
    return check_summary(readers.read_json(path, CAPS[SUMMARY], SUMMARY), path)


def read_config(run_dir) -> dict:
    """The run's config.yaml as a mapping (its schema is `config_valid`'s to judge); FileNotFoundError or
    Broken."""
    path = Path(run_dir) / CONFIG
    cfg = readers.read_yaml(path, CAPS[CONFIG], CONFIG)
    if not isinstance(cfg, dict):
        raise Broken(path, "config.yaml is not a mapping")
    return cfg


def config_problem(cfg: dict) -> str | None:
    """None if a stored config meets its schema (read as `config.stored` reads it: no file it names is
    opened), else the one-line reason."""
    try:
        stored(cfg)
    except (ConfigError, TypeError, ValueError, OverflowError) as e:
        return f"config.yaml does not meet the schema ({' '.join(str(e).split())[:200]})"
    return None


def rows(run_dir, name: str):
    """The JSON objects of a `.jsonl` file of the contract, each checked (readers' rules), each a mapping
    with an integer `step` >= 0; Broken otherwise."""
    path = Path(run_dir) / name
    for n, line in enumerate(readers.lines(path, LINE_CAPS[name], FILE_CAPS[name], name), 1):
        if not line.strip():
            continue
        row = readers.json_value(line, path, f"{name} line {n}")
        if not isinstance(row, dict):
            raise Broken(path, f"{name} line {n} is not a JSON object")
        step = row.get("step")
        if type(step) is not int or step < 0:
            raise Broken(path, f"{name} line {n}: step={_show(step)} must be an integer >= 0")
        yield row


def job_number(name: str) -> int | None:
    """The job number a run folder's name is (Hydra's `${hydra.job.num}`: ASCII digits only), or None. Not
    `str.isdigit`, which accepts '²' and '٣' (that `int` refuses, or reads as another job's number)."""
    return int(name) if name.isascii() and name.isdigit() else None


def _dotted(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _same(a, b) -> bool:
    if type(a) in (int, float) and type(b) in (int, float):
        return float(a) == float(b)
    return a == b


# ------------------------------------------------------------------------------------------ the judgement
@dataclass(frozen=True)
class Verdict:
    """What a run folder holds: `state` is done | failed | diverged | unfinished | corrupt; `summary` and
    `config` are the checked files (None where they are not valid); `why` says why a folder is not done."""
    state: str
    summary: dict | None = None
    config: dict | None = None
    why: str | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"


def judge(run_dir, config: dict | None = None) -> Verdict:
    """The one judgement of a run folder (see the module's doc). `config`: its config.yaml, if already read
    and found valid by the caller (placement reads every folder's config once)."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink():  # O_NOFOLLOW guards a file's own name only: a linked folder is refused here
        return Verdict("corrupt", why="the run folder is a symbolic link; it is not followed")
    try:
        summary = read_summary(run_dir)
    except FileNotFoundError:
        return Verdict("unfinished", why="no summary.json")
    except Broken as e:
        return Verdict("corrupt", why=e.why)
    if config is None:
        try:
            config = read_config(run_dir)
        except FileNotFoundError:
            return Verdict("corrupt", summary, why="no config.yaml")
        except Broken as e:
            return Verdict("corrupt", summary, why=e.why)
        problem = config_problem(config)
        if problem:
            return Verdict("corrupt", summary, why=problem)
    config = canonical(config)  # a key the file lacks, at its schema default (as the launcher reads it)
    for key, dotted in ECHOES.items():
        there = _dotted(config, dotted)
        if summary.get(key) is not None and there is not _MISSING and there is not None and not _same(summary[key], there):
            return Verdict("corrupt", summary, config, f"summary.json says {key}={_show(summary[key])}, "
                                                        f"config.yaml says {dotted}={_show(there)}")
    if summary["status"] != "done":
        return Verdict(summary["status"], summary, config, why=f"its summary says {summary['status']}")
    why = _done_files(run_dir, summary, config)
    if why:
        return Verdict("corrupt", summary, config, why)
    return Verdict("done", summary, config)


def _done_files(run_dir: Path, summary: dict, config: dict) -> str | None:
    """None if the history and snapshots of a `done` summary are whole, else why not."""
    steps = summary["steps"]
    planned = _dotted(config, "optim.steps")
    if type(planned) is int and steps != planned:
        return f"summary.json says steps={steps}, config.yaml says optim.steps={planned}"
    if summary.get("eval_step") != steps:
        return f"summary.json says eval_step={summary.get('eval_step')} for a done run of {steps} steps"
    try:
        last, previous = None, -1
        for row in rows(run_dir, HISTORY):
            if row["step"] <= previous:
                return f"history.jsonl: step {row['step']} follows step {previous}"
            for key, value in row.items():  # a metric a summary also holds: of the same type and bounds
                f = SUMMARY_FIELDS.get(key)
                bad = f.check(value) if f is not None and key != "steps" else None
                if bad:
                    return f"history.jsonl at step {row['step']}: {key}={_show(value)} {bad}"
            previous, last = row["step"], row
        snaps = [row for row in rows(run_dir, SNAPSHOTS)]
    except FileNotFoundError as e:
        return f"a done run without its {Path(e.filename).name}"
    except Broken as e:
        return e.why
    if last is None:
        return "history.jsonl is empty"
    if last["step"] != steps:
        return f"history.jsonl ends at step {last['step']}; summary.json says {steps} steps"
    for key, value in last.items():
        if key in SUMMARY_FIELDS and key != "step" and summary.get(key) is not None and value is not None \
                and not _same(value, summary[key]):
            return f"history.jsonl's last row has {key}={_show(value)}; summary.json says {_show(summary[key])}"
    return _snapshots_problem(snaps, summary, config, steps)


def _snapshots_problem(snaps: list, summary: dict, config: dict, steps: int) -> str | None:
    """None if a done run's snapshots are the ones its config asks for (`snapshot_steps` on the evaluation grid
    up to the last step, and the last step) and its last one is the run's own (the summary's `parents_attention` is the sum of
    its attention over `parent_positions`), else why not."""
    asked, every = _dotted(config, "snapshot_steps"), _dotted(config, "eval_every")
    if isinstance(asked, list) and all(type(s) is int for s in asked) and type(every) is int and every >= 1:
        # a snapshot is taken at an evaluated step (0, eval_every, 2·eval_every, …) it asks for, and the last
        want = sorted({s for s in asked if s <= steps and s % every == 0} | {steps})
        have = [row["step"] for row in snaps]
        if have != want:
            return f"snapshots.jsonl holds steps {_show(have)}; the config asks for {_show(want)}"
    parents, total = summary.get("parent_positions"), summary.get("parents_attention")
    attention = snaps[-1].get("attention") if snaps else None
    if isinstance(parents, list) and total is not None and isinstance(attention, list):
        try:
            mine = float(sum(attention[j - 1] for j in parents))
        except (IndexError, TypeError):
            return "snapshots.jsonl's last attention does not cover the summary's parent_positions"
        if mine != total:
            return (f"snapshots.jsonl's last attention gives parents_attention={_show(mine)}; summary.json says "
                    f"{_show(total)}")
    return None
