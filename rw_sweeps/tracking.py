"""wandb, and nothing else knows wandb. The local run folder is the source of truth; wandb is a viewer.

Runs are logged when they end (a §5 run trains in well under a second; streaming would only add
overhead), offline by default so nothing ever waits on a network (`wandb sync` uploads later).

Granularity (`wandb.granularity`):
- `run`: one wandb run per training run, in the run's folder: the resolved config, the history (x-axis
  `step`) and the summary, `group` = the sweep, `job_type` = "train", the experiment as a tag, and an id
  derived from the run folder so a re-run or requeued job continues the same wandb run. The dashboard
  groups and filters by every config key. Costs ~1 s for the first run of a process, then ~0.15 s a run.
- `job`: one wandb run per packed job (`job_type` = "packed"), in `<sweep>/wandb_jobs/`: a `runs` table
  with one row per training run (every config key as a dotted column, every summary field; filter and
  group it by the swept keys) and the histories as a Parquet artifact. ~1–2 s per job of a few hundred runs.
- `auto` (default): `run` for batches of up to `per_run_limit` runs, else `job`.

Off the critical path: `log_runs` only queues its entries; one worker thread per process (`_Logger`) does the
logging, in order, while the next batch trains (wandb itself writes through its own service process).
`wait()` blocks until everything queued is logged; the launcher calls it when a process's work ends (the end
of a launch, a packed SLURM/submitit job), `rw_sweeps.app.train` after a single run, and an exit hook calls it
before the interpreter (and wandb's own teardown) shuts down. A failure is one warning line, never an
exception: the run folders are the source of truth.

Recovery: a run's summary.json is written *before* its wandb run (a background logger cannot keep the old
"log, then mark done" order), so a process killed in between leaves a finished run with no wandb run (or a
partial offline one). `python -m rw_sweeps.wandb_export SWEEP` replays the finished run folders into per-run
wandb runs (the same shape as `run` granularity), skipping the ones whose marker (`EXPORTED`: run id, mode and
a hash of summary.json) says they are already logged; per-run logging here writes the same marker.

`log_analysis(sweep_dir, cfg)`: when a sweep ends, one `job_type=analysis` run in the sweep's group (id derived
from the sweep folder: a re-run continues it) with its phase diagrams and runs table, also in the background.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import shutil
import sys
import threading
from pathlib import Path

from .safefs import write_with

# disable_job_creation is wandb's documented switch for W&B Launch jobs (already its default in 0.31); wandb
# still imports `wandb.sdk.launch` once per process in `_detect_and_apply_job_inputs` (0.3–2 s, pydantic),
# which no setting skips: it is paid once per process, in the background logger.
_SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                 disable_job_creation=True, x_save_requirements=False)  # no pip freeze per run (~0.15 s)
EXPORTED = ".wandb_exported.json"  # in a run folder: the wandb run that holds it (see `mark_exported`)


def _wandb():
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # lazily: importing wandb alone costs ~1.5 s

    return wandb


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if not isinstance(v, list) else str(v)
    return out


# ------------------------------------------------------------------------------------ the background logger
class _Logger:
    """One worker thread and its queue, per process: tasks run in order, each failure is one warning line."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="rw_sweeps-wandb", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            fn, args = self.queue.get()
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the local results are the source of truth
                msg = str(exc).strip().splitlines()
                print(f"warning: wandb logging failed: {type(exc).__name__}: {msg[0] if msg else ''}".rstrip(),
                      file=sys.stderr, flush=True)
            finally:
                self.queue.task_done()


_logger: _Logger | None = None
_lock = threading.Lock()
_hooked = False  # the exit hooks, registered once (a forked child inherits them, and they find its logger)


def submit(fn, *args) -> None:
    """Run fn(*args) on this process's wandb worker thread, after everything queued before it."""
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
    _logger.queue.put((fn, args))


def wait() -> None:
    """Block until every entry queued in this process is logged. Raises nothing (failures were warned)."""
    logger = _logger
    if logger is None or logger.pid != os.getpid() or threading.current_thread() is logger.thread:
        return
    logger.queue.join()


def log_runs(entries: list[dict]) -> None:
    """entries: dicts with cfg (resolved config dict), run_dir, run_id, history, summary. Returns at once:
    the logging happens on the background logger (`wait()` waits for it)."""
    entries = [{**e, "summary": dict(e["summary"])} for e in entries if e["cfg"]["wandb"]["mode"] != "disabled"]
    if entries:
        submit(_log_runs, entries)


def _log_runs(entries: list[dict]) -> None:
    w = entries[0]["cfg"]["wandb"]
    per_run = w.get("granularity", "auto") == "run" or (
        w.get("granularity", "auto") == "auto" and len(entries) <= w.get("per_run_limit", 32))
    if per_run:
        for e in entries:
            _log_one(e)
    else:
        _log_job(entries)


def _drop_partial(wandb_dir: Path, run_id: str) -> None:
    """A run is logged whole when it ends, so an offline run left by a killed or concurrent attempt is
    replaced, never kept beside the new one (`wandb sync` would upload both under one id)."""
    for old in Path(wandb_dir).glob(f"offline-run-*-{run_id}"):
        shutil.rmtree(old, ignore_errors=True)


def _log_one(e: dict) -> None:
    wandb = _wandb()
    cfg, w = e["cfg"], e["cfg"]["wandb"]
    if w["mode"] == "offline":
        _drop_partial(Path(e["run_dir"]) / "wandb", e["run_id"])
    name = f"p={cfg['data']['p']} {cfg['init']['name']} seed={cfg['seed']}"
    tags = list(w.get("tags") or []) + ([cfg["experiment"]] if cfg.get("experiment") else [])
    run = wandb.init(project=w["project"], group=w["group"], job_type="train", tags=tags, name=name,
                     id=e["run_id"], resume="allow", mode=w["mode"], dir=str(e["run_dir"]), config=cfg,
                     reinit="create_new", settings=wandb.Settings(**_SETTINGS))
    try:
        for row in e["history"]:
            run.log({k: v for k, v in row.items() if v is not None}, step=row["step"])
        run.summary.update({k: v for k, v in e["summary"].items() if v is not None})
    finally:
        run.finish()
    mark_exported(e["run_dir"], e["run_id"], w["mode"])


def summary_hash(run_dir: Path) -> str | None:
    try:
        return hashlib.sha1((Path(run_dir) / "summary.json").read_bytes()).hexdigest()
    except OSError:
        return None


def mark_exported(run_dir: Path, run_id: str, mode: str) -> None:
    """Record that the run's folder, as its summary.json now reads, is logged as wandb run `run_id`."""
    digest = summary_hash(run_dir)
    if digest is None:  # no summary on disk: nothing to vouch for
        return
    from .results import atomic_write

    atomic_write(Path(run_dir) / EXPORTED, json.dumps({"run_id": run_id, "mode": mode, "summary_sha1": digest}))


def is_exported(run_dir: Path, run_id: str, mode: str) -> bool:
    """The marker says this run, with this very summary.json, is logged as `run_id` in this mode."""
    try:
        m = json.loads((Path(run_dir) / EXPORTED).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(m, dict) and m.get("run_id") == run_id and m.get("mode") == mode
            and m.get("summary_sha1") == summary_hash(run_dir))


def _log_job(entries: list[dict]) -> None:
    wandb = _wandb()
    w = entries[0]["cfg"]["wandb"]
    flat = [_flat(e["cfg"]) for e in entries]
    common = {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat)}
    swept = sorted(k for k in flat[0] if k not in common)
    job_id = hashlib.sha1("".join(sorted(str(e["run_dir"]) for e in entries)).encode()).hexdigest()[:16]
    sweep_dir = Path(entries[0]["run_dir"]).parent
    folder = sweep_dir / "wandb_jobs" / job_id
    folder.mkdir(parents=True, exist_ok=True)
    if w["mode"] == "offline":
        _drop_partial(folder / "wandb", job_id)
    # wandb stages artifact files under ~/.local/share/wandb unless told otherwise: keep everything that
    # `wandb sync` needs inside the sweep folder, so the folder can be synced from another machine.
    os.environ["WANDB_DATA_DIR"] = str(folder / ".wandb_data")
    tags = list(w.get("tags") or []) + sorted({e["cfg"]["experiment"] for e in entries if e["cfg"].get("experiment")})
    run = wandb.init(project=w["project"], group=w["group"], job_type="packed", tags=tags, id=job_id,
                     name=f"packed {len(entries)} runs", resume="allow", mode=w["mode"], dir=str(folder),
                     config={**common, "swept": swept, "runs": len(entries)}, reinit="create_new",
                     settings=wandb.Settings(**_SETTINGS))
    try:
        summary_keys = sorted({k for e in entries for k in e["summary"]})
        cols = ["run_dir"] + [k for k in flat[0]] + [f"summary.{k}" for k in summary_keys]
        rows = [[str(e["run_dir"])] + [f[k] for k in flat[0]] + [e["summary"].get(k) for k in summary_keys]
                for e, f in zip(entries, flat)]
        # Histories go as one Parquet artifact, not a Table: wandb type-checks every Table cell in Python
        # (~0.2 ms a row, seconds for a packed job), and the run folders hold them anyway.
        import pandas as pd

        hist = pd.DataFrame([{"run_id": e["run_id"], **{k: f.get(k) for k in swept}, **row}
                             for e, f in zip(entries, flat) for row in e["history"]])
        write_with(folder / "history.parquet", lambda fh: hist.to_parquet(fh, index=False))
        art = wandb.Artifact(f"history-{job_id}", type="history", metadata={"swept": swept})
        art.add_file(str(folder / "history.parquet"), policy="immutable")  # referenced in place, not copied
        run.log_artifact(art)
        run.log({"runs": wandb.Table(columns=cols, data=rows, allow_mixed_types=True)})
        done = [e["summary"] for e in entries if e["summary"].get("status") == "done"]
        run.summary.update({"runs": len(entries), "done": len(done),
                            "mean_test_acc": sum(s["test_acc"] for s in done) / len(done) if done else None})
    finally:
        run.finish()


# ------------------------------------------------------------------------------------ the analysis run
TABLE_METRICS = ("status", "success", "test_acc", "opt_acc", "test_kl", "parent_attention", "v_pi_cosine",
                 "attention_spread", "symmetry_break_step", "train_loss", "steps")


def analysis_id(sweep_dir: Path) -> str:
    """Deterministic per sweep folder, so a re-run sweep continues its analysis run (never a second one)."""
    return hashlib.sha1(f"analysis:{Path(sweep_dir).resolve()}".encode()).hexdigest()[:16]


def warm_analysis(w: dict) -> None:
    """Import what the analysis run needs on the logger thread now, while the sweep trains, not after it."""
    if w.get("mode", "offline") != "disabled" and w.get("analysis", True):
        submit(_warm)


def _warm() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    import analysis.load  # noqa: F401
    import analysis.phase  # noqa: F401

    _wandb()


def log_analysis(sweep_dir: Path, w: dict) -> None:
    """Queue the sweep's analysis run (`w`: the sweep's wandb settings; the group defaults to the runs')."""
    if w.get("mode", "offline") != "disabled" and w.get("analysis", True):
        submit(_log_analysis, Path(sweep_dir).absolute(), dict(w))


def _log_analysis(sweep_dir: Path, w: dict) -> None:
    """One wandb run, job_type=analysis, in the sweep's group: the phase diagrams (success rate, and the
    mean symmetry-break step when runs have one) over the swept keys, the runs table (one row per run: the
    swept keys, seed and headline metrics) and every column of every run as a Parquet artifact, from the run
    folders through `analysis` (`load_runs`, `phase_diagram`)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # the worker thread draws without a display
    import matplotlib.pyplot as plt

    from analysis.load import config_keys, load_runs
    from analysis.phase import add_success, phase_diagram, swept_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a stale Parquet cache is rebuilt; nothing for a sweep's log
        runs = load_runs(sweep_dir, progress=False)
    if not len(runs):
        return
    runs = add_success(runs)
    wandb = _wandb()
    folder = sweep_dir / "wandb_analysis"
    folder.mkdir(parents=True, exist_ok=True)
    run_id = analysis_id(sweep_dir)
    if w["mode"] == "offline":
        _drop_partial(folder / "wandb", run_id)
    os.environ["WANDB_DATA_DIR"] = str(folder / ".wandb_data")  # the table's staging, inside the sweep
    def most_common(col, default):
        s = runs[col].dropna() if col in runs.columns else None
        return s.mode().iloc[0] if s is not None and len(s) else default

    group = w.get("group") or most_common("wandb.group", None)
    swept = swept_keys(runs)
    axes = (swept + [None] * 4)[:4]
    if "init.sigma" in axes and "init" in axes:  # zero init is the σ axis's own column
        axes = ([k for k in axes if k != "init"] + [None])[:4]
    if axes[0] is None:
        axes[0] = next((k for k in ("data.p", "data.name", "init") if k in runs.columns), "status")
    images = {}
    for metric in ("success", "symmetry_break_step"):
        if metric in runs.columns and runs[metric].notna().any():
            fig, _ = phase_diagram(runs, *axes[:2], metric, *axes[2:])
            path = folder / f"phase_{metric}.png"
            write_with(path, lambda fh: fig.savefig(fh, format="png", dpi=90, bbox_inches="tight"))
            plt.close(fig)
            images[f"phase_{metric}"] = wandb.Image(str(path), caption=f"{metric} over {' × '.join(k for k in axes if k)}")
    # The table: the swept keys and the headline metrics, from plain lists (wandb type-checks every cell in
    # Python, and a DataFrame's attrs are deep-copied on every column access); every column of every run
    # goes as the sweep's runs.parquet (load_runs' cache), an artifact referenced in place.
    keys = config_keys(runs)
    runs.attrs = {}
    cols = [c for c in ["run", *swept, "seed", *TABLE_METRICS] if c in runs.columns]
    cols = list(dict.fromkeys(cols))
    data = [[None if isinstance(v, float) and v != v else v.item() if hasattr(v, "item") else v for v in row]
            for row in runs[cols].itertuples(index=False, name=None)]
    counts = runs["status"].value_counts().to_dict()
    run = wandb.init(project=w.get("project") or most_common("wandb.project", "rw-sweeps"), group=group,
                     job_type="analysis", id=run_id, name=f"analysis {len(runs)} runs", resume="allow",
                     mode=w["mode"], dir=str(folder), tags=list(w.get("tags") or []), reinit="create_new",
                     config={"sweep": str(sweep_dir), "runs": len(runs), "swept": swept,
                             "axes": [k for k in axes if k], "config_keys": keys},
                     settings=wandb.Settings(**_SETTINGS))
    try:
        if (sweep_dir / "runs.parquet").exists():  # a copy: the sweep's own is a cache, rewritten at will
            shutil.copyfile(sweep_dir / "runs.parquet", folder / "runs.parquet")
            art = wandb.Artifact(f"runs-{run_id}", type="runs", metadata={"swept": swept, "runs": len(runs)})
            art.add_file(str(folder / "runs.parquet"), policy="immutable")
            run.log_artifact(art)
        run.log({**images, "runs": wandb.Table(columns=cols, data=data, allow_mixed_types=True)})
        run.summary.update({"runs": len(runs), **{f"runs_{k}": int(v) for k, v in counts.items()},
                            "success_rate": float(runs["success"].mean())})
    finally:
        run.finish()
