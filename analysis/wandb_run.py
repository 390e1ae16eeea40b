"""The sweep's analysis run: one wandb run, `job_type=analysis`, in the sweep's group, with its phase diagrams,
its runs table and every column of every run as a Parquet artifact, read from the run folders. Its id is
derived from the sweep folder, so a re-run sweep continues it rather than adding a second one.
`analysis.callback.WandbAnalysis` logs it when a sweep ends.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from rw_sweeps.core.safefs import owned_dirs
from rw_sweeps.core import contract, readers, store
from rw_sweeps.core.wandb_io import SETTINGS as _SETTINGS, drop_partial as _drop_partial, readable, runs_table, table
from rw_sweeps.core.wandb_io import said, say, wandb as _wandb


def analysis_id(sweep_dir: Path) -> str:
    """Deterministic per sweep folder, so a re-run sweep continues its analysis run (never a second one)."""
    return hashlib.sha1(f"analysis:{Path(sweep_dir).resolve()}".encode()).hexdigest()[:16]


def warm() -> None:
    """Import what the analysis run needs (matplotlib, analysis, wandb), so that the sweep's end does not wait
    for it: `callback.WandbAnalysis` calls it on a thread while the sweep trains."""
    # matplotlib, pandas (load, phase) and wandb: warming them is this function's purpose; the callback that
    # imports this module is instantiated by Hydra at every launch, before any run trains
    import matplotlib

    matplotlib.use("Agg")
    # pyplot and the report's modules (pandas): warmed likewise, once the backend above is chosen
    import matplotlib.pyplot  # noqa: F401

    from . import load, phase  # noqa: F401

    _wandb()


LEAD = "warning: wandb analysis run incomplete: "  # beside the callback's `… not logged: …` for an error
AGAIN = "the same launch again logs the sweep's analysis run"


def log_analysis(sweep_dir: Path, w: dict) -> None:
    """One wandb run, job_type=analysis, in the sweep's group: every figure of the sweep's report (`python -m
    analysis SWEEP`'s, built into `<sweep>/wandb_analysis/report/` by `analysis.__main__.build`), the runs
    table (`runs_table`: one row per run, its config keys at their config.yaml paths, its summary fields and
    `success`) and every column of every run as a Parquet artifact. What wandb failed to write of it (a full
    disk fails every message of its log) is one line (`wandb_io.say`); an error it raises is the caller's
    one line, and the failed writes that came with it are not said again."""
    try:
        _log_analysis(sweep_dir, w)
    except Exception:
        said()
        raise
    say(lead=LEAD, again=AGAIN)


def _log_analysis(sweep_dir: Path, w: dict) -> None:
    # matplotlib: only once a sweep has ended; the callback that imports this module is instantiated by
    # Hydra at every launch
    import matplotlib

    matplotlib.use("Agg")  # the worker thread draws without a display

    # the report's modules (pandas, matplotlib's pyplot): likewise, once the backend above is chosen
    from .__main__ import build
    from .load import config_keys
    from .phase import swept_keys

    sweep_dir = Path(sweep_dir).absolute()
    folder = owned_dirs(sweep_dir, "wandb_analysis")  # every folder written by path: a planted link refused
    owned_dirs(folder, "report")
    owned_dirs(folder, "wandb")
    owned_dirs(folder, ".wandb_data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a stale Parquet cache is rebuilt; nothing for a sweep's log
        rep = build([sweep_dir], folder / "report")
    runs = rep.runs
    if not len(runs):
        return
    wandb = _wandb()
    run_id = analysis_id(sweep_dir)
    if w["mode"] == "offline":
        _drop_partial(folder / "wandb", run_id)
    # wandb stages what it uploads (the table) under WANDB_DATA_DIR, inside the sweep; `readable` after
    os.environ["WANDB_DATA_DIR"] = str(folder / ".wandb_data")

    def most_common(col, default):
        s = runs[col].dropna() if col in runs.columns else None
        return s.mode().iloc[0] if s is not None and len(s) else default

    group = w.get("group") or most_common("wandb.group", None)
    swept = swept_keys(runs)
    images = {Path(f["file"]).stem: wandb.Image(str(rep.path.parent / f["file"]), caption=f["caption"])
              for f in rep.figures if "file" in f}
    # The table: one row per run, its config.yaml and summary.json as the files hold them (`runs_table`, the
    # packed jobs' too) and `success`; every column of every run goes as the report's runs.parquet, an
    # artifact referenced in place.
    keys = config_keys(runs)
    runs.attrs = {}
    entries = []
    for path, success in zip(runs["path"], runs["success"]):
        try:
            stored = store.stored_verdict(path) if not os.path.lexists(path) else None  # a run of the sweep's store
            cfg, summary = (stored.config, stored.summary) if stored is not None else \
                (contract.read_config(path), contract.read_summary(path))
            entries.append({"cfg": cfg, "run_dir": Path(path), "summary": {**summary, "success": bool(success)}})
        except (OSError, readers.Broken):
            continue  # changed since the report read it: the report and runs.parquet still have it
    cols, data = runs_table(entries, sweep_dir)
    counts = runs["status"].value_counts().to_dict()
    run = wandb.init(project=w.get("project") or most_common("wandb.project", "rw-sweeps"),
                     entity=w.get("entity"), group=group,
                     job_type="analysis", id=run_id, name=f"analysis {len(runs)} runs", resume="allow",
                     mode=w["mode"], dir=str(folder), tags=list(w.get("tags") or []), reinit="create_new",
                     config={"sweep": str(sweep_dir), "runs": len(runs), "swept": swept,
                             "axes": [k for k in rep.axes if k], "config_keys": keys},
                     settings=wandb.Settings(**_SETTINGS))
    try:
        art = wandb.Artifact(f"runs-{run_id}", type="runs", metadata={"swept": swept, "runs": len(runs)})
        art.add_file(str(rep.path.parent / "runs.parquet"), policy="immutable")
        run.log_artifact(art)
        run.log({**images, "runs": table(cols, data)})
        run.summary.update({"runs": len(runs), **{f"runs_{k}": int(v) for k, v in counts.items()},
                            "success_rate": float(runs["success"].mean()), "figures": len(images)})
    finally:
        run.finish()
        readable(folder / ".wandb_data")

