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

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from . import readers
from .config import RunConfig, canonical, stored
from .errors import ConfigError
from .readers import Broken, GiB, KiB, MiB
from .summary_fields import ECHOES, SUMMARY_FIELDS, Field  # noqa: F401 - the format this contract checks

SUMMARY, CONFIG, HISTORY, SNAPSHOTS, CHECKPOINT = ("summary.json", "config.yaml", "history.jsonl",
                                                   "snapshots.jsonl", "checkpoint.pt")

# Size caps: memory is bounded by these, whatever is planted. What a valid run writes is bounded by them too:
# `written` bounds each file from the config, and `too_large` refuses (before any job) a run that would pass
# one. A summary is ~2 KB; a config ~1 KB plus data.Pi (K² numbers); a history row ~0.3 KB (model=gpt: two
# numbers per layer and head more); a snapshot row ~K² numbers (V). The snapshot line's cap sets the largest
# K any run may have (~1,150: V's K² numbers at 25 bytes each); the config's is set so that data=markov_matrix
# holds its Π at every K the snapshot line allows (K² numbers at 36 bytes each: 46 MiB).
CAPS = {SUMMARY: 1 * MiB, CONFIG: 64 * MiB}
LINE_CAPS = {HISTORY: 1 * MiB, SNAPSHOTS: 32 * MiB}
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
    yield from _checked(readers.lines(path, LINE_CAPS[name], FILE_CAPS[name], name), path, name)


def _checked(lines, path: Path, name: str):
    for n, line in enumerate(lines, 1):
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


# Where a run's record may be kept but its folder: `rw_sweeps.core.store` adds its lookup when it is imported
# (every reader of a sweep imports it, through `rw_sweeps.core.layout`); this module imports no store, which
# reads its rules. A lookup gives the run's Verdict, or None where a run folder holds the run or it keeps none.
ELSEWHERE: list = []


def judge(run_dir, config: dict | None = None) -> Verdict:
    """The one judgement of a run folder (see the module's doc). `config`: its config.yaml, if already read
    and found valid by the caller (placement reads every folder's config once). A run with no folder that
    its sweep's store holds is judged by its record (`rw_sweeps.core.store`: judged by `judge_record` before
    it was sealed)."""
    run_dir = Path(run_dir)
    for elsewhere in ELSEWHERE:  # a run no folder holds, recorded elsewhere: the sweep store's
        verdict = elsewhere(run_dir)
        if verdict is not None:
            return verdict
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


def judge_record(config: dict, summary: dict, history: list, snapshots: list, run_dir) -> dict:
    """The summary a run's record is stored with: as `judge` would find a run folder holding this summary and
    these rows (a NaN or infinity in a row is null, as its text says), a `done` summary whose rows break
    the contract becomes `failed`, saying why; a summary that itself breaks it is Broken (no record is written
    for it). `config` is a validated config's own dict (`RunConfig.to_dict`): its schema is not checked again."""
    run_dir = Path(run_dir)
    check_summary(summary, run_dir / SUMMARY)
    problem = None
    if summary["status"] == "done":
        problem = _done_files(run_dir, summary, config, lambda name: _stepped(
            history if name == HISTORY else snapshots, run_dir / name, name))
    if problem is None:
        return summary
    return {**summary, "status": "failed", "error": f"its results break the contract: {problem}"}


def _stepped(rows: list, path: Path, name: str) -> list:
    """Rows held in memory, checked as `_checked` checks a file's: each a mapping with an integer step >= 0."""
    for n, row in enumerate(rows, 1):
        step = row.get("step") if isinstance(row, dict) else None
        if type(step) is not int or step < 0:
            raise Broken(path, f"{name} line {n}: step={_show(step)} must be an integer >= 0")
    return rows


def _done_files(run_dir: Path, summary: dict, config: dict, source=None) -> str | None:
    """None if the history and snapshots of a `done` summary are whole, else why not. `source(name)`: the
    rows of one of its files, where they are not in the run folder (a stored record's)."""
    read = source or (lambda name: rows(run_dir, name))
    steps = summary["steps"]
    planned = _dotted(config, "optim.steps")
    if type(planned) is int and steps != planned:
        return f"summary.json says steps={steps}, config.yaml says optim.steps={planned}"
    if summary.get("eval_step") != steps:
        return f"summary.json says eval_step={summary.get('eval_step')} for a done run of {steps} steps"
    try:
        history = list(read(HISTORY))
        why = None if _rows_fit(history) else _first_misfit(history)
        if why:
            return why
        last = history[-1] if history else None
        snaps = [row for row in read(SNAPSHOTS)]
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


_NUMBER_TYPES = frozenset({int, float})


def _rows_fit(history: list) -> bool:
    """Do the history's steps rise and every metric a summary also holds fit its field (`_first_misfit`'s rule),
    checked a column at a time: True, or False where `_first_misfit` must find what does not."""
    steps = [row["step"] for row in history]
    if any(b <= a for a, b in zip(steps, steps[1:])):
        return False
    for key in {k for row in history for k in row}:
        f = SUMMARY_FIELDS.get(key)
        if f is None or key in ("steps", "step"):
            continue
        # null, and in rows held in memory (a stored record's) a NaN or infinity, which its text writes as null
        values = [v for row in history if key in row and (v := row[key]) is not None
                  and not (type(v) is float and not math.isfinite(v))]
        if f.kind in ("int", "num") and values:
            if not {type(v) for v in values} <= (_NUMBER_TYPES if f.kind == "num" else {int}):
                return False
            if f.kind == "num" and not all(map(math.isfinite, values)):
                return False
            if (f.lo is not None and min(values) < f.lo) or (f.hi is not None and max(values) > f.hi):
                return False
        elif any(f.check(v) for v in values) or (not f.nullable and len(values) < sum(key in r for r in history)):
            return False
    return True


def _first_misfit(history: list) -> str | None:
    """Why the history breaks the contract, at its first row that does (its steps rise; a metric a summary also
    holds is of that field's type and bounds), or None."""
    previous = -1
    for row in history:
        if row["step"] <= previous:
            return f"history.jsonl: step {row['step']} follows step {previous}"
        for key, value in row.items():
            f = SUMMARY_FIELDS.get(key)
            bad = f.check(value) if f is not None and key != "steps" else None
            if bad:
                return f"history.jsonl at step {row['step']}: {key}={_show(value)} {bad}"
        previous = row["step"]
    return None


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


# ------------------------------------------------------------------------------------------ what a run writes
# Upper bounds on a value's bytes as the writers write it (`rw_sweeps.core.results`): JSON (orjson, compact, one
# row a line; summary.json indented) and block YAML (libyaml). A float's shortest repr is at most 24 characters
# ('-2.2250738585072014e-308'); YAML adds '.0' to '5e-324'. A string's characters may each be escaped (JSON's
# \u0001: 6 bytes for one).
NUMBER = 26        # a number's text, at most
JSON_NUMBER = 27   # … in a compact JSON row, with its comma (a list's brackets are counted as numbers)
INDENT = 2         # per nesting level of an indented document (YAML's, summary.json's 1)
ESCAPED = 6        # bytes a string's byte may take, escaped
YAML_PER_JSON = 20  # a block YAML document's bytes per byte of the same value's compact JSON, at most


def _text(x) -> int:
    """A scalar's text, at most."""
    if isinstance(x, str):
        return ESCAPED * len(x.encode("utf-8", "surrogatepass")) + 2
    if isinstance(x, bool) or x is None:
        return 5
    if isinstance(x, int):
        return len(str(x)) + 1
    return NUMBER


def _doc(x, depth: int = 0) -> int:
    """An upper bound on a value's bytes in an indented document (block YAML, indented JSON) at this depth:
    every scalar on a line of its own, after its indent, its key or `- `, and a few bytes of punctuation."""
    pad = INDENT * depth + 6
    if dataclasses.is_dataclass(x):
        x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return sum(pad + _text(str(k)) + _doc(v, depth + 1) for k, v in x.items()) + pad
    if isinstance(x, (list, tuple)):
        if all(type(v) in (int, float) for v in x):  # the common case (a row of Π, snapshot_steps): by length
            return len(x) * (pad + NUMBER) + pad
        return sum(pad + _doc(v, depth + 1) for v in x) + pad
    return pad + _text(x)


def _config_bytes(cfg: RunConfig) -> int:
    """config.yaml's bytes, at most: the config as the writer records it, its family's K×K matrices
    (`DataConfig.MATRICES`) counted as K rows of K numbers from data.K, whatever the list holds."""
    data, K = cfg.data, cfg.data.K
    matrices = type(data).MATRICES
    rest = dataclasses.replace(cfg, data=dataclasses.replace(data, **{k: None for k in matrices})) if matrices else cfg
    # a block YAML document is at most YAML_PER_JSON times its compact JSON (every scalar on a line of its own,
    # indented, each byte of a string escaped at worst): that bound, ~5 µs, serves where it is far below the
    # cap; `_doc` walks the config where it is not
    quick = YAML_PER_JSON * len(orjson.dumps(rest))
    row = _doc([0.0] * K, 3) + INDENT * 2 + 6  # a row is an item of its matrix, two levels into the config
    return (quick if quick <= CAPS[CONFIG] // 4 else _doc(rest)) + len(matrices) * K * row


def _snapshot_count(cfg: RunConfig) -> int:
    """How many snapshots a done run holds: the asked steps on the evaluation grid up to the last, and the last."""
    steps, every = cfg.optim.steps, cfg.eval_every
    return len({s for s in cfg.snapshot_steps if s <= steps and s % every == 0} | {steps})


def written(cfg: RunConfig) -> dict[tuple[str, str], int]:
    """Upper bounds on what a run of this (valid) config writes, from the config alone: (file, `file` or
    `line`) → bytes, for each cap of the contract (`CAPS`, `LINE_CAPS`, `FILE_CAPS`)."""
    history, snapshot = cfg.model.recorded(cfg)
    history_line = history * (JSON_NUMBER + 24) + 64  # each number with its key
    snapshot_line = snapshot * JSON_NUMBER + 256
    # parent_positions: at most N − 1 positions; which ones (a Bayesian network's DAG) only where that matters
    parents = [cfg.data.N] * cfg.data.N if cfg.data.N * (INDENT + 6 + NUMBER) < 256 * KiB else cfg.data.parents(cfg.seed) or []
    heads = getattr(cfg.model, "n_layer", 0) * getattr(cfg.model, "n_head", 0)  # attn_parent, induction
    summary = (8 * KiB + _doc(cfg.data.echoed(), 1) + _doc(parents, 1) + 2 * heads * (INDENT * 3 + 6 + NUMBER)
               + 2 * _doc(0.0, 1) * getattr(cfg.model, "n_layer", 0))
    rows = cfg.optim.steps // cfg.eval_every + 2  # step 0, the grid, the last step
    return {(CONFIG, "file"): _config_bytes(cfg), (SUMMARY, "file"): summary,
            (HISTORY, "line"): history_line, (SNAPSHOTS, "line"): snapshot_line,
            (HISTORY, "file"): rows * (history_line + 1), (SNAPSHOTS, "file"): _snapshot_count(cfg) * (snapshot_line + 1)}


def _cap(file: str, kind: str) -> int:
    return (CAPS if kind == "file" and file in CAPS else FILE_CAPS if kind == "file" else LINE_CAPS)[file]


def _over(cfg: RunConfig) -> tuple[str, str, int] | None:
    """The first (file, kind, bytes) whose bound is above its cap, or None."""
    for (file, kind), size in written(cfg).items():
        if size > _cap(file, kind):
            return file, kind, size
    return None


# The keys a refusal may name, each with the direction that shrinks what a run writes (+1: a smaller value)
_DRIVERS = (("data", "K", 1), ("data", "N", 1), ("model", "m", 1), ("model", "n_layer", 1), ("model", "n_head", 1),
            (None, "eval_every", -1), ("optim", "steps", 1))


def _with(cfg: RunConfig, group: str | None, key: str, value: int) -> RunConfig:
    if group is None:
        return dataclasses.replace(cfg, **{key: value})
    return dataclasses.replace(cfg, **{group: dataclasses.replace(getattr(cfg, group), **{key: value})})


def _limit(cfg: RunConfig, group: str | None, key: str, sign: int) -> int | None:
    """The value of `key` nearest the run's own (the others kept) at which every file fits its cap, or None
    where none does (between 1 and the run's value; for eval_every, up to optim.steps)."""
    value = getattr(getattr(cfg, group) if group else cfg, key)
    fits = lambda v: _over(_with(cfg, group, key, v)) is None  # noqa: E731 - every file, not only this one
    lo, hi = (1, value) if sign > 0 else (value, max(value, cfg.optim.steps + 1))
    good = lo if sign > 0 else hi
    if not fits(good):
        return None
    while hi - lo > 1:  # the bound grows with the key (shrinks, for eval_every): bisect for the edge
        mid = (lo + hi) // 2
        if fits(mid) == (sign > 0):
            lo = mid
        else:
            hi = mid
    return lo if sign > 0 else hi


def too_large(cfg: RunConfig) -> ConfigError | None:
    """None if every file a run of this config writes fits its reader's cap (`written`), else the one-line
    refusal: the key whose change makes it fit, its value, the file, the bound and the limit (`invalid config:
    data.K=2000: writes snapshots.jsonl lines of up to 108.0 MB (V: K² numbers), above the 32 MiB a line may
    hold; data.K <= 1114 fits`)."""
    over = _over(cfg)
    if over is None:
        return None
    file, kind, size = over
    where = f"{file} lines of up to" if kind == "line" else f"a {file} of up to"
    cap = _cap(file, kind)
    what = f"writes {where} {size / 1e6:,.1f} MB, above the {_size(cap)} its reader allows"
    for group, key, sign in _DRIVERS:
        part = getattr(cfg, group) if group else cfg
        value = getattr(part, key, None)
        if type(value) is not int or (group == "model" and key == "m" and not getattr(part, "is_ffn", False)):
            continue
        edge = _limit(cfg, group, key, sign)
        if edge is not None and edge != value:
            dotted = f"{group}.{key}" if group else key
            return ConfigError(dotted, value, f"{_family(cfg)}{what}; {dotted} {'<=' if sign > 0 else '>='} {edge:,} fits")
    biggest = max(((k, v) for k, v in _leaves(cfg) if isinstance(v, (list, str))), key=lambda kv: _doc(kv[1]),
                  default=("data.K", cfg.data.K))
    return ConfigError(biggest[0], biggest[1], f"{_family(cfg)}{what}; a shorter value fits")


def _size(n: int) -> str:
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def _family(cfg: RunConfig) -> str:
    return f"data={cfg.data.name} model={cfg.model.name} "


def _leaves(cfg: RunConfig):
    """(dotted key, value) of every leaf of the config."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                yield f"{f.name}.{g.name}", getattr(value, g.name)
        else:
            yield f.name, value
