"""wandb's import, its per-run settings, its offline folders, the runs' names, the runs table and its
failures gathered into one line: what the run logger (`rw_sweeps.sweeps.tracking`), the export
(`rw_sweeps.sweeps.wandb_export`) and the sweep's analysis run (`analysis.wandb_run`) share."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import threading
from collections import Counter
from pathlib import Path

from .errors import one_line
from .summary_fields import ECHOES

# disable_job_creation is wandb's documented switch for W&B Launch jobs (already its default in 0.31); wandb
# still imports `wandb.sdk.launch` once per process in `_detect_and_apply_job_inputs` (0.3–2 s, pydantic),
# which no setting skips: it is paid once per process, in the background logger.
SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                disable_job_creation=True, x_save_requirements=False)  # no pip freeze per run (~0.15 s)


def wandb():
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # lazily: importing wandb alone costs ~1.5 s

    _gather_log_errors()
    return wandb


# ------------------------------------------------------------------------------ wandb's failures, gathered
# On a full disk every message wandb logs to a run's `logs/debug.log` fails, and logging's Handler.handleError
# prints each as a `--- Logging error ---` block with two tracebacks (2,205 lines for a 4-run grid). wandb's
# logger is its own (it does not propagate to the root logger), so its handlers' failures are counted here
# instead, and said once, with the failures of the logging tasks, as one line (`said`). The project's own
# handlers (a run's log) are not touched.
WANDB_LOGGER = "wandb"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # what freeing space cures: the line then says how to log again


class _Failures:
    """What wandb failed to do in this process since it was last said: logging tasks that raised (by
    reason), writes of wandb's own log files that failed (by reason), and the folders whose offline wandb
    runs they leave incomplete."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # handlers fail on wandb's threads and the logger's alike
        self.tasks: Counter = Counter()
        self.writes: Counter = Counter()
        self.folders: set = set()
        self.disk_full = False

    def note(self, counter: Counter, exc: BaseException, reason: str, folder: Path | None) -> None:
        with self.lock:
            counter[reason] += 1
            self.disk_full |= isinstance(exc, OSError) and exc.errno in DISK_FULL
            if folder is not None:
                self.folders.add(_real(folder))

    def take(self) -> "_Failures":
        with self.lock:
            taken = _Failures()
            taken.tasks, taken.writes, taken.folders, taken.disk_full = \
                self.tasks, self.writes, self.folders, self.disk_full
            self.tasks, self.writes, self.folders, self.disk_full = Counter(), Counter(), set(), False
        return taken


_failures = _Failures()
# a forked child starts with nothing to say: its parent says its own
os.register_at_fork(after_in_child=lambda: globals().update(_failures=_Failures()))


def _real(folder) -> Path:
    """One spelling of a folder: wandb names its log files by the absolute path, a caller by its own."""
    return Path(os.path.realpath(folder))


def _gather_log_errors() -> None:
    """Every handler wandb attaches to its logger (one a run, on `<run>/wandb/offline-run-*/logs/debug.log`)
    counts its failed writes in `_failures` instead of printing a traceback for each. wandb adds them with
    `logging.getLogger("wandb").addHandler` inside `wandb.init`, so that logger's addHandler is wrapped, once
    per process; no other logger changes."""
    logger = logging.getLogger(WANDB_LOGGER)
    if getattr(logger, "_rw_gathered", False):
        return
    add = logger.addHandler

    def add_handler(handler: logging.Handler) -> None:
        _gathered(handler)
        add(handler)

    logger.addHandler = add_handler  # type: ignore[method-assign]
    logger._rw_gathered = True  # type: ignore[attr-defined]
    for handler in list(logger.handlers):
        _gathered(handler)


def _gathered(handler: logging.Handler) -> None:
    def handle_error(record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, RecursionError):  # as logging's own handleError: never swallowed
            raise exc
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc) if exc else "?"
        _failures.note(_failures.writes, exc, reason, offline_owner(getattr(handler, "baseFilename", None)))

    handler.handleError = handle_error  # type: ignore[method-assign]


def offline_owner(log_file: str | None) -> Path | None:
    """The folder whose offline wandb run writes `log_file` (`<folder>/wandb/offline-run-*/logs/debug.log`):
    a run folder, a packed job's `<sweep>/wandb_jobs/<id>` or the sweep's `wandb_analysis`; None for another
    file."""
    if not log_file:
        return None
    p = Path(log_file)
    return p.parents[3] if len(p.parents) > 3 and p.parents[2].name == "wandb" else None


def task_failed(exc: BaseException, folder: Path | None = None) -> None:
    """A logging task (a run's wandb run, a packed job's, an export's) raised `exc`: counted, said by `said`."""
    _failures.note(_failures.tasks, exc, one_line(exc), folder)


def failed_in(folder: Path) -> bool:
    """Whether wandb failed in `folder` (a write of its logs, a task) since the last `said`: a run with such
    a failure is not vouched for as exported (`tracking.mark_exported`), its offline run may be incomplete."""
    with _failures.lock:
        return _real(folder) in _failures.folders


def _sweep_of(folder: Path) -> Path:
    """The sweep folder of a run folder, a packed job's folder or the analysis run's."""
    if folder.parent.name == "wandb_jobs":
        return folder.parent.parent
    return folder.parent if folder.name == "wandb_analysis" else folder


EXPORT_AGAIN = "python -m rw_sweeps.sweeps.wandb_export {sweep} logs the finished runs wandb lacks"
LEAD = "warning: wandb logging failed: "


def said(lead: str = LEAD, again: str | None = EXPORT_AGAIN) -> str | None:
    """The failures since the last call as one line (`warning: wandb logging failed: …`), or None; each
    is said once. The tasks' reasons as they were raised, the writes of wandb's logs counted by reason,
    where the offline runs they leave incomplete are, and, for a full disk, the command (`again`, of the
    sweep folder) that logs them again once there is space."""
    f = _failures.take()
    parts = [r if n == 1 else f"{r} ({n} times)" for r, n in f.tasks.items()]
    parts += [f"{n} write{'s' if n > 1 else ''} of wandb's own logs failed ({r})" for r, n in f.writes.items()]
    if not parts:
        return None
    line = lead + "; ".join(parts)
    if f.folders:
        where = Path(os.path.commonpath([str(p) for p in f.folders]))
        line += f"; its offline runs in {where} may be incomplete"
        if f.disk_full and again:
            line += ": once there is space, " + again.format(sweep=_sweep_of(where))
    return line


def say(lead: str = LEAD, again: str | None = EXPORT_AGAIN) -> None:
    """Print `said()`'s line, if any, on stderr."""
    line = said(lead, again)
    if line is not None:
        print(line, file=sys.stderr, flush=True)


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
