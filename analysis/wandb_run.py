"""The sweep's analysis run: one wandb run, `job_type=analysis`, in the sweep's group, with its phase diagrams,
its runs table and every column of every run as a Parquet artifact, read from the run folders. Its id is
derived from the sweep folder, so a re-run sweep continues it rather than adding a second one.
`analysis.callback.WandbAnalysis` logs it when a sweep ends.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from rw_sweeps.core.safefs import write_with
from rw_sweeps.core.wandb_io import SETTINGS as _SETTINGS, drop_partial as _drop_partial, wandb as _wandb

TABLE_METRICS = ("status", "success", "test_acc", "opt_acc", "test_kl", "parent_attention", "v_pi_cosine",
                 "attention_spread", "symmetry_break_step", "train_loss", "steps")


def analysis_id(sweep_dir: Path) -> str:
    """Deterministic per sweep folder, so a re-run sweep continues its analysis run (never a second one)."""
    return hashlib.sha1(f"analysis:{Path(sweep_dir).resolve()}".encode()).hexdigest()[:16]


def warm() -> None:
    """Import what the analysis run needs (matplotlib, analysis, wandb), so that the sweep's end does not wait
    for it: `callback.WandbAnalysis` calls it on a thread while the sweep trains."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401

    from . import load, phase  # noqa: F401

    _wandb()


def log_analysis(sweep_dir: Path, w: dict) -> None:
    """One wandb run, job_type=analysis, in the sweep's group: the phase diagrams (success rate, and the
    mean symmetry-break step when runs have one) over the swept keys, the runs table (one row per run: the
    swept keys, seed and headline metrics) and every column of every run as a Parquet artifact, from the run
    folders through `analysis` (`load_runs`, `phase_diagram`)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # the worker thread draws without a display
    import matplotlib.pyplot as plt

    from .load import config_keys, load_runs
    from .phase import add_success, phase_diagram, swept_keys

    sweep_dir = Path(sweep_dir).absolute()
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
            fig = phase_diagram(runs, *axes[:2], metric, *axes[2:])
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
