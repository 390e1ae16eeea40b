"""python -m rw_sweeps.sweeps.wandb_export SWEEP [--workers N] [--mode offline|online] [--force]

Replays a sweep's run folders (the source of truth: config.yaml, history.jsonl, summary.json) into one wandb
run per training run, the shape `wandb.granularity=run` logs (`rw_sweeps.sweeps.tracking.replay_run`): id derived from
the run folder, group = the sweep, job_type=train, the config, the history (x-axis `step`), the summary;
offline files in `<run>/wandb/`. Per-run dashboards for a sweep of any size, without slowing the sweep.

Runs already exported (the marker `tracking.EXPORTED` in the run folder names this run id and mode, and the
hash of its summary.json; per-run logging during a sweep writes it too) are skipped, `--force` redoes them;
unfinished runs (no summary.json) are skipped. N worker processes, each with one wandb service, take
contiguous slices of the runs. Prints one line: exported, skipped (already / unfinished), failed; before
it, the first failures, a line each. A run whose wandb run raised, or any of whose writes of wandb's own logs
failed (a full disk), is failed, not marked exported, and exported by the next call.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
from pathlib import Path

from rw_sweeps.core import contract, readers, results, wandb_io
from rw_sweeps.core.errors import one_line

from . import tracking
from .planner import varying


def run_folders(sweep: Path) -> list[Path]:
    """The sweep's run folders (numbered job folders, or any sub-folder holding a run's config.yaml), in
    job order; a run folder given itself is its own sweep of one."""
    sweep = Path(sweep)
    if (sweep / "config.yaml").exists():
        return [sweep]
    out = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
           and (contract.job_number(p.name) is not None or (p / "config.yaml").exists())]
    return sorted(out, key=lambda p: (contract.job_number(p.name) is None, contract.job_number(p.name) or 0, p.name))


OVERRIDES_CAP = 1024 * 1024  # bytes of a job's `.hydra/overrides.yaml` (a list of `key=value` lines)


def _overrides(run_dir: Path) -> list[str] | None:
    """The job's overrides as Hydra recorded them (`.hydra/overrides.yaml`), read as every planted file is
    (`readers`: a regular file within its cap, plain YAML), never through a linked `.hydra`; else None."""
    if (run_dir / ".hydra").is_symlink():
        return None
    try:
        value = readers.read_yaml(run_dir / ".hydra" / "overrides.yaml", OVERRIDES_CAP)
    except (OSError, readers.Broken):
        return None
    return value if isinstance(value, list) and all(isinstance(o, str) for o in value) else None


def names(dirs: list[Path]) -> dict[Path, str]:
    """A wandb name for each run folder whose Hydra job recorded its overrides: its values of the keys the
    sweep varies, as the launcher names a run (`planner.varying`); what a folder whose config.yaml has no
    `wandb.name` (written by an older version) is named by."""
    jobs = {d: o for d in dirs if (o := _overrides(d)) is not None}
    return {d: tracking.name_of(v) for d, v in zip(jobs, varying(list(jobs.values())))}


def _entry(run_dir: Path, mode: str, name: str = "") -> dict | None:
    """The run as `tracking.replay_run` takes it, or None when it is unfinished (or unreadable); `name`: its
    wandb name where its config records none."""
    verdict = contract.judge(run_dir)  # the launcher's and analysis's one judgement
    if verdict.state not in contract.STATUSES:
        return None
    summary, cfg = verdict.summary, verdict.config
    if not isinstance(cfg.get("wandb"), dict):
        return None
    try:
        history = list(contract.rows(run_dir, results.HISTORY))
    except (OSError, readers.Broken):
        history = [] if summary.get("status") == "failed" else None  # a failed run may have none
    if history is None:
        return None
    cfg = {**cfg, "wandb": {**cfg["wandb"], "mode": mode}}
    if not cfg["wandb"].get("name") and name:
        cfg["wandb"]["name"] = name
    if not cfg["wandb"].get("group"):
        cfg["wandb"]["group"] = "/".join(run_dir.resolve().parent.parts[-2:])
    return {"cfg": cfg, "run_dir": run_dir, "run_id": results.run_id(run_dir), "history": history,
            "summary": summary}


def _export(args: tuple) -> tuple[int, int, int, list[str]]:
    """One worker: its slice of run folders → (exported, skipped unfinished, failed, error lines)."""
    dirs, mode, named = args
    done = unfinished = failed = 0
    errors = []
    for d in dirs:
        e = _entry(Path(d), mode, named.get(d, ""))
        if e is None:
            unfinished += 1
            continue
        try:
            tracking.replay_run(e)
        except Exception as exc:  # noqa: BLE001 - one bad run never stops the others
            failed += 1
            errors.append(f"{d}: {one_line(exc)}")
            wandb_io.said()  # its failed log writes: the error above says this run failed
            continue
        lost = wandb_io.said(lead="", again=None)  # writes of its logs that failed (a full disk): not exported
        if lost is None:
            done += 1
        else:
            failed += 1
            errors.append(f"{d}: {lost}")
    return done, unfinished, failed, errors


def export(sweep: Path, workers: int = 2, mode: str = "offline", force: bool = False) -> dict:
    """Export the sweep's finished runs; returns the counts (exported, skipped, unfinished, failed)."""
    dirs = run_folders(Path(sweep))
    todo, skipped = [], 0
    for d in dirs:
        if not force and tracking.is_exported(d, results.run_id(d), mode):
            skipped += 1
        else:
            todo.append(d)
    counts = {"exported": 0, "skipped": skipped, "unfinished": 0, "failed": 0, "errors": []}
    if todo:
        n = max(1, min(workers, len(todo)))
        size = -(-len(todo) // n)
        named = {str(d): n for d, n in names(dirs).items()}  # over the whole sweep: what varies in it
        slices = [([str(d) for d in todo[i:i + size]], mode, named) for i in range(0, len(todo), size)]
        if n == 1:
            parts = [_export(slices[0])]
        else:  # spawn: a clean process per worker (wandb's service and threads do not survive a fork)
            with mp.get_context("spawn").Pool(len(slices)) as pool:
                parts = pool.map(_export, slices, chunksize=1)
        for done, unfinished, failed, errors in parts:
            counts["exported"] += done
            counts["unfinished"] += unfinished
            counts["failed"] += failed
            counts["errors"] += errors
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rw_sweeps.sweeps.wandb_export",
                                 description="Replay a sweep's run folders into one wandb run per training run.")
    ap.add_argument("sweep", type=Path, metavar="SWEEP", help="the sweep folder (hydra.sweep.dir) or a run folder")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--mode", default="offline", choices=["offline", "online"],
                    help="offline (default; `wandb sync` uploads later) or online")
    ap.add_argument("--force", action="store_true", help="export again the runs already exported")
    args = ap.parse_args(argv)
    if not args.sweep.is_dir():
        ap.error(f"not a folder: {args.sweep}")
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    c = export(args.sweep, args.workers, args.mode, args.force)
    for line in c["errors"][:5]:
        print(f"failed {line}", file=sys.stderr)
    print(f"wandb export {args.sweep}: {c['exported']} exported, {c['skipped'] + c['unfinished']} skipped "
          f"({c['skipped']} already exported, {c['unfinished']} unfinished), {c['failed']} failed", flush=True)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
