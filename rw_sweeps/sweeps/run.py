"""train(configs, run_dirs) → Pending.write(): the one path from validated configs to results on disk.

A single Hydra job is a batch of one; a packed chunk is a batch of many runs of one shape. The training
loop is `rw_sweeps.core.training`; this module resumes runs from their checkpoints, isolates failures (an
exception in a batch is retried run by run, so that only the culprit is `failed`), and writes each run's
folder (`rw_sweeps.core.results`) and wandb run (`rw_sweeps.sweeps.tracking`).
"""
from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from rw_sweeps.core import contract, results, signals, store, trainer
from rw_sweeps.core.config import RunConfig, shape_key
from rw_sweeps.core.errors import one_line
from rw_sweeps.core.loop import Record, checkpoint_error, group_by

from . import tracking


class Pending:
    """Work done whose results are not yet written: `write()` writes them, once, and returns them (later
    calls return the same). A packed chunk hands its `write` to `rw_sweeps.sweeps.writer`, so that its
    folders are written while the next chunk trains; everyone else calls it at once."""

    def __init__(self, write: Callable[[], list]):
        self._write: Callable[[], list] | None = write
        self._out: list | None = None

    def write(self) -> list:
        if self._write is not None:
            self._out, self._write = self._write(), None
        return self._out

    @staticmethod
    def joined(n: int, parts: list[tuple[list[int], "Pending"]]) -> "Pending":
        """One Pending of n results from parts that each hold the results of the indices they name."""
        def write() -> list:
            out: list = [None] * n
            for idx, part in parts:
                for i, value in zip(idx, part.write()):
                    out[i] = value
            return out
        return Pending(write)


def run_batch(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None) -> list[dict]:
    """Train every run, write each run's folder, log each to wandb; return the summaries."""
    return train_same_shape(cfgs, run_dirs, progress).write()


def train_same_shape(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
                     resumed: list | None = None, said: set | None = None) -> Pending:
    """Train every run (runs of one shape, one batched program); the Pending writes each run's folder and
    wandb run and returns the summaries. `resumed`: the runs' checkpoints, already read (else read here);
    `said`: the lines about checkpoints this batch has printed, so that none is printed twice."""
    if not cfgs:
        return Pending(list)
    # once a stop is asked for, nothing more is trained: not a retry of a failed batch's runs one by one, not a
    # batch of runs resumed at another step, not the next chunk (a signal held for the next safe point is it)
    signals.check()
    if len({shape_key(c) for c in cfgs}) > 1:
        raise ValueError("run_batch needs runs of one shape; group them with rw_sweeps.core.config.shape_key first")
    t0 = time.time()
    said = set() if said is None else said
    if resumed is None:
        resumed = _resume(cfgs, run_dirs, said)
    step = [b["state"]["step"] if b else 0 for b in resumed]
    if len(set(step)) > 1:  # runs checkpointed at different steps continue as separate batches, from what was read
        return Pending.joined(len(cfgs), [
            (idx, train_same_shape([cfgs[i] for i in idx], [run_dirs[i] for i in idx], progress,
                                   [resumed[i] for i in idx], said))
            for idx in group_by(step, lambda k: k).values()])
    live = _live(cfgs, run_dirs)
    try:
        records = trainer.of(cfgs[0]).train(cfgs, [Path(d) for d in run_dirs], progress,
                                            resumed if all(resumed) else None, live=live)
    except Exception as exc:  # noqa: BLE001 - isolate the culprit, never lose the others
        if live is not None:
            live.finish({})  # what was streamed ends here; a retried run starts its wandb run afresh
            live = None
        if len(cfgs) > 1:  # each again alone, from the checkpoint it has now (the failed attempt's, if it saved one);
            # a signal that came meanwhile is raised first, by the retry itself (`signals.check`, above)
            return Pending.joined(len(cfgs), [([i], train_same_shape([c], [d], False, said=said))
                                              for i, (c, d) in enumerate(zip(cfgs, run_dirs))])
        traceback.print_exc(file=sys.stderr)
        records = [Record(cfgs[0], Path(run_dirs[0]), status="failed", error=one_line(exc))]
    wall = (time.time() - t0) / len(cfgs)
    return Pending(lambda: _write(records, wall, live))


def _resume(cfgs: list[RunConfig], run_dirs: list[Path], said: set) -> list:
    """Each run's checkpoint if it is the run's own (`results.load_checkpoint`), else None; one line per run
    (`resuming …`, or why its checkpoint is refused), printed once however often the batch reads it."""
    def say(line: str) -> None:
        if line not in said:
            said.add(line)
            print(line, flush=True)

    job = store.writer_for(run_dirs[0]) if run_dirs else None
    if job is not None:  # a stored run's state is in a checkpoint file of the store: its own job's, or an earlier one's
        states = store.earlier_states(job)
        resumed = []
        for c, d in zip(cfgs, run_dirs):
            blob, file = states.get(job.name(d), (None, None))
            if blob is None:
                resumed.append(None)
                continue
            blob, why = results.checked_checkpoint(blob, c.to_dict(), Path(d))
            if why is not None:
                say(f"{d}: its checkpoint in {file} is not this run's ({why}); starting over")
            resumed.append(blob)
    else:
        resumed = [results.load_checkpoint(c.to_dict(), d, say) if results.has_checkpoint(d) else None
                   for c, d in zip(cfgs, run_dirs)]
    for d, b in zip(run_dirs, resumed):
        if b is not None:
            say(f"resuming {d} from its checkpoint at step {b['state']['step']}")
    return resumed


def _write(records: list[Record], wall: float, live) -> list[dict]:
    """Each trained run's folder, its summary last, then its wandb run; the summaries."""
    entries, written = [], {}
    job = store.writer_for(records[0].run_dir) if records else None
    for r, rec in enumerate(records):  # run by run, its summary right after its own files: a full disk keeps every run that fit
        summary = {**trainer.of(rec.cfg).summary(rec, wall), **provenance()}
        cfg_dict = rec.cfg.to_dict()
        entry = {"cfg": cfg_dict, "run_dir": rec.run_dir, "run_id": summary["run_id"], "history": rec.history,
                 "summary": summary, "snapshots": rec.snapshots}
        entries.append(entry)
        if job is not None:  # stored below, all at once
            continue
        try:  # a folder that cannot be written fails its own run, never the others
            results.write_run(rec.run_dir, cfg_dict, rec.history, rec.snapshots)
        except Exception as exc:  # noqa: BLE001
            summary.update(status="failed", error=f"writing the results: {one_line(exc)}")
            try:  # the failure itself is small: a summary that says why may still fit
                results.write_summary(rec.run_dir, summary)
            except Exception:  # noqa: BLE001 - the returned summary still says why
                pass
            continue
        try:
            results.write_summary(rec.run_dir, summary)
            written[r] = entry
        except Exception as exc:  # noqa: BLE001
            summary.update(status="failed", error=f"writing the results: {one_line(exc)}")
            continue
        _drop_checkpoint(rec.run_dir)
    if job is not None:
        written = _store(job, entries)
    try:  # after the summaries, in the background (tracking.wait); `rw_sweeps.sweeps.wandb_export` recovers a kill
        if live is not None:
            live.finish(written)
        else:
            tracking.log_runs(list(written.values()))
    except Exception as exc:  # noqa: BLE001 - the local results are the source of truth
        print(f"warning: wandb logging failed: {one_line(exc)}", file=sys.stderr)
    return [e["summary"] for e in entries]


def _store(job, entries: list[dict]) -> dict[int, dict]:
    """The runs' records in their job's store files (`rw_sweeps.core.store.Writer`); if they cannot be
    written (a full disk), every run of them fails saying why, and is trained again by a relaunch."""
    try:
        refused = job.write(entries)
    except Exception as exc:  # noqa: BLE001 - the returned summaries say why
        stored = set(getattr(exc, "stored", ()))  # the shards written before the one that failed
        for i, e in enumerate(entries):
            if i not in stored:
                e["summary"].update(status="failed", error=f"writing the results: {one_line(exc)}")
        return {i: entries[i] for i in sorted(stored)}
    for i, why in refused.items():
        entries[i]["summary"].update(status="failed", error=f"writing the results: {why}")
    return {i: e for i, e in enumerate(entries) if i not in refused}


def _drop_checkpoint(run_dir: Path) -> None:
    """The finished run's checkpoint removed (its results supersede it). One that cannot be (a folder planted
    at its name) is one line and leaves the run done: the contract judges a run by its summary, never by
    what else its folder holds."""
    try:
        results.drop_checkpoint(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run is finished and written
        print(f"{run_dir}: its checkpoint could not be removed ({checkpoint_error(run_dir, exc)}); the run is done",
              flush=True)


def _live(cfgs: list[RunConfig], run_dirs: list[Path]):
    """The batch's wandb runs streamed while it trains, or None (logged when they end, or not at all)."""
    try:
        return tracking.live([c.to_dict() for c in cfgs], run_dirs)
    except Exception as exc:  # noqa: BLE001 - the local results are the source of truth
        print(f"warning: wandb logging failed: {one_line(exc)}", file=sys.stderr)
        return None


def failed_summary(cfg: RunConfig, run_dir: Path, error: str) -> dict:
    """A run that could not start where it ran (its device is not there, it cannot fit): written `failed`
    with the reason, so that the folder, the source of truth, says why."""
    summary = {**trainer.of(cfg).summary(Record(cfg, Path(run_dir), status="failed", error=error), 0.0),
               **provenance()}
    job = store.writer_for(run_dir)
    if job is not None:
        _store(job, [{"cfg": cfg.to_dict(), "run_dir": run_dir, "summary": summary, "history": [], "snapshots": []}])
        return summary
    try:
        results.write_config(run_dir, cfg.to_dict())
        results.write_summary(run_dir, summary)
    except OSError:
        pass  # the returned summary still says why
    return summary


def done_summary(c: RunConfig, run_dir: Path, config: dict | None = None) -> dict | None:
    """The run folder's summary if the contract judges it done (`contract.judge`) and it holds this config's
    run (`results.same_run`), else None. `config`: the folder's config.yaml, if already read and validated."""
    verdict = contract.judge(run_dir, config)
    return verdict.summary if verdict.done and results.same_run(verdict.config, c.to_dict()) else None


def execute(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
            done_checked: bool = False) -> list[dict]:
    """`train`, its results written at once: the summaries."""
    return train(cfgs, run_dirs, progress, done_checked).write()


def train(cfgs: list[RunConfig], run_dirs: list[Path], progress: bool | None = None,
          done_checked: bool = False) -> Pending:
    """train_batch for the runs not already done: a re-run sweep skips every run whose folder holds a
    `done` summary for the same config, and trains the rest (resume after a crash or a kill). The Pending
    writes the trained runs and returns every run's summary, in order.
    `done_checked`: the caller found none of them done already (the launcher's placement, this launch)."""
    todo, known = [], {}
    for i, (c, d) in enumerate(zip(cfgs, run_dirs)):
        verdict = None if done_checked else contract.judge(d)
        if verdict is not None and verdict.done and results.same_run(verdict.config, c.to_dict()):
            known[i] = {**verdict.summary, "skipped": True}
            continue
        if verdict is not None and verdict.state == "corrupt":  # as placement says it for a sweep's runs
            print(f"retraining {d}: {verdict.why}", flush=True)
        todo.append(i)
    parts = [(list(known), Pending(lambda: list(known.values())))] if known else []
    if todo:
        parts.append((todo, _per_group([cfgs[i] for i in todo], [run_dirs[i] for i in todo],
                                       [shape_key(cfgs[i]) for i in todo], progress)))
    return Pending.joined(len(cfgs), parts)


def _per_group(cfgs: list[RunConfig], run_dirs: list[Path], keys: list, progress) -> Pending:
    """train_batch on each group of runs with equal keys, in turn; the Pending's summaries in the input order."""
    return Pending.joined(len(cfgs), [(idx, train_same_shape([cfgs[i] for i in idx], [run_dirs[i] for i in idx], progress))
                                      for idx in group_by(keys, lambda k: k).values()])


def provenance() -> dict:
    """The code that trained a run, for its summary.json and wandb run (`rw_sweeps.sweeps.provenance`)."""
    # rw_sweeps.sweeps.provenance imports torch (its version): only once a run's summary is written; the front
    # door and the launcher plugin import this module, and a command that trains nothing (--help, a dry run)
    # does not pay for torch
    from .provenance import provenance as code_that_trained

    return code_that_trained()


def run_line(summary: dict, tag: str = "") -> str:
    """The line a run logs when it ends (`skipped (done)` for one found finished, `skipped (diverged)` for one
    kept as it ended); `tag`, the job's values of the keys its sweep varies, ends it (`[optim.lr=0.5
    init.sigma=0.01]`), so no two lines look alike."""
    ended = summary.get("status") or "done"
    line = _line(summary, f"skipped ({ended})" if summary.get("skipped") else ended)
    return f"{line}  [{tag}]" if tag else line


def _line(summary: dict, label: str) -> str:
    s = _Fields(summary)  # a summary of an older version may lack a field: it reads as null
    v = lambda k: "null" if s[k] is None else s[k]  # noqa: E731 - a missing value reads as in summary.json: null
    # the circle (and the QA tasks, as always) by p; the other families by name, since p may mean nothing there
    what = f"p={v('p')}" if s["data"] in (None, "random_walk", "qa_majority", "qa_preference") else f"data={s['data']}"
    if s["status"] != "done":
        return f"{label}: {what} init={v('init')} seed={v('seed')}: {s['error']}"
    fmt = lambda x: "null" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"  # noqa: E731
    opt = "null" if s["opt_acc"] is None else f"{s['opt_acc']:.3f}"
    if s["unigram_loss"] is not None:  # model=gpt: its loss beside the data family's two baselines
        return (f"{label}: {what} K={v('K')} N={v('N')} model={v('model')} n_layer={v('n_layer')} init={v('init')} "
                f"seed={v('seed')} steps={v('steps')} test_loss={fmt(s['test_loss'])} opt_loss={fmt(s['opt_loss'])} "
                f"unigram_loss={fmt(s['unigram_loss'])} relative_loss={fmt(s['relative_loss'])} "
                f"test_acc={fmt(s['test_acc'])} (OPT {opt}) parent_attention={fmt(s['parent_attention'])} "
                f"break_step={v('symmetry_break_step')}")
    return (f"{label}: {what} K={v('K')} N={v('N')} init={v('init')} seed={v('seed')} steps={v('steps')} "
            f"test_acc={fmt(s['test_acc'])} (OPT {opt}) parent_attention={fmt(s['parent_attention'])} "
            f"v_pi_cosine={fmt(s['v_pi_cosine'])} kl={fmt(s['test_kl'])} break_step={v('symmetry_break_step')}")


class _Fields(dict):
    """A summary read for its line: a field it lacks is null."""

    def __missing__(self, key):
        return None
