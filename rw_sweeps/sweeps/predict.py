"""`python -m rw_sweeps.sweeps.predict escape <the overrides of launch.py>`: the escape theory's prediction
(`rw_sweeps.core.theory.predict`) for every run the same `launch.py -m` would plan, one JSON line each. The
runs are planned by the sweep layer's one planning function, so the theory sees exactly the sweep's configs.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

from rw_sweeps.core.config import RunConfig
from rw_sweeps.core.errors import one_line
from rw_sweeps.core.theory import predict

from .planner import plan_overrides

USAGE = "usage: python -m rw_sweeps.sweeps.predict escape [key=value ...]   (the overrides of launch.py)"


def compose(overrides: list[str]) -> list[RunConfig]:
    """The configs `python launch.py -m <overrides>` would run, validated (ConfigError: one line)."""
    return [s.cfg for s in plan_overrides(overrides)]


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "escape":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        cfgs = compose(argv[1:])
    except Exception as exc:  # noqa: BLE001 - one line, no traceback, as launch.py's front door
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    for row in predict(cfgs):
        print(json.dumps(row, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
