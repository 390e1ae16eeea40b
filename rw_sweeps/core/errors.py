"""The project's one error type for bad input, and its one way of putting any exception on one line."""
from __future__ import annotations

from typing import Any

from hydra.errors import CompactHydraException


class ConfigError(CompactHydraException):
    """A bad config value: `invalid config: <dotted key>=<value>: <what is allowed>`. Hydra prints a
    CompactHydraException as its message alone, with no traceback."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={value!r}: {allowed}")


def one_line(exc: BaseException) -> str:
    """An exception as one line: the message of one of Hydra's compact errors (ConfigError's `invalid
    config: …`) as it is; any other as `Type: first line of its message`."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if isinstance(exc, CompactHydraException):
        return lines[0] if lines else type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
