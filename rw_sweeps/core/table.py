"""One run as one row of the runs table: its config under dotted names and its summary's fields.

The one owner of the row a run becomes, for the sweep store's head (`rw_sweeps.core.store`), which writes it
as the run finishes, and for `analysis.load`, which builds it from a run folder: a run reads the same in both.
"""
from __future__ import annotations

import json

from . import contract

LEGACY_NORMALIZE = {True: "whole", False: "none"}   # model.normalize was a bool before it said where
# summary.json's copies of config keys (for a reader of the one file; the contract's ECHOES, which it holds
# equal to the config's): the table has the config's own column (`data.p`, `model.n_layer`, …), once. `sigma`
# is the init's scale, the config's `init.sigma` (or `init.std`); a zero-init run has none
ECHOED = (*contract.ECHOES, "sigma")


def flatten_config(config: dict, prefix: str = "") -> dict:
    """{"data": {"p": 0.5}} -> {"data.p": 0.5}; `init.name` becomes `init` (the chosen option);
    lists become JSON text so that every cell stays hashable and Parquet-friendly."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, key + "."))
        elif isinstance(v, (list, dict)):
            out[key] = json.dumps(v)
        else:
            out[key] = v
    if not prefix:   # `init` names the chosen option, in the place of `init.name`
        out = {("init" if k == "init.name" else k): v for k, v in out.items()}
    return out


def run_row(config: dict, summary: dict) -> tuple[dict, set]:
    """(the run's row, its config keys) from its canonical config and its checked summary: the config's keys,
    then every summary field the config does not say (a list or mapping as JSON text)."""
    row = flatten_config(config)
    if isinstance(row.get("model.normalize"), bool):
        row["model.normalize"] = LEGACY_NORMALIZE[row["model.normalize"]]
    keys = set(row)
    for k, v in summary.items():           # the config wins where both say it (seed, init, ...)
        if k not in ECHOED:
            row.setdefault(k, json.dumps(v) if isinstance(v, (list, dict)) else v)
    return row, keys


def parquet_safe(columns: dict[str, list]) -> dict[str, list]:
    """Arrow needs one type per column: a key that is an int in one run and a string in another
    (e.g. `model.pos_denom`) is stored as text."""
    out = {}
    for c, values in columns.items():
        kinds = {type(v) for v in values if v is not None and v == v}
        if len(kinds) > 1 and not kinds <= {int, float, bool}:
            values = [None if v is None or v != v else str(v) for v in values]
        out[c] = values
    return out
