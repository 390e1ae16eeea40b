"""The project's error types for a launch refused before any job starts, and its one way of putting any
exception on one line.

A refusal is a Hydra-native error (a CompactHydraException): under any Hydra app, Hydra prints its message
alone, as it prints its own. The project's front door (`rw_sweeps.sweeps.app.run_front_door`) decides the
exit code: one line, `error: …`, and exit 2."""
from __future__ import annotations

from typing import Any

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


def one_line(exc: BaseException) -> str:
    """An exception as one line: the message of one of Hydra's compact errors (ConfigError's `invalid
    config: …`) as it is; any other as `Type: first line of its message`."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if isinstance(exc, CompactHydraException):
        return lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
