"""What every trainer's step loop shares: a run's `Record`, the signal deferral that checkpoints at the end of a
step (`SaveOnSignal`), the log-line progress (`Ticker`), the device and terminal probes, and the contract a
trainer meets (`Trainer`). `rw_sweeps.core.training` (eq. 2.1) and `rw_sweeps.core.gpt.training` use them."""
from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from . import env_vars, results
from .config import RunConfig
from .errors import Refused, one_line

BREAK_SPREAD = 1e-3  # attention spread above which Thm 4.1's symmetric point counts as broken


def group_by(items: list, key) -> dict:
    """{key(item): [indices of the items with that key]}, in first-seen order (the one grouping helper)."""
    groups: dict = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item), []).append(i)
    return groups


@dataclass
class Record:
    """What one run produced: its history rows, snapshots, status and the step it stopped at."""
    cfg: RunConfig
    run_dir: Path
    history: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    status: str = "done"
    error: str | None = None
    break_step: int | None = None
    prediction_break_step: int | None = None  # first evaluated step whose predictions left the symmetric point's
    steps: int = 0
    opt_acc: float | None = None  # the Bayes-optimal test accuracy where it has no closed form (cfg.opt_acc)
    opt_test_acc: float | None = None  # the Bayes predictor's realised accuracy on the test set
    trap: bool | None = None  # every training sequence has the same token histogram (`trap_flags`)


def has_terminal() -> bool:
    """A progress bar needs a terminal that says its size: a pseudo-terminal without one (`script -qc`, some
    CI runners) gets the log-line ticker, as a log file does."""
    if os.environ.get("CI") or not sys.stderr.isatty():
        return False
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        return False
    return size.columns > 0 and size.lines > 0


SAVE_SIGNALS = tuple(getattr(signal, n) for n in ("SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))


class SaveOnSignal:
    """Defers USR2 (SLURM's warning before a preemption or the time limit; submitit requeues on it), SIGTERM,
    SIGINT and SIGHUP to the end of the current step, where every run is checkpointed (`save`); then the
    signal's own handler runs (submitit's requeue, the front door's interruption, Ctrl-C's KeyboardInterrupt,
    the default exit). A preempted or interrupted batch so loses at most one step per run, even with
    checkpoint_every=0. A handler that prints its own line (`speaks`, the front door's) gets no line from
    here; one that can take a signal back for later (`later`, the front door's) gets the signal that came
    after the last step, to raise once the batch's results are written (a finished batch needs no
    checkpoint). A signal pending when the loop ends by an exception is handed over all the same (to `later`,
    else to the handler itself): a stop is a deadline, and the caller's fallback (retrying the runs one by
    one) must not train past it."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.previous: dict[int, object] = {}
        self.said: set = set()  # (run folder, why) of periodic checkpoints already said not to be written

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SAVE_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # an ignored signal stays ignored
                    self.previous[sig] = signal.signal(sig, lambda signum, frame: self.pending.append(signum))
        return self

    def __exit__(self, kind=None, *exc) -> None:
        previous = dict(self.previous)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
        if self.pending:  # came after the last step, or before an exception ended the loop
            signum, self.pending[:] = self.pending[0], []
            later = getattr(previous.get(signum), "later", None)
            if callable(later):
                later(signum)
            elif kind is not None:
                _hand_over(previous.get(signum), signum)

    def save(self, recs: list, blob: Callable[[int], dict]) -> None:
        """Checkpoint every run (`results.save_checkpoint(rec.run_dir, blob(r))`). A run whose checkpoint
        cannot be written (a folder planted at its name, a full disk, a folder it may not write, an unusable
        seal key) costs only itself, in one line on stdout: the others are still checkpointed, and the loop
        goes on as if it had been written, training (a periodic checkpoint; said once per run and cause) or
        stopping (a signal's: the run stays unfinished). None of these is raised: an exception here makes the
        batch retry its runs one by one, which a stop must not wait for; anything else (a bug) still is, and
        a stop pending then goes first (`__exit__`, and `rw_sweeps.sweeps.run`'s check before any retry)."""
        from .store import writer_for  # a stored run's state goes to its job's one checkpoint file

        job = writer_for(recs[0].run_dir) if recs else None
        if job is not None:
            try:
                job.save_checkpoints({rec.run_dir: results.sealed_checkpoint(blob(r), rec.run_dir)
                                      for r, rec in enumerate(recs)})
            except (OSError, Refused) as exc:
                self._unsaved(job.folder, exc, job.id + ".ckpt.pt")
            return
        for r, rec in enumerate(recs):
            try:
                results.save_checkpoint(rec.run_dir, blob(r))
            except (OSError, Refused) as exc:  # what a disk raises, and a one-line refusal (the seal key's)
                self._unsaved(Path(rec.run_dir), exc)

    def _unsaved(self, run_dir: Path, exc: BaseException, file: str = results.CHECKPOINT) -> None:
        why = checkpoint_error(run_dir, exc, file)
        if self.pending:
            kept = _regular(run_dir / file)  # the last one written stays, whole (an atomic rename)
            _say(f"{run_dir}: could not write its checkpoint ({why}); it stays unfinished and "
                 f"{'resumes from its last checkpoint' if kept else 'starts over from step 0'} next time")
        elif (run_dir, why) not in self.said:
            self.said.add((run_dir, why))
            _say(f"{run_dir}: could not write its checkpoint ({why}); training goes on")

    def deliver(self) -> None:
        if not self.pending:
            return
        signum, self.pending[:] = self.pending[0], []
        handler = self.previous.get(signum)
        if not getattr(handler, "speaks", False):
            print(f"rw_sweeps: signal {signal.Signals(signum).name}: every run checkpointed", file=sys.stderr, flush=True)
        if handler == signal.SIG_DFL:
            self.__exit__()
        _hand_over(handler, signum)


def _hand_over(handler, signum: int) -> None:
    """Run a signal's own handler now (it may raise, as Ctrl-C's does, or exit, as submitit's requeue does);
    the default action by the signal itself, its handler restored."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def checkpoint_error(run_dir: Path, exc: BaseException, file: str = results.CHECKPOINT) -> str:
    """Why a checkpoint could not be written (or removed), on one line: the system's words and the file they are about
    (`checkpoint.pt` for anything in the run's folder, the checkpoint's temp file included; the seal key by its
    path), or the error's own line (the seal key's `SealKeyError` says which file and the fix)."""
    if isinstance(exc, OSError) and exc.strerror:
        path = exc.filename2 or exc.filename
        text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        # a file in the run's folder (named by path, or relative to the folder's handle) is the checkpoint's
        ours = not text or Path(text).parent in (Path(run_dir), Path("."))
        return f"{file if ours else text}: {exc.strerror}"
    return one_line(exc)


def _say(line: str) -> None:
    """A line on stdout that cannot stop the loop: after SIGHUP the terminal may be gone (EIO, a closed pipe)."""
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        pass


def _regular(path: Path) -> bool:
    """A regular file at `path` (not followed if a link)?"""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class Ticker:
    """A progress line at a steady interval, for logs (no terminal, so no progress bar)."""

    def __init__(self, runs: int, start: int, T: int):
        self.runs, self.start, self.T = runs, start, T
        self.every = env_vars.progress_s()  # RW_SWEEPS_PROGRESS_S: the seconds between lines, read per batch
        self.t0 = self.last = time.monotonic()
        print(f"training {runs} run(s): step {start} → {T}", flush=True)

    def __call__(self, t: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every or t >= self.T:
            return
        self.last = now
        done = max(t - self.start, 1)
        left = (now - self.t0) / done * (self.T - t)
        print(f"training {self.runs} run(s): step {t}/{self.T} ({100 * t / self.T:.0f} %), "
              f"{now - self.t0:.0f} s so far, ~{left:.0f} s left", flush=True)


class Trainer(Protocol):
    """A training loop: a module named by its model option's `TRAINER` (`rw_sweeps.core.trainer.of`)."""

    def train(self, cfgs: list, run_dirs: list, progress: Optional[bool] = None, resumed: Optional[list] = None,
              live: Optional[Callable] = None) -> list[Record]: ...

    def summary(self, rec: Record, wall: float) -> dict: ...

    def prefetch(self, cfgs: list) -> None: ...

    def batch_bytes(self, cfg: RunConfig) -> int: ...

    def run_bytes(self, cfg: RunConfig) -> tuple[int, str]: ...


def device_of(cfg: RunConfig):
    """The torch device a run trains on (`device=auto`: CUDA where visible)."""
    import torch  # heavy: the signal and progress pieces here are used without it

    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)
