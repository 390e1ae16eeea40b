"""wandb's import, its per-run settings and its offline folders: what the run logger
(`rw_sweeps.sweeps.tracking`) and the sweep's analysis run (`analysis.wandb_run`) share."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

# disable_job_creation is wandb's documented switch for W&B Launch jobs (already its default in 0.31); wandb
# still imports `wandb.sdk.launch` once per process in `_detect_and_apply_job_inputs` (0.3–2 s, pydantic),
# which no setting skips: it is paid once per process, in the background logger.
SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                disable_job_creation=True, x_save_requirements=False)  # no pip freeze per run (~0.15 s)


def wandb():
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb  # lazily: importing wandb alone costs ~1.5 s

    return wandb


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
