"""wandb's import, its per-run settings, its offline folders, the runs' names and the runs table: what the
run logger (`rw_sweeps.sweeps.tracking`) and the sweep's analysis run (`analysis.wandb_run`) share."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from .summary_fields import ECHOES

# disable_job_creation is wandb's documented switch for W&B Launch jobs (already its default in 0.31); wandb
# still imports `wandb.sdk.launch` once per process in `_detect_and_apply_job_inputs` (0.3–2 s, pydantic),
# which no setting skips: it is paid once per process, in the background logger.
SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                disable_job_creation=True, x_save_requirements=False)  # no pip freeze per run (~0.15 s)


def wandb():
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # lazily: importing wandb alone costs ~1.5 s

    return wandb


def table(columns: list[str], rows: list[list]):
    """wandb.Table(columns=…, data=rows, allow_mixed_types=True), without its per-cell type inference. With
    mixed types allowed every column starts as Optional[Any], and assigning any value to that type gives it
    back: the inference (~1.5 s for 1,000 rows × 80 columns, in Python) cannot change it. So the table is made
    empty and given its rows in `Table.data`, the list `add_data` appends to: the same columns, types and
    rows (`tests/test_wandb_export.py` holds the two equal). Only plain values go here, no wandb media or
    table links (which `add_data` casts)."""
    t = wandb().Table(columns=columns, data=[], allow_mixed_types=True)
    t.data = [list(r) for r in rows]
    return t


def drop_partial(wandb_dir: Path, run_id: str) -> None:
    """A run is logged whole when it ends, so an offline run left by a killed or concurrent attempt is
    replaced, never kept beside the new one (`wandb sync` would upload both under one id)."""
    for old in Path(wandb_dir).glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(old, ignore_errors=True)


def readable(data_dir: Path) -> None:
    """wandb stages the files it uploads (tables, artifacts) read-only for their owner (0400): in a shared
    sweep folder they are made 0644 like every other file, so that a collaborator can read them and the
    owner can remove the sweep without a fight."""
    for f in Path(data_dir).rglob("*"):
        if f.is_file() and not f.is_symlink():
            try:
                os.chmod(f, 0o644)
            except OSError:
                pass


def run_name(cfg: dict) -> str:
    """A run's wandb name: `wandb.name` (the launcher fills it with the job's values of the keys its sweep
    varies, `rw_sweeps.sweeps.app.named`); without one (a run of the defaults, a folder of an older
    version), p (or the family where it has no p), the model where it is not eq. 2.1, the init and the seed."""
    if (cfg.get("wandb") or {}).get("name"):
        return str(cfg["wandb"]["name"])
    d, m = cfg["data"], cfg.get("model") or {}
    what = f"p={d['p']}" if "p" in d else f"data={d.get('name')}"
    model = "" if m.get("name", "transformer") == "transformer" else f" {m['name']}"
    return f"{what}{model} {cfg['init']['name']} seed={cfg['seed']}"


def leaves(d: dict, prefix: str = "") -> dict:
    """{dotted key: value} of a nested config, in config.yaml's order; lists stay lists (`data.jumps`)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b  # 1, 1.0 and True are three values of a config


def shared(cfgs: list[dict]) -> dict:
    """The keys every config gives the same value, nested as in config.yaml (a packed job's own config)."""
    out = {}
    for k, v in cfgs[0].items():
        values = [c.get(k) for c in cfgs]
        if all(isinstance(x, dict) for x in values):
            if sub := shared(values):
                out[k] = sub
        elif all(k in c and _same(c[k], v) for c in cfgs):
            out[k] = v
    return out


CELL_CAP = 256  # values in one cell of a runs table: a longer list (a K×K `data.Pi`) stays in config.yaml


def _cells(v) -> int:
    return sum(map(_cells, v)) if isinstance(v, list) else 1


def runs_table(entries: list[dict], sweep_dir: Path) -> tuple[list[str], list[list]]:
    """(columns, rows) of a table with one row per run: its folder (relative to the sweep) and wandb name,
    every config key under its dotted config.yaml path with its value as config.yaml holds it (lists as
    lists; null where the run's options lack the key, as a zero-init run lacks `init.sigma`), then every
    summary field but its copies of config keys (`ECHOES`: the config's own column holds each). A key whose
    value holds more than CELL_CAP numbers in some run (a transition matrix) has no column: a table of K²
    cells a row is no table to filter by. What
    wandb's table panel filters, groups and plots runs by: a packed job's (`rw_sweeps.sweeps.tracking`) and
    a whole sweep's (its analysis run, `analysis.wandb_run`). `entries`: cfg, run_dir and summary each."""
    flat = [leaves(e["cfg"]) for e in entries]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    big = {k for f in flat for k, v in f.items() if isinstance(v, list) and _cells(v) > CELL_CAP}
    keys = [k for k in keys if k not in big]
    fields = list(dict.fromkeys(k for e in entries for k in e["summary"] if k not in ECHOES))
    cols = ["run", "name", *keys, *(f"summary.{k}" if k in keys or k in ("run", "name") else k for k in fields)]
    rows = [[os.path.relpath(e["run_dir"], sweep_dir), run_name(e["cfg"]),
             *(f.get(k) for k in keys), *(e["summary"].get(k) for k in fields)] for e, f in zip(entries, flat)]
    return cols, rows
