"""What the command-line tools call themselves."""
from __future__ import annotations

import os
import re
import sys


def prog(module: str, script: str) -> str:
    """A usage line's name: the console script (`rw-status`) when run as one, else `python -m <module>`."""
    return script if os.path.basename(sys.argv[0]) == script else f"python -m {module}"


def counted(n: int, noun: str, number: str | None = None) -> str:
    """`1 run`, `8 runs`: a count with its noun in the number it takes; `number`, the count as shown (`1,000`)."""
    return f"{n if number is None else number} {noun}{'' if n == 1 else 's'}"


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown(text) -> str:
    """`text` safe to print on a terminal: every control character (C0, DEL, C1 — and so ESC, which starts
    every escape sequence — and Unicode's line separators and bidi overrides) as a visible escape (`\\x1b`),
    so a label, run name or error planted in a sweep folder cannot clear the screen or forge lines."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 256 else f"\\u{ord(m[0]):04x}", str(text))
