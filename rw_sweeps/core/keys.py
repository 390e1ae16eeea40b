"""Every key of the schemas with its default and its comment, as text: what `--help` shows
(`conf/hydra/help/rw.yaml`, through the `rw_keys` resolver that `rw_sweeps.sweeps.app` registers).

The comments are the schema's own (`config.py`, the families, the model options): read from the source once
per `--help`, never copied into a second place."""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
from pathlib import Path

from .config import GROUPS, OPTIONS, RunConfig, WandbConfig

_FIELD = re.compile(r"^\s+(\w+):[^=#]*(?:=[^#]*)?(?:#\s*(.*))?$")


def comments(cls) -> dict[str, str]:
    """{field: its trailing comment, or the comment lines just above it} over the class and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        lines = _class_lines(klass.__module__, klass.__qualname__)
        if lines is None:
            continue
        above: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#"):
                above.append(stripped.lstrip("# "))
                continue
            m = _FIELD.match(line)
            if m and m.group(1) in klass.__dataclass_fields__:
                text = m.group(2) or " ".join(above)
                if text:
                    out[m.group(1)] = text
            above = []
    return out


@functools.cache
def _module_classes(module: str) -> dict[str, list[str]]:
    """{class name: its source lines} of a module, its file parsed once (`inspect.getsource` parses the whole
    file again for every class: seconds over every option of every group)."""
    try:
        source = inspect.getsource(sys.modules[module])
    except (KeyError, OSError, TypeError):
        return {}
    lines = source.splitlines()
    return {node.name: lines[node.lineno - 1:node.end_lineno] for node in ast.parse(source).body
            if isinstance(node, ast.ClassDef)}


def _class_lines(module: str, name: str) -> list[str] | None:
    return _module_classes(module).get(name)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def spelled(value) -> str:
    """A default as YAML and Hydra's override grammar spell it (`null`, `true`, `[0, 1]`), so that `--help`'s
    `key=value` typed back on the command line is that default."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(spelled(v) for v in value) + "]"
    return str(value)


def _lines(cls, prefix: str, skip=()) -> list[str]:
    notes = comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        head = f"  {prefix}{f.name}={spelled(_default(f))}"
        out.append(head + (f"  # {notes[f.name]}" if f.name in notes else ""))
    return out


@functools.cache
def describe(chosen: tuple = ()) -> str:
    """The run's own keys, then each group's options and their keys (default and comment); `chosen`, pairs
    (group, option): of a group named there, that option's keys only."""
    picked = dict(chosen)
    groups = set(GROUPS) | {"wandb"}
    text = ["The run:"] + _lines(RunConfig, "", skip=groups)
    text += ["", "wandb (WANDB_MODE, WANDB_PROJECT, WANDB_ENTITY and WANDB_TAGS are its defaults):"]
    text += _lines(WandbConfig, "wandb.")
    for group in GROUPS:
        for name, cls in OPTIONS[group].items():
            if picked.get(group, name) != name:
                continue
            doc = cls.__doc__ or ""
            doc = "" if doc.startswith(cls.__name__ + "(") else inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")
            text += ["", f"{group}={name}: {doc}" if doc else f"{group}={name}:"]
            text += _lines(cls, f"{group}.", skip=("name",))  # an option's name is its group's choice
    return "\n".join(text)


def groups(conf_dir: str, chosen: dict | None = None) -> str:
    """Each config group and its options, one line a group: the schema's options, and the presets' YAML files
    in `conf_dir` (`experiment`, `hparams_search`, `debug`, …); `chosen` ({group: option}): each group's
    choice marked `*`."""
    chosen = chosen or {}
    found = {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in Path(conf_dir).iterdir()
             if p.is_dir() and p.name != "hydra" and not p.name.startswith(("_", "."))}
    for group in GROUPS:
        found[group] = sorted(set(found.get(group, [])) | set(OPTIONS[group]))
    return "\n".join(f"{g}: {', '.join(o + '*' * (chosen.get(g) == o) for o in opts)}"
                     for g, opts in sorted(found.items()) if opts)
