"""wandb, and nothing else knows wandb. The local run folder is the source of truth; wandb is a viewer.

Offline by default, so nothing ever waits on a network (`wandb sync` uploads later); `WANDB_MODE`,
`WANDB_PROJECT`, `WANDB_ENTITY` and `WANDB_TAGS` are the `wandb.*` keys' defaults (`config.WandbConfig`).
A batch that gets per-run wandb runs streams them while it trains (`Live`: rows at each evaluation, stamped
with their real times); a packed job's single wandb run is logged when the job's runs end.

Granularity (`wandb.granularity`):
- `run`: one wandb run per training run, in the run's folder: the resolved config (nested as config.yaml
  nests it), the history (x-axis `step`) and the summary, `group` = the sweep, `job_type` = "train", the
  experiment as a tag, the name `wandb.name` (its values of the keys its sweep varies), and an id derived
  from the run folder so a re-run or requeued job continues the same wandb run. The dashboard groups and
  filters by every config key. Costs ~1 s for the first run of a process, then ~0.15 s a run.
- `job`: one wandb run per packed job (`job_type` = "packed"), in `<sweep>/wandb_jobs/`: its config what its
  runs share (nested), a `runs` table with one row per training run (`runs_table`: its name, every config
  key under its config.yaml path with its own value, every summary field; filter and group it by the swept
  keys) and the histories as a Parquet artifact. ~1–2 s per job of a few hundred runs.
- `auto` (default): `run` for batches of up to `per_run_limit` runs, else `job`.

Off the critical path: `log_runs` only queues its entries; one worker thread per process (`_Logger`) does the
logging, in order, while the next batch trains (wandb itself writes through its own service process).
`wait()` blocks until everything queued is logged; the launcher calls it when a process's work ends (the end
of a launch, a packed SLURM/submitit job), `rw_sweeps.sweeps.app.train` after a single run, and an exit hook calls it
before the interpreter (and wandb's own teardown) shuts down. Failures are never an exception (the run
folders are the source of truth): a task that raises and every failed write of wandb's own logs (a full
disk fails each message wandb logs) are counted, and `wait()` says them in one warning line
(`rw_sweeps.core.wandb_io.said`); a run whose wandb writes failed is not marked exported, so
`wandb_export` replays it.

Recovery: a run's summary.json is written *before* its wandb run (a background logger cannot keep the old
"log, then mark done" order), so a process killed in between leaves a finished run with no wandb run (or a
partial offline one). `python -m rw_sweeps.sweeps.wandb_export SWEEP` replays the finished run folders into per-run
wandb runs (the same shape as `run` granularity), skipping the ones whose marker (`EXPORTED`: run id, mode and
a hash of summary.json) says they are already logged; per-run logging here writes the same marker.

The sweep's own `job_type=analysis` run is `analysis.wandb_run`, attached by the Hydra callback that
`conf/config.yaml` ships (`analysis.callback.WandbAnalysis`, on `on_multirun_end`).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import threading
from pathlib import Path

from rw_sweeps.core import readers, results, store
from rw_sweeps.core.console import shown
from rw_sweeps.core.contract import CAPS, SUMMARY
from rw_sweeps.core.safefs import PlantedLink, atomic_write, owned_dirs, write_with
from rw_sweeps.core.wandb_io import SETTINGS as _SETTINGS, drop_partial as _drop_partial, readable, wandb as _wandb
from rw_sweeps.core.wandb_io import failed_in, say, task_failed
from rw_sweeps.core.wandb_io import leaves, run_name, runs_table, shared, table  # noqa: F401 - run_name: the names' owner

EXPORTED = ".wandb_exported.json"  # in a run folder: the wandb run that holds it (see `mark_exported`)

# ------------------------------------------------------------------------------------ the background logger
class _Logger:
    """One worker thread and its queue, per process: tasks run in order, each failure counted (`wait` says
    them in one line)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="rw_sweeps-wandb", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            fn, args, where = self.queue.get()
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the local results are the source of truth
                task_failed(exc, where)
            finally:
                self.queue.task_done()


_logger: _Logger | None = None
_lock = threading.Lock()
_hooked = False  # the exit hooks, registered once (a forked child inherits them, and they find its logger)


def submit(fn, *args, where: Path | None = None) -> None:
    """Run fn(*args) on this process's wandb worker thread, after everything queued before it; `where`: the
    folder whose wandb run it writes (named in the failure line)."""
    global _logger, _hooked
    with _lock:
        if _logger is None or _logger.pid != os.getpid():  # none yet, or inherited through a fork
            _logger = _Logger()
        if not _hooked:
            _hooked = True
            try:  # before wandb's own atexit teardown (threading's exit hooks run first, as for futures)
                threading._register_atexit(wait)  # type: ignore[attr-defined]
            except (AttributeError, RuntimeError):
                pass
            atexit.register(wait)  # the safety net; a no-op once the queue is drained
    _logger.queue.put((fn, args, where))


def wait() -> None:
    """Block until every entry queued in this process is logged, then say its failures in one line (on
    stderr, none if nothing failed). Raises nothing."""
    logger = _logger
    mine = logger is not None and logger.pid == os.getpid()
    if mine and threading.current_thread() is logger.thread:
        return  # a task waiting for itself: the worker's own failures are said by the waiter
    if mine:
        logger.queue.join()
    say()


def per_run(w: dict, runs: int) -> bool:
    """A batch of `runs` runs gets one wandb run per training run (else one per packed job)."""
    g = w.get("granularity", "auto")
    return g == "run" or (g == "auto" and runs <= w.get("per_run_limit", 32))


_said_packed = False  # the line below, once a process (every packed job of a launch would repeat it)


def _say_packed(w: dict, runs: int, sweep_dir: Path) -> None:
    """One line, the first time a process logs a job above `wandb.per_run_limit` as one wandb run: a user who
    expects a wandb run a training run learns why there is none, and the switch."""
    global _said_packed
    if _said_packed or w.get("granularity", "auto") != "auto":
        return
    _said_packed = True
    print(f"wandb: a job of {runs} runs is logged as one wandb run (job_type=packed, in "
          f"{shown(sweep_dir)}/wandb_jobs/): more than wandb.per_run_limit={w.get('per_run_limit', 32)}; "
          "wandb.granularity=run gives every run its own", flush=True)


def live(cfgs: list[dict], run_dirs: list[Path]) -> "Live | None":
    """The batch's wandb runs, logged while it trains, where it gets per-run wandb runs; else None (the
    runs are logged when they end, `log_runs`)."""
    w = cfgs[0]["wandb"]
    if w["mode"] == "disabled":
        return None
    if not per_run(w, len(cfgs)):
        _say_packed(w, len(cfgs), Path(run_dirs[0]).parent)
        return None
    if _stored(run_dirs):
        return None
    return Live(cfgs, [Path(d) for d in run_dirs], [results.run_id(d) for d in run_dirs])


class Live:
    """One batch's per-run wandb runs, streamed: each is started (`wandb.init`) when training starts, gets
    its new history rows whenever the training loop reports (`train(live=…)`, each row stamped with the wall
    time it was evaluated at, so `_timestamp` and `_runtime` are the training's own), and its summary when
    the run's folder is written (`finish`). Everything goes through the background logger, in order:
    training never waits on wandb."""

    def __init__(self, cfgs: list[dict], run_dirs: list[Path], run_ids: list[str]):
        self.cfgs, self.run_dirs, self.run_ids = cfgs, run_dirs, run_ids
        self.runs: list = [None] * len(cfgs)
        self.sent = [0] * len(cfgs)  # history rows handed to wandb, per run
        self.walls: dict = {}
        self.refused: set = set()
        for r in range(len(cfgs)):
            submit(self._start, r, where=self.run_dirs[r])

    def _start(self, r: int) -> None:
        try:
            self.runs[r] = _init(self.cfgs[r], self.run_dirs[r], self.run_ids[r])
        except PlantedLink:
            self.refused.add(r)  # a link at its wandb folder: refused once (warned), not replayed at the end
            raise

    def __call__(self, recs: list, walls: dict) -> None:
        self.walls = walls
        for r, rec in enumerate(recs):
            new = rec.history[self.sent[r]:]
            if new:
                self.sent[r] = len(rec.history)
                submit(self._rows, r, [dict(row) for row in new], {row["step"]: walls.get(row["step"]) for row in new},
                       where=self.run_dirs[r])

    def _rows(self, r: int, rows: list, walls: dict) -> None:
        if self.runs[r] is not None:
            _log_rows(self.runs[r], rows, walls)

    def finish(self, entries: dict) -> None:
        """entries: {run index: its entry (cfg, run_dir, run_id, history, summary)} for the runs whose folders
        were written; the others' wandb runs end without a summary (and are not marked exported)."""
        for r in range(len(self.cfgs)):
            e = entries.get(r)
            rest = e["history"][self.sent[r]:] if e is not None else []
            submit(self._end, r, [dict(row) for row in rest], dict(e["summary"]) if e is not None else None,
                   where=self.run_dirs[r])

    def _end(self, r: int, rest: list, summary: dict | None) -> None:
        run, self.runs[r] = self.runs[r], None
        if run is None:
            if summary is not None and r not in self.refused:  # its start failed (warned): replay it whole
                replay_run({"cfg": self.cfgs[r], "run_dir": self.run_dirs[r], "run_id": self.run_ids[r],
                            "history": rest, "summary": summary})
            return
        _close(run, rest, summary, self.run_dirs[r], self.run_ids[r], self.cfgs[r]["wandb"]["mode"], self.walls)


def log_runs(entries: list[dict]) -> None:
    """entries: dicts with cfg (resolved config dict), run_dir, run_id, history, summary. Returns at once:
    the logging happens on the background logger (`wait()` waits for it)."""
    entries = [{**e, "summary": dict(e["summary"])} for e in entries if e["cfg"]["wandb"]["mode"] != "disabled"]
    for fn, arg, where in _tasks(entries):
        submit(fn, arg, where=where)


def _log_runs(entries: list[dict]) -> None:
    """`log_runs`, now, on the calling thread."""
    for fn, arg, _ in _tasks(entries):
        fn(arg)


def _tasks(entries: list[dict]) -> list[tuple]:
    """(function, its argument, the folder it writes) for each logging task of a batch's ended runs: a task a
    run where each gets its own wandb run (one that fails leaves the others logged), else the packed job's."""
    if not entries:
        return []
    if per_run(entries[0]["cfg"]["wandb"], len(entries)) and not _stored([e["run_dir"] for e in entries]):
        return [(replay_run, e, Path(e["run_dir"])) for e in entries]
    return [(_log_job, entries, Path(entries[0]["run_dir"]).parent)]


def _stored(run_dirs: list) -> bool:
    """Are these the runs of a job writing the sweep's store? They have no folder for a wandb run of their own:
    their job is logged as one wandb run (in `<sweep>/wandb_jobs/`), and `wandb_export` gives each its own
    afterwards (in `<sweep>/wandb_store/`)."""
    return bool(run_dirs) and store.writer_for(run_dirs[0]) is not None


def name_of(overrides: list[str]) -> str:
    """A run's wandb name from its job's overrides of the keys its sweep varies (`planner.varying`), wandb's
    own keys left out (they change where the run is logged, not the run)."""
    return " ".join(o for o in overrides if not o.lstrip("+~").startswith("wandb."))


def _init(cfg: dict, run_dir: Path, run_id: str):
    """The training run's wandb run: id from its folder, the sweep as its group, its config."""
    wandb = _wandb()
    w = cfg["wandb"]
    owned_dirs(run_dir, "wandb")  # wandb writes into <run>/wandb by path: a link planted there is refused
    if w["mode"] == "offline":
        _drop_partial(Path(run_dir) / "wandb", run_id)
    tags = list(w.get("tags") or []) + ([cfg["experiment"]] if cfg.get("experiment") else [])
    return wandb.init(project=w["project"], entity=w.get("entity"), group=w["group"], job_type="train",
                      tags=tags, name=run_name(cfg), id=run_id, resume="allow", mode=w["mode"], dir=str(run_dir),
                      config=cfg, reinit="create_new", settings=wandb.Settings(**_SETTINGS))


def _log_rows(run, rows: list, walls: dict | None = None) -> None:
    """History rows, x-axis `step`; with `walls` (step → wall time) each stamped with its own time."""
    for row in rows:
        data = {k: v for k, v in row.items() if v is not None}
        if walls and walls.get(row["step"]) is not None:
            data["_timestamp"] = walls[row["step"]]
        run.log(data, step=row["step"])


def _close(run, rows: list, summary: dict | None, run_dir: Path, run_id: str, mode: str,
           walls: dict | None = None) -> None:
    """The last rows and the summary, then the end of the wandb run; marked exported if it has its summary."""
    try:
        _log_rows(run, rows, walls)
        if summary is not None:
            run.summary.update({k: v for k, v in summary.items() if v is not None})
    finally:
        run.finish()
    if summary is not None and not failed_in(run_dir):  # a failed write of its logs: maybe incomplete
        mark_exported(run_dir, run_id, mode)


def replay_run(e: dict) -> None:
    """One finished run logged whole, now, on the calling thread, as one wandb run of the shape
    `wandb.granularity=run` logs (its config, history and summary), then marked exported. `e`: cfg (the
    resolved config dict), run_dir, run_id, history, summary. How per-run logging logs a batch's runs that
    ended (`log_runs`) and a streamed run whose start failed, and what `rw_sweeps.sweeps.wandb_export`
    replays run folders with."""
    run = _init(e["cfg"], e["run_dir"], e["run_id"])
    _close(run, e["history"], e["summary"], e["run_dir"], e["run_id"], e["cfg"]["wandb"]["mode"])


MARKER_CAP = 4096  # bytes of `.wandb_exported.json` (three short fields)


def summary_hash(run_dir: Path) -> str | None:
    """SHA-1 of the run's summary.json as the contract reads it (a regular file within its cap), or None."""
    try:
        return hashlib.sha1(readers.read_bytes(Path(run_dir) / SUMMARY, CAPS[SUMMARY])).hexdigest()
    except (OSError, readers.Broken):
        return None


def mark_exported(run_dir: Path, run_id: str, mode: str) -> None:
    """Record that the run's folder, as its summary.json now reads, is logged as wandb run `run_id`."""
    digest = summary_hash(run_dir)
    if digest is None:  # no summary on disk: nothing to vouch for
        return
    atomic_write(Path(run_dir) / EXPORTED, json.dumps({"run_id": run_id, "mode": mode, "summary_sha1": digest}))


def is_exported(run_dir: Path, run_id: str, mode: str) -> bool:
    """The marker says this run, with this very summary.json, is logged as `run_id` in this mode."""
    try:
        m = readers.read_json(Path(run_dir) / EXPORTED, MARKER_CAP)
    except (OSError, readers.Broken):
        return False
    return (isinstance(m, dict) and m.get("run_id") == run_id and m.get("mode") == mode
            and m.get("summary_sha1") == summary_hash(run_dir))


def _log_job(entries: list[dict]) -> None:
    wandb = _wandb()
    w = entries[0]["cfg"]["wandb"]
    common = shared([e["cfg"] for e in entries])
    same = leaves(common)
    swept = sorted({k for e in entries for k in leaves(e["cfg"])} - set(same) - {"wandb.name"})
    job_id = hashlib.sha1("".join(sorted(str(e["run_dir"]) for e in entries)).encode()).hexdigest()[:16]
    sweep_dir = Path(entries[0]["run_dir"]).parent
    folder = owned_dirs(sweep_dir, "wandb_jobs", job_id)  # never through a planted link
    owned_dirs(folder, "wandb")
    owned_dirs(folder, ".wandb_data")
    if w["mode"] == "offline":
        _drop_partial(folder / "wandb", job_id)
    # wandb stages artifact files under ~/.local/share/wandb unless told otherwise: keep everything that
    # `wandb sync` needs inside the sweep folder, so the folder can be synced from another machine.
    os.environ["WANDB_DATA_DIR"] = str(folder / ".wandb_data")
    tags = list(w.get("tags") or []) + sorted({e["cfg"]["experiment"] for e in entries if e["cfg"].get("experiment")})
    # its config: what its runs share, nested as in config.yaml (wandb.name is each run's own, in the table)
    common.get("wandb", {}).pop("name", None)
    run = wandb.init(project=w["project"], entity=w.get("entity"), group=w["group"], job_type="packed", tags=tags, id=job_id,
                     name=f"packed {len(entries)} runs", resume="allow", mode=w["mode"], dir=str(folder),
                     config={**common, "swept": swept, "runs": len(entries)}, reinit="create_new",
                     settings=wandb.Settings(**_SETTINGS))
    try:
        cols, rows = runs_table(entries, sweep_dir)
        # Histories go as one Parquet artifact, not a Table: wandb type-checks every Table cell in Python
        # (~0.2 ms a row, seconds for a packed job), and the run folders hold them anyway; a run's curves in
        # wandb are its own wandb run's (`wandb.granularity=run`, or `rw_sweeps.sweeps.wandb_export` later).
        import pandas as pd  # pandas: only a packed job's history artifact needs it

        hist = pd.DataFrame([{"run_id": e["run_id"], "name": run_name(e["cfg"]), **{k: f.get(k) for k in swept}, **row}
                             for e in entries for f in [leaves(e["cfg"])] for row in e["history"]])
        write_with(folder / "history.parquet", lambda fh: hist.to_parquet(fh, index=False))
        art = wandb.Artifact(f"history-{job_id}", type="history", metadata={"swept": swept})
        art.add_file(str(folder / "history.parquet"), policy="immutable")  # referenced in place, not copied
        run.log_artifact(art)
        run.log({"runs": table(cols, rows)})
        done = [e["summary"] for e in entries if e["summary"].get("status") == "done"]
        run.summary.update({"runs": len(entries), "done": len(done),
                            "mean_test_acc": sum(s["test_acc"] for s in done) / len(done) if done else None})
    finally:
        run.finish()
        readable(folder / ".wandb_data")
