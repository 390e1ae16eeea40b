"""`python -m rw_sweeps.sweeps.predict escape [--out FILE] <the overrides of launch.py>`: the escape theory's
prediction (`rw_sweeps.core.theory.predict`) for every run the same `launch.py -m` would plan, one JSON line
each (with `job`, the run's job number in that sweep, and `config_id`, its identity), printed as each is
ready, with a progress line on stderr. With `--out FILE` the lines are also appended to FILE as they come,
and a rerun with the same FILE predicts only the jobs it does not hold yet for the same configs: an
interrupted prediction keeps what it finished. The runs are planned by the sweep layer's one planning
function, so the theory sees exactly the sweep's configs.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from rw_sweeps.core import readers, results
from rw_sweeps.core.config import RunConfig
from rw_sweeps.core.errors import one_line
from rw_sweeps.core.theory import predict_each

from .planner import plan_overrides

USAGE = ("usage: python -m rw_sweeps.sweeps.predict escape [--out FILE] [key=value ...]   (the overrides of "
         "launch.py)")


def compose(overrides: list[str]) -> list[RunConfig]:
    """The configs `python launch.py -m <overrides>` would run, validated (ConfigError: one line)."""
    return [s.cfg for s in plan_overrides(overrides)]


def config_id(cfg: RunConfig) -> str:
    """What ties a kept line to its run: a hash of the run's identity (`results.identity`)."""
    ident = json.dumps(results.identity(cfg.to_dict()), sort_keys=True, default=str)
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


OUT_CAP = 1 << 30  # bytes of an --out file (a few hundred a run)


def _finished(out: Path | None, ids: list[str]) -> tuple[dict[int, str], bool]:
    """The lines an earlier, maybe interrupted, prediction of this very grid left in `out`, by job (a torn
    line, or a line of another grid's run, is not kept), and whether the file ends in the middle of a line."""
    done: dict[int, str] = {}
    if out is None or not out.exists():
        return done, False
    try:  # the file this command writes, read back under the contract's rules (a regular file, capped)
        text = readers.read_bytes(out, OUT_CAP).decode("utf-8", "replace")
    except readers.Broken as e:
        raise SystemExit(f"error: --out {e}") from None
    for line in text.splitlines():
        try:
            row = readers.json_value(line.encode(), out)
        except readers.Broken:
            continue
        job = row.get("job") if isinstance(row, dict) else None
        if isinstance(job, int) and 0 <= job < len(ids) and row.get("config_id") == ids[job]:
            done[job] = line
    return done, bool(text) and not text.endswith("\n")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "escape":
        print(USAGE, file=sys.stderr)
        return 2
    args, out = list(argv[1:]), None
    if "--out" in args:
        at = args.index("--out")
        if at + 1 >= len(args):
            print(USAGE, file=sys.stderr)
            return 2
        out = Path(args[at + 1])
        del args[at:at + 2]
    try:
        cfgs = compose(args)
    except Exception as exc:  # noqa: BLE001 - one line, no traceback, as launch.py's front door
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    ids = [config_id(c) for c in cfgs]
    kept, torn = _finished(out, ids)
    for line in kept.values():
        print(line, flush=True)
    todo = [i for i in range(len(cfgs)) if i not in kept]
    if kept:
        print(f"escape: {len(kept)} of {len(cfgs)} predictions kept from {out}", file=sys.stderr, flush=True)
    t0, n = time.monotonic(), len(kept)
    sink = open(out, "a", encoding="utf-8") if out is not None else None
    if sink is not None and torn:
        sink.write("\n")  # an interrupted write's torn line ends here, and is never read as a row
    try:
        for j, row in predict_each([cfgs[i] for i in todo]):
            line = json.dumps({"job": todo[j], "config_id": ids[todo[j]], **row}, allow_nan=False)
            print(line, flush=True)
            if sink is not None:
                sink.write(line + "\n")
                sink.flush()
                os.fsync(sink.fileno())
            n += 1
            print(f"escape: {n}/{len(cfgs)} predictions, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {n} of {len(cfgs)} predictions done"
              + (f", kept in {out}; run the same command again to finish" if out else ""), file=sys.stderr)
        return 130
    finally:
        if sink is not None:
            sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
