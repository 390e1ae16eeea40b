"""The project's error types for a launch refused before any job starts, and its one way of putting any
exception on one line.

A refusal is a Hydra-native error (a CompactHydraException): under any Hydra app, Hydra prints its message
alone, as it prints its own. The project's front door (`rw_sweeps.sweeps.app.run_front_door`) decides the
exit code: one line, `error: …`, and exit 2."""
from __future__ import annotations

import difflib
from typing import Any, Iterable

import yaml
from hydra.errors import CompactHydraException


class Refused(CompactHydraException):
    """A launch refused before any job starts (bad input, a sweep folder in use or taken); its message is
    one line."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C that stopped something other than training (waiting for SLURM jobs, which go on): the front
    door says `message` instead of its own line, and exits 130 as for any Ctrl-C."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class ConfigError(Refused):
    """A bad config value: `invalid config: <dotted key>=<value>: <what is allowed>`. Hydra prints a
    CompactHydraException as its message alone, with no traceback."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={shown(value)}: {allowed}")


VALUE_CHARS = 120  # a value longer than this (a whole Π matrix, a planted string) is cut in a message


def shown(value: Any) -> str:
    """A value as a message shows it: its repr, cut to VALUE_CHARS (one line stays one short line)."""
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else f"{text[:VALUE_CHARS - 1]}… ({len(text):,} characters)"


class Typed(str):
    """A value as the command line typed it: a message shows it so (`data.p=0.1,0.5`, `true`), not as Python
    reads it (`'0.1,0.5'`, `True`)."""

    def __repr__(self) -> str:
        return str(self)


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """` (did you mean data?)` for the choice closest to a mistyped `word` (difflib's ratio ≥ 0.6), else ''."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def one_line(exc: BaseException) -> str:
    """An exception as one line: the message of one of Hydra's compact errors (ConfigError's `invalid
    config: …`) as it is; a YAML error with its file, line and column; any other as `Type: first line of
    its message`."""
    if isinstance(exc, yaml.MarkedYAMLError):
        return yaml_line(exc)
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if isinstance(exc, CompactHydraException):
        return lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def yaml_line(exc: yaml.MarkedYAMLError) -> str:
    """A config file YAML cannot read, where it fails: `FILE, line 1, column 20: expected ',' or ']', but got
    '}' (while parsing a flow sequence from line 1, column 11)`. Its message has these on four lines, and
    their first alone (`while parsing a flow sequence`) names no file."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = exc.problem or exc.context or "not valid YAML"
    context = exc.context if exc.problem else None
    if context and exc.context_mark is not None and exc.context_mark is not mark:
        c = exc.context_mark
        context += (f" from line {c.line + 1}, column {c.column + 1}" if c.name == getattr(mark, "name", None)
                    else f" from {c.name}, line {c.line + 1}, column {c.column + 1}")
    return f"{type(exc).__name__}: {where}{what}" + (f" ({context})" if context else "")
