"""wandb, and nothing else knows wandb. The local run folder is the source of truth; wandb is a viewer.

One wandb run per training run, written when the run ends (a §5 run trains in well under a second, so
streaming would only add overhead): the resolved config, the history (x-axis `step`), the summary, under
`group` = the sweep and `job_type` = "train". Offline by default, so nothing waits on a network; upload
later with `wandb sync <run dir>/wandb/offline-run-*`.
"""
from __future__ import annotations

import os
from pathlib import Path


def log_run(cfg: dict, run_dir: Path, run_id: str, history: list[dict], summary: dict,
            job_type: str = "train") -> None:
    w = cfg["wandb"]
    if w["mode"] == "disabled":
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # lazily: importing wandb alone costs ~1.5 s

    name = f"p={cfg['data']['p']} {cfg['init']['name']} seed={cfg['seed']}"
    tags = list(w.get("tags") or []) + ([cfg["experiment"]] if cfg.get("experiment") else [])
    run = wandb.init(project=w["project"], group=w["group"], job_type=job_type, tags=tags, name=name,
                     id=run_id, resume="allow", mode=w["mode"], dir=str(run_dir), config=cfg,
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    try:
        for row in history:
            run.log({k: v for k, v in row.items() if v is not None}, step=row["step"])
        run.summary.update({k: v for k, v in summary.items() if v is not None})
    finally:
        run.finish()
