"""The sweep's analysis run: one wandb run, `job_type=analysis`, in the sweep's group, with its phase diagram
(the success rate over the swept keys: one per data family, or an adaptive sweep's triangulation), its runs
table and every column of every run as a Parquet artifact, read from the run folders. Its id is derived from
the sweep folder, so a re-run sweep continues it rather than adding a second one.
`analysis.callback.WandbAnalysis` logs it when a sweep ends.

It carries the headline only, so that it costs a launch well below its training: the step diagrams, the
learning curves and the report's other figures are `python -m analysis SWEEP --out DIR [--wandb]`'s (the
curves of a per-run-logged sweep are in its training runs' own wandb runs).
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from rw_sweeps.core.safefs import owned_dirs, write_with
from rw_sweeps.core import contract, readers, store
from rw_sweeps.core.wandb_io import SETTINGS as _SETTINGS, drop_partial as _drop_partial, readable, runs_table, table
from rw_sweeps.core.wandb_io import said, say, wandb as _wandb

DPI = 90  # a dashboard panel's figure: the report's (110) at a third fewer pixels to draw and encode


def analysis_id(sweep_dir: Path) -> str:
    """Deterministic per sweep folder, so a re-run sweep continues its analysis run (never a second one)."""
    return hashlib.sha1(f"analysis:{Path(sweep_dir).resolve()}".encode()).hexdigest()[:16]


def warm() -> None:
    """Import what the analysis run needs (matplotlib, the loader and the phase diagram, wandb), so that the
    sweep's end does not wait for it: `callback.WandbAnalysis` calls it on a thread while the sweep trains."""
    # matplotlib, pandas (load, phase) and wandb: warming them is this function's purpose; the callback that
    # imports this module is instantiated by Hydra at every launch, before any run trains
    import matplotlib

    matplotlib.use("Agg")
    # pyplot and the diagram's modules (pandas): warmed likewise, once the backend above is chosen
    import matplotlib.pyplot  # noqa: F401

    from . import load, phase  # noqa: F401

    _wandb()


LEAD = "warning: wandb analysis run incomplete: "  # beside the callback's `… not logged: …` for an error
AGAIN = "the same launch again logs the sweep's analysis run"


def log_analysis(sweep_dir: Path, w: dict) -> tuple[int, int]:
    """One wandb run, job_type=analysis, in the sweep's group: the sweep's phase diagram (`figures`), the
    runs table (`runs_table`: one row per run, its config keys at their config.yaml paths, its summary fields
    and `success`) and every column of every run as a Parquet artifact. Returns (runs, figures) logged. What
    wandb failed to write of it (a full disk fails every message of its log) is one line (`wandb_io.say`); an
    error it raises is the caller's one line, and the failed writes that came with it are not said again."""
    try:
        logged = _log_analysis(sweep_dir, w)
    except Exception:
        said()
        raise
    say(lead=LEAD, again=AGAIN)
    return logged


def figures(runs, notes: list[str]) -> list[tuple]:
    """(name, caption, draw) of the analysis run's figures: the success rate over the swept keys, one
    diagram per data family of a grid; an adaptive sweep's over its learner's points."""
    # the diagrams' modules (pandas, pyplot): only once a sweep has ended, as `_log_analysis` says
    from .adaptive import adaptive_figures, names_any, read_record
    from .phase import phase_diagram, swept_keys

    records = {}
    for sweep in dict.fromkeys(runs["sweep"]):
        try:
            rec = read_record(sweep)
        except readers.Broken as e:
            notes.append(f"{sweep}: {e.why}; drawn as a grid")
            continue
        if rec is not None and names_any(runs[runs["sweep"] == sweep], rec):
            records[sweep] = rec
    if records:
        return adaptive_figures(runs, records, notes)
    families = list(dict.fromkeys(runs["data.name"].dropna())) if "data.name" in runs else []
    out = []
    for family in families if len(families) > 1 else [None]:
        sub = runs[runs["data.name"] == family] if family else runs
        x, y, row, col = (swept_keys(sub) + [None] * 4)[:4]
        x = x or next((k for k in ("data.p", "data.name", "init") if k in sub.columns), "status")
        on = " × ".join(k for k in (x, y) if k) + "".join(f", by {k}" for k in (row, col) if k)
        out.append((f"phase_success{'_' + family if family else ''}",
                    f"success over {on}" + (f" ({family})" if family else ""),
                    lambda sub=sub, a=(x, y, "success", row, col): phase_diagram(sub, *a)))
    return out


def _log_analysis(sweep_dir: Path, w: dict) -> tuple[int, int]:
    # matplotlib: only once a sweep has ended; the callback that imports this module is instantiated by
    # Hydra at every launch
    import matplotlib

    matplotlib.use("Agg")  # the worker thread draws without a display

    # the loader and the diagrams (pandas, matplotlib's pyplot): likewise, once the backend above is chosen
    import matplotlib.pyplot as plt

    from .load import config_keys, load_runs
    from .phase import add_success, swept_keys

    sweep_dir = Path(sweep_dir).absolute()
    folder = owned_dirs(sweep_dir, "wandb_analysis")  # every folder written by path: a planted link refused
    drawn = owned_dirs(folder, "figures")
    owned_dirs(folder, "wandb")
    owned_dirs(folder, ".wandb_data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a stale Parquet cache is rebuilt; nothing for a sweep's log
        runs = load_runs(sweep_dir, progress=False)
    if not len(runs):
        return 0, 0
    runs = add_success(runs)
    wandb = _wandb()
    images, notes = {}, []
    for name, caption, draw in figures(runs, notes):
        fig = draw()
        try:
            write_with(drawn / f"{name}.png", lambda fh: fig.savefig(fh, format="png", dpi=DPI))
        finally:
            plt.close(fig)
        images[name] = wandb.Image(str(drawn / f"{name}.png"), caption=caption)
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
    keys = config_keys(runs)
    table_ = runs.copy()
    table_.attrs = {"config_keys": keys}
    write_with(folder / "runs.parquet", lambda fh: table_.to_parquet(fh, index=False))
    cols, data = runs_table(_entries(runs), sweep_dir)
    counts = runs["status"].value_counts().to_dict()
    run = wandb.init(project=w.get("project") or most_common("wandb.project", "rw-sweeps"),
                     entity=w.get("entity"), group=group,
                     job_type="analysis", id=run_id, name=f"analysis {len(runs)} runs", resume="allow",
                     mode=w["mode"], dir=str(folder), tags=list(w.get("tags") or []), reinit="create_new",
                     config={"sweep": str(sweep_dir), "runs": len(runs), "swept": swept,
                             "axes": swept[:4], "config_keys": keys, "notes": notes},
                     settings=wandb.Settings(**_SETTINGS))
    try:
        art = wandb.Artifact(f"runs-{run_id}", type="runs", metadata={"swept": swept, "runs": len(runs)})
        art.add_file(str(folder / "runs.parquet"), policy="immutable")
        run.log_artifact(art)
        run.log({**images, "runs": table(cols, data)})
        run.summary.update({"runs": len(runs), **{f"runs_{k}": int(v) for k, v in counts.items()},
                            "success_rate": float(runs["success"].astype(float).mean()), "figures": len(images)})
    finally:
        run.finish()
        readable(folder / ".wandb_data")
    return len(runs), len(images)


def _entries(runs) -> list[dict]:
    """The table's rows as `runs_table` takes them: each run's config.yaml and summary.json as the files hold
    them (a stored run's from the sweep's store), with `success`."""
    import pandas as pd  # pandas: its NA, which `runs` (a DataFrame) already holds; the module imports it lazily

    entries = []
    for path, success in zip(runs["path"], runs["success"]):
        try:
            stored = store.stored_verdict(path) if not os.path.lexists(path) else None  # a run of the sweep's store
            cfg, summary = (stored.config, stored.summary) if stored is not None else \
                (contract.read_config(path), contract.read_summary(path))
            # <NA>: success undefined (OPT within tol of chance, `phase.success_undefined`): None, not False
            entries.append({"cfg": cfg, "run_dir": Path(path), "summary": {**summary, "success": None if pd.isna(success) else bool(success)}})
        except (OSError, readers.Broken):
            continue  # changed since it was loaded: runs.parquet still has it
    return entries
