"""Where each run of a launch lives in its sweep folder: found by its config, never by its job number.

A sweep folder outlives the command that made it: a grid grows (`data.p=0,0.5` then `data.p=0,0.1,0.5`), is
reordered, or is launched again with one key changed. Before anything is written, `place` reads the config
of every run folder already there and

- gives each run of the launch the folder that holds its config (`results.same_run`: keys that cannot
  change a result, such as `checkpoint_every` and `wandb.*`, do not count), wherever that folder is: a
  finished run is found and never trained again (a diverged one too, and a failed one is trained again,
  unless `hydra.launcher.retry` says otherwise), an unfinished one resumes in its own folder;
- gives a new run its job number's folder when that is free (missing, or holding no readable run), and the
  next unused number when the folder belongs to another run of this launch: finished folders are never
  renumbered;
- refuses, naming the folder and the keys that differ, when a new run's folder holds a run of another config
  that this launch does not ask for, unless `overwrite` (`hydra.launcher.overwrite=true`) says to train over it.

With a sweep subdir other than Hydra's default (`${hydra.job.num}`) a folder's name comes from the job's own
config, so runs keep their folders; only the refusal applies.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from rw_sweeps.core import contract, layout, results, store
from rw_sweeps.core.config import ConfigError, RunConfig
from rw_sweeps.core.errors import shown
from rw_sweeps.core.readers import Broken


class FolderTaken(ConfigError):
    """The sweep folder cannot take this launch (a run of another config in a run's folder, not a folder,
    not writable): one line, before anything is written."""


# The outcomes a relaunch trains again unless `hydra.launcher.retry` says otherwise. A diverged run is
# deterministic (the same config diverges at the same step again): its outcome is final. A failed run is
# retried: most failures are of the place it ran (a full disk, a killed or timed-out job, a device that was
# not there), and a job that dies without writing a summary makes its runs failed (README, "Faults").
RETRY = ("failed",)
OUTCOMES = ("failed", "diverged")  # what `retry` may name
RETRY_RULE = (f"must be a list of outcomes a relaunch trains again, of {', '.join(OUTCOMES)} (e.g. "
              f"'hydra.launcher.retry=[{','.join(OUTCOMES)}]', or [] to keep every run as it ended)")


def retry_switch(outcomes) -> str:
    """The override that trains runs of these outcomes again, quoted for the shell (zsh reads `[…]` as a glob)."""
    return f"'hydra.launcher.retry=[{','.join(outcomes)}]'"


@dataclass
class Placement:
    """What `place` found, by the spec's index: the summaries of the runs already done, those of the runs whose
    outcome is final though not done (`kept`: diverged, or failed, where `retry` does not name it), and why a
    run whose folder holds its config but breaks the contract is trained again."""
    done: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)
    retrain: dict = field(default_factory=dict)


def _key(cfg: dict) -> tuple:
    """What finds a run by its config: its seed, and the rest of its identity as canonical JSON."""
    ident = results.identity(cfg)
    return ident.pop("seed", None), json.dumps(ident, sort_keys=True, default=str)


_KEYED = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "seed")


def _spec_keys(specs: list) -> list[tuple]:
    """`_key` of every spec's config, the JSON built once per set of shared option objects and values but the
    seed (the planner gives every run of one composition and value set the same option objects)."""
    memo: dict = {}
    out = []
    for s in specs:
        c = s.cfg
        m = tuple(id(getattr(c, k)) for k in _KEYED)  # alive in the specs: equal ids are the same objects
        if m not in memo:
            memo[m] = _key(c.to_dict())[1]
        out.append((c.seed, memo[m]))
    return out


def repeats(specs: list) -> dict[int, int]:
    """{index of a spec: index of the earlier spec that trains the same run} (equal identities: a grid that
    names one run twice, as `optim.lr=1,1.0` or `seed=0,0` do)."""
    first: dict = {}
    out = {}
    for i, k in enumerate(_spec_keys(specs)):
        if k in first:
            out[i] = first[k]
        else:
            first[k] = i
    return out


def _run_config(folder: Path) -> tuple[dict | None, str | None]:
    """(the config of the run in `folder`, None) or (None, why it holds none it can be judged by: its
    config.yaml breaks the contract or the schema; None when there is simply none). A damaged folder is
    trained over, with one line; a folder that is a link is nobody's run."""
    if folder.is_symlink():
        return None, None
    try:
        cfg = contract.read_config(folder)
    except FileNotFoundError:
        return None, None
    except Broken as e:
        return None, e.why
    problem = contract.config_problem(cfg)
    return (None, problem) if problem else (cfg, None)


def existing(sweep_dir: Path, extra: list[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """Every run folder of the sweep with a readable config, by path (its run folders at any depth,
    `layout.run_folders`, and `extra` ones), and the folders whose config.yaml cannot be judged, with why.
    A link or a file at a run's place (`layout.problem`) is nobody's run."""
    root = str(sweep_dir)
    folders = [os.path.join(root, n) for n, why in layout.runs(root).items() if why is None]
    # the walk saw every direct subfolder that can hold a config; a launch's own folder deeper than it looks
    # (or below a name it skips) is looked up
    seen = set(folders)
    folders += [f for f in extra if os.path.dirname(f) != root and f not in seen and os.path.isdir(f)
                and layout.problem(root, os.path.relpath(f, root)) is None]
    out, damaged = {}, {}
    for name, cfg in store.index(root).configs().items():  # a stored run's record holds its config
        if contract.config_problem(cfg) is None:
            out[os.path.join(root, name)] = cfg
    for f in folders:
        cfg, why = _run_config(Path(f))
        if cfg is not None:
            out[f] = cfg
        elif why is not None:
            damaged[f] = why
    return out, damaged


def _number(folder: str) -> tuple:
    name = os.path.basename(folder)
    num = contract.job_number(name)
    return num is None, num or 0, name


def place(specs: list, sweep_dir: Path, default_subdir: bool, overwrite: bool = False,
          retry: tuple = RETRY) -> Placement:
    """Give every spec its folder (see the module's doc); raise FolderTaken on the first conflict. A run found
    `failed` or `diverged` is trained again if `retry` names its outcome, else kept."""
    sweep_dir = Path(sweep_dir)
    own = [s.output_dir for s in specs]  # absolute paths as strings: a grid of 100,000 runs builds no Path each
    root = os.path.abspath(sweep_dir) + os.sep
    up = os.sep + ".." + os.sep
    outside = next((d for d in own if not d.startswith(root) or up in d or d.endswith(os.sep + "..")), None)
    if outside is not None:  # every run of a sweep lives in its folder (the lock, the record and status say so)
        raise FolderTaken("hydra.sweep.subdir", os.path.relpath(outside, sweep_dir),
                          f"puts a run outside the sweep folder {sweep_dir}; a subdir must stay inside it")
    if not default_subdir and len(set(own)) < len(own):  # a subdir that does not name every swept key
        first: dict[str, int] = {}
        for i, d in enumerate(own):
            if d in first:
                a, b = (" ".join(specs[k].overrides) or "(no overrides)" for k in (first[d], i))
                raise FolderTaken("hydra.sweep.subdir", os.path.relpath(d, sweep_dir),
                                  f"two runs of this launch would share {d} ({a}; {b}): one would overwrite "
                                  "the other; name every swept key in it, e.g. "
                                  "hydra.sweep.subdir='${hydra.job.override_dirname}'")
            first[d] = i
    found, damaged = existing(sweep_dir, own)
    by_key: dict[tuple, list[str]] = {}
    for folder, cfg in found.items():
        by_key.setdefault(_key(cfg), []).append(folder)
    for folders in by_key.values():  # a run's own folder first, then by number
        folders.sort(key=_number)
    claimed: dict[str, int] = {}  # folder → the index of the run of this launch that it holds
    matched: dict[int, str] = {}
    keys = _spec_keys(specs) if by_key else []
    for i, s in enumerate(specs if by_key else []):  # runs already in the folder, wherever they are; own first
        options = by_key.get(keys[i], [])
        pick = own[i] if own[i] in options and own[i] not in claimed else next((f for f in options if f not in claimed), None)
        if pick is not None:
            claimed[pick], matched[i] = i, pick
    # a new run whose number's folder holds another run of this launch takes the lowest number that no
    # folder and no run staying in its own number's folder has
    staying = {own[i] for i in range(len(specs)) if i not in matched and own[i] not in claimed} if claimed else set()
    used = {contract.job_number(os.path.basename(f)) for f in (*found, *staying, *claimed)}
    fresh = iter(free_numbers(sweep_dir, sum(i not in matched and own[i] in claimed for i in range(len(specs))),
                              taken=used))
    out = Placement()
    conflicts = []
    for i, s in enumerate(specs):
        if i in matched:
            if matched[i] != own[i]:
                name = os.path.basename(matched[i])
                num = contract.job_number(name) if default_subdir else None
                num = s.num if num is None else num
                s.relocate(num, matched[i])
        elif own[i] in claimed:  # its number's folder holds another run of this launch: the next free number
            if not default_subdir:
                raise FolderTaken("hydra.sweep.subdir", os.path.basename(own[i]), f"two runs of this launch share {own[i]}")
            num = next(fresh)
            s.relocate(num, str(sweep_dir / str(num)))
        elif own[i] in found and not overwrite:
            conflicts.append((own[i], found[own[i]], s.cfg.to_dict()))
    if conflicts:
        folder, old, new = conflicts[0]
        more = f" (and {len(conflicts) - 1} more folder(s))" if len(conflicts) > 1 else ""
        hint = _continue([(o, n) for _, o, n in conflicts], [s.cfg.to_dict() for s in specs])
        raise FolderTaken("hydra.sweep.dir", str(sweep_dir), f"{folder} holds a run of another config "
                          f"({_difference(old, new)}){more}; {hint}add hydra.launcher.overwrite=true "
                          f"to train over it, or choose another hydra.sweep.dir")
    stored = store.index(sweep_dir) if store.present(sweep_dir) else None
    for file, why in (stored.refused.items() if stored is not None else ()):  # its runs are not done: trained
        print(f"not a record: {sweep_dir / store.STORE / file}: {why}; no run is done by it", flush=True)
    for i, s in enumerate(specs):
        if s.output_dir in found:  # only a folder that holds this run's config can hold its finished results
            name = os.path.relpath(s.output_dir, sweep_dir).replace(os.sep, "/")
            verdict = stored.verdict(name) if stored is not None and name in stored.runs \
                and not store.has_folder(s.output_dir) else contract.judge(Path(s.output_dir), found[s.output_dir])
            if verdict.done and results.same_run(verdict.config, s.cfg.to_dict()):
                out.done[i] = verdict.summary
            elif verdict.state in OUTCOMES and verdict.state not in retry \
                    and results.same_run(verdict.config, s.cfg.to_dict()):
                out.kept[i] = verdict.summary
            elif verdict.state == "corrupt":  # its files break the contract: trained again, and said why
                out.retrain[i] = verdict.why
        elif s.output_dir in damaged:  # its config.yaml cannot be judged: whatever it held is trained over
            out.retrain[i] = damaged[s.output_dir]
        if i in out.retrain:
            print(f"retraining {s.output_dir}: {out.retrain[i]}", flush=True)
    return out


def free_numbers(sweep_dir: Path, count: int, taken=(), consecutive: bool = False) -> list[int]:
    """The `count` lowest job numbers that no entry of the sweep folder is named by (a run folder, but also a
    file or a link a stranger put there: any name `contract.job_number` reads) and that are not in `taken`
    (folders this launch is about to make); `consecutive`: the lowest `count` free numbers in a row (Hydra's
    own launchers number a launch's jobs from one start). Every sweeper's new runs are numbered here. Gaps are
    filled, so a planted name of 255 digits cannot push the next folder's name past the file system's limit."""
    if count <= 0:
        return []
    used = {n for n in taken if n is not None}
    if store.present(sweep_dir):  # a stored run's number is taken as a folder's is
        used.update(n for n in map(contract.job_number, store.index(sweep_dir).runs) if n is not None)
    try:
        with os.scandir(sweep_dir) as it:
            used.update(n for n in (contract.job_number(e.name) for e in it) if n is not None)
    except OSError:  # no folder yet (or none we can list: placing there fails on its own, in one line)
        pass
    out: list[int] = []
    n = 0
    while len(out) < count:
        if n in used:
            out = [] if consecutive else out
        else:
            out.append(n)
        n += 1
    return out


def check_run_folder(run_dir: Path, cfg: dict, overwrite: bool = False) -> None:
    """A single run (`hydra.run.dir`): refuse, in one line, a folder that holds a run of another config."""
    found, _ = _run_config(Path(run_dir))
    if found is None or overwrite or _key(found) == _key(cfg):
        return
    raise FolderTaken("hydra.run.dir", str(run_dir), f"holds a run of another config ({_difference(found, cfg)}); "
                      f"{_continue([(found, cfg)], [cfg])}add hydra.launcher.overwrite=true to train over it, or choose another "
                      f"hydra.run.dir")


def writable(sweep_dir: Path) -> bool:
    """Can this launch write into its sweep folder? False for an existing folder that is read-only (a finished
    sweep may be: its re-run writes nothing); FolderTaken (one line) when it cannot be one at all."""
    sweep_dir = Path(sweep_dir)
    if os.path.lexists(sweep_dir):
        if not sweep_dir.is_dir():
            raise FolderTaken("hydra.sweep.dir", str(sweep_dir), "exists and is not a folder")
        return os.access(sweep_dir, os.W_OK | os.X_OK)
    parent = sweep_dir.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise FolderTaken("hydra.sweep.dir", str(sweep_dir), f"cannot be created: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FolderTaken("hydra.sweep.dir", str(sweep_dir), f"cannot be created: {parent} is not writable")
    return True


def _difference(there: dict, here: dict) -> str:
    """The first three keys that differ, with both values as the schemas read them (a key a stored config
    lacks at its default): `optim.steps=5 there, 10 here`."""
    there, here = results.identity(there), results.identity(here)
    return ", ".join(f"{k}={shown(_get(there, k))} there, {shown(_get(here, k))} here"
                     for k in results.differing_keys(there, here)[:3])


def _continue(conflicts: list[tuple[dict, dict]], planned: list[dict]) -> str:
    """`to continue it, add precision=float64; `: the overrides that make this command train the runs the
    folders hold, where one set of them does so for every conflict — a default changed since those runs were
    trained (model=gpt's precision) — else nothing. No hint for more than three keys, a key this command
    sweeps (it would collapse the sweep), a choice of a group or preset (`model.name`, `experiment`: it brings
    other keys with it), a key this command's option lacks, or a value that Hydra's override grammar would
    not read back as itself (a list, `1.10`, `Π.txt`)."""
    wanted = None
    for there, here in conflicts:
        there, here = results.identity(there), results.identity(here)
        keys = results.differing_keys(there, here)
        overrides = [(k, _get(there, k)) for k in keys]
        if wanted is not None and overrides != wanted:
            return ""
        wanted = overrides
        if not keys or len(keys) > 3 or any(k == "experiment" or k.endswith(".name") or
                                            type(_get(here, k)) is not type(v) for k, v in overrides):
            return ""
    swept = {k for k, _ in wanted if len({json.dumps(_get(results.identity(c), k)) for c in planned}) > 1}
    texts = [_override(k, v) for k, v in wanted]
    if swept or None in texts:
        return ""
    return f"to continue it, add {' '.join(texts)}; "


def _override(key: str, value) -> str | None:
    """`key=value` as typed on a command line, if Hydra's override grammar reads it back as exactly value."""
    text = str(value).lower() if type(value) is bool else str(value)
    if not text or any(c.isspace() or c in "'\"$`\\;&|<>(){}[],=*?!#~" for c in text):
        return None
    try:
        back = OverridesParser.create().parse_override(f"{key}={text}").value()
    except HydraException:  # the grammar refuses it (a parse or a lexer error): no hint
        return None
    return f"{key}={text}" if type(back) is type(value) and back == value else None


def _get(cfg: dict, dotted: str):
    node = cfg
    for k in dotted.split("."):
        node = node.get(k) if isinstance(node, dict) else None
    return node
