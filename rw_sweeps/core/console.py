"""What the command-line tools call themselves."""
from __future__ import annotations

import os
import sys


def prog(module: str, script: str) -> str:
    """A usage line's name: the console script (`rw-status`) when run as one, else `python -m <module>`."""
    return script if os.path.basename(sys.argv[0]) == script else f"python -m {module}"
