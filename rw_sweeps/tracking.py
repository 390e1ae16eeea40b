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
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

_SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True)


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


def log_runs(entries: list[dict]) -> None:
    """entries: dicts with cfg (resolved config dict), run_dir, run_id, history, summary."""
    entries = [e for e in entries if e["cfg"]["wandb"]["mode"] != "disabled"]
    if not entries:
        return
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
        hist.to_parquet(folder / "history.parquet", index=False)
        art = wandb.Artifact(f"history-{job_id}", type="history", metadata={"swept": swept})
        art.add_file(str(folder / "history.parquet"), policy="immutable")  # referenced in place, not copied
        run.log_artifact(art)
        run.log({"runs": wandb.Table(columns=cols, data=rows, allow_mixed_types=True)})
        done = [e["summary"] for e in entries if e["summary"].get("status") == "done"]
        run.summary.update({"runs": len(entries), "done": len(done),
                            "mean_test_acc": sum(s["test_acc"] for s in done) / len(done) if done else None})
    finally:
        run.finish()
