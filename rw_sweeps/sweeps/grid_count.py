"""A grid counted before it is built: how many jobs Hydra's expansion of these overrides makes, found from
the parsed overrides without listing one, so that a slip such as `seed='range(0,10000000)'` is one line in
well under a second instead of minutes of growing memory. Both of the project's sweepers ask it (the grid
sweeper for its grid, the adaptive one for the grid its points are crossed with)."""
from __future__ import annotations

import decimal
import math
from typing import Any, Dict, List

from hydra.core.override_parser.types import ChoiceSweep, Glob, Override, RangeSweep

from rw_sweeps.core.errors import ConfigError

MAX_RUNS = 1_000_000  # hydra.sweeper.max_runs's default (why: the grid sweeper's schema, RwSweeperConf)
EXACT_FLOAT_RANGE = 10_000  # a float range's values listed to be counted exactly (~2 µs each), at most


def _range_size(key: str, sweep: RangeSweep) -> int:
    """How many values `range(start, stop, step)` gives, computed, not listed: as Python's range for
    integers; for floats the quotient, or where that is small, Hydra's own FloatRange listed (its sums are
    rounded to 28 digits, so its last value can fall either side of a stop the quotient says it reaches)."""
    if sweep.step == 0:  # Python's range refuses it with a traceback; Hydra's FloatRange yields None for ever
        raise ConfigError(key, f"range({sweep.start},{sweep.stop},{sweep.step})", "a range's step must not be 0")
    r = sweep.range()
    if isinstance(r, range):
        return len(r)
    start, stop, step = (decimal.Decimal(v) for v in (r.start, r.stop, r.step))
    with decimal.localcontext(prec=60):
        estimate = max(0, math.ceil((stop - start) / step))
    # beyond this the count is the quotient's, at most one off Hydra's: it only decides a refusal
    return sum(1 for _ in r) if estimate <= EXACT_FLOAT_RANGE else estimate


def grid_size(overrides: List[Override]) -> tuple[int, Dict[str, int]]:
    """The number of jobs Hydra's grid expansion (`split_arguments`) makes of these overrides, and each
    swept key's number of values, without building one: a later override of a key replaces an earlier one,
    as there; a range counted by arithmetic, a list by its length, a glob by its matches (a group's options).
    Time and memory do not grow with the count."""
    sizes: Dict[str, int] = {}
    for o in overrides:
        key, value = o.get_key_element(), o.value()
        if isinstance(value, RangeSweep):
            sizes[key] = _range_size(key, value)
        elif isinstance(value, ChoiceSweep):
            sizes[key] = len(value.list)
        elif isinstance(value, Glob):
            sizes[key] = sum(1 for _ in o.sweep_string_iterator())
        else:  # a plain value (or an interval, which Hydra's expansion refuses itself)
            sizes[key] = 1
    return math.prod(sizes.values()), sizes


def refuse_large_grid(overrides: List[Override], max_runs: Any) -> None:
    """ConfigError (one line, before anything is written) if the grid has more than `max_runs` jobs, naming
    the count, the limit and the keys that make it."""
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ConfigError("hydra.sweeper.max_runs", max_runs, "must be a whole number of runs, at least 1")
    n, sizes = grid_size(overrides)
    if n > max_runs:
        swept = " × ".join(f"{k}: {v:,} values" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]) if v > 1)
        raise ConfigError("hydra.sweeper.max_runs", max_runs, f"this sweep has {n:,} runs ({swept}); "
                          "raise hydra.sweeper.max_runs to launch it")
