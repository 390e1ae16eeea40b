"""Ctrl-C, SIGTERM and SIGHUP in the launching process: one path for all three.

The front door (`rw_sweeps.sweeps.app.run_front_door`, and `python -m analysis`) installs one handler for
SIGINT, SIGTERM and SIGHUP (a signal that is ignored, as under `nohup`, stays ignored). It turns each into
`Stopped`, a KeyboardInterrupt that carries the exit code (130, 143, 129: 128 + the signal's number), so
every place that handles Ctrl-C handles the other two alike:

- in the step loop, `rw_sweeps.core.loop.SaveOnSignal` holds the signal to the end of the current
  step, checkpoints every run of the chunk (one whose checkpoint cannot be written is one line and stays
  unfinished; the others are saved), then calls this handler (which raises); a signal that comes after the
  last step, or before an exception ended the loop, is handed back with `later` and raised at the next safe
  point: once the chunk's results are written, or before anything more is trained (`check`, which
  `rw_sweeps.sweeps.run` calls before each batch, its retries of a failed batch's runs included);
- while finished results are written in the main thread (`deferred()`), the signal is held and raised
  when the block ends: nothing finished is lost;
- anywhere else (start-up, waiting, the sweep's analysis run) it is raised at once, as Ctrl-C is.

The front door then flushes what is being written, prints one line, waits for the queued wandb logging,
releases the sweep's lock (`on_stop`), and exits with the code. From the first signal on (`stopping`),
another one within `GRACE_S` seconds is the same request and is ignored; a later one stops at once
(`os._exit`), after releasing the lock: what was still being written is lost and trains again on the
next launch, from its checkpoint. After a normal end (`finishing`) a signal stops the process at once,
with its own code; the interpreter's very last steps, after every exit function, ignore them. Nothing here
runs inside SLURM or submitit jobs, whose processes keep submitit's own handlers (USR2: checkpoint and
requeue); a launch interrupted while local submitit jobs run sends them SIGINT and waits for them.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

HANDLED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
GRACE_S = 1.0  # a second signal this soon after the first is the same request (Ctrl-C pressed twice)


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal's number (Ctrl-C 130, SIGTERM 143, SIGHUP 129)."""
    return 128 + int(signum)


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Stopped(KeyboardInterrupt):
    """A signal turned into Ctrl-C's interruption; `exit_code` is the process's exit status."""

    def __init__(self, signum: int):
        self.signum, self.exit_code = int(signum), exit_code(signum)
        super().__init__(name(signum))


class _State:
    installed = False
    first: Optional[int] = None  # the first signal received
    at = 0.0  # when (time.monotonic())
    held: Optional[int] = None  # a signal held until the end of a `deferred` block (or handed back by `later`)
    depth = 0  # `deferred` blocks open in the main thread
    ending = False  # the orderly end has begun: no more exceptions from signals
    said = False  # the end's one line is out
    cleanups: list = []  # run before the process ends, in order (release the sweep's lock)


def _note(signum: int) -> None:
    if _State.first is None:
        _State.first, _State.at = signum, time.monotonic()


def _handler(signum: int, frame) -> None:
    if _State.ending:
        _again(signum)
        return
    if _State.first is not None and time.monotonic() - _State.at < GRACE_S:
        return  # the first one is on its way to the front door (or held): the same request
    _note(signum)
    if _State.depth:  # finished results are being written: raised when they are
        _State.held = _State.held or signum
        return
    raise Stopped(signum)


def _later(signum: int) -> None:
    """A signal to raise at the next safe point (the end of a `deferred` block, or `check`), not now: the
    training loop hands back one that came after its last step, whose results are not yet written."""
    _note(signum)
    _State.held = _State.held or signum


_handler.later = _later  # type: ignore[attr-defined]  # what `_SaveOnSignal` looks for
_handler.speaks = True  # type: ignore[attr-defined]  # the front door prints the line: `_SaveOnSignal` says nothing


def install() -> None:
    """The launching process's handler for SIGINT, SIGTERM and SIGHUP (main thread only; a signal set to
    SIG_IGN stays ignored). Idempotent."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        current = signal.getsignal(sig)
        if current is not signal.SIG_IGN and current is not _handler:
            signal.signal(sig, _handler)
    if not _State.installed:
        atexit.register(_ignore_at_the_very_end)  # registered first, so it runs last
    _State.installed = True


def early() -> None:
    """Before the front door's imports (a second or two, before `install`): a stop then has nothing to keep,
    as nothing is written yet, so it ends the process at once with the signal's code and one line, never a
    traceback from an import it cut short. `install` replaces it (a signal set to SIG_IGN stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in HANDLED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early)


def _early(signum: int, frame) -> None:
    try:
        os.write(2, f"{how(128 + signum)} during start-up: nothing was written\n".encode())
    finally:
        os._exit(128 + signum)


def on_stop(fn: Callable[[], None]) -> None:
    """`fn()` before the process ends on a signal, also when a second signal stops it at once (the lock)."""
    _State.cleanups.append(fn)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP while the block runs (writing finished results); a signal that came
    meanwhile is raised (`Stopped`) when the outermost block ends normally."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
    if not _State.depth:
        check()


def check() -> None:
    """Raise the signal held for later, if any (main thread, outside `deferred` blocks)."""
    if _State.held is not None and not _State.depth and not _State.ending \
            and threading.current_thread() is threading.main_thread():
        signum, _State.held = _State.held, None
        raise Stopped(signum)


def unanswered() -> None:
    """At the end of a launch that was not stopped: raise the signal that came and was never acted on. Python
    ignores an exception raised in a callback it runs for itself (a weak reference's, a finaliser's), so a
    signal whose `Stopped` was raised there was lost, and the launch went on to its end: it still ends as
    that signal asks, with its line and code."""
    check()
    if _State.first is not None and not _State.ending and threading.current_thread() is threading.main_thread():
        raise Stopped(_State.first)


def stopping(exc: Optional[BaseException] = None) -> int:
    """The orderly end begins (idempotent): later signals raise nothing; returns the exit code (the
    first signal's; Ctrl-C's 130 for a KeyboardInterrupt that came without one)."""
    _State.ending = True
    if isinstance(exc, Stopped):
        _note(exc.signum)
    if _State.first is None:
        _State.first, _State.at = signal.SIGINT, time.monotonic()
    return exit_code(_State.first)


def said() -> None:
    """The end's one line is out: a signal that stops the process at once says nothing more."""
    _State.said = True


def cleanup() -> None:
    """Run the `on_stop` functions (each once)."""
    while _State.cleanups:
        fn = _State.cleanups.pop(0)
        try:
            fn()
        except Exception:  # noqa: BLE001 - the end goes on
            pass


def how(code: int) -> str:
    """`interrupted` (Ctrl-C) or `stopped by SIGTERM` (…), for the exit code."""
    return "interrupted" if code == 130 else f"stopped by {name(code - 128)}"


def line(code: int) -> str:
    """A launch's one line after a signal (the exit code says which)."""
    return f"\n{how(code)}: finished runs are kept and the others checkpointed; run the same command again to resume"


def finishing() -> None:
    """The launch has ended normally and the process exits: a signal from now on stops it at once with its
    own code, after the `on_stop` functions (the lock), saying so in one line."""
    _State.ending = True


def _ignore_at_the_very_end() -> None:
    """The last exit function: the interpreter then resets Python's handlers to the default actions, and a
    signal while it tears its modules down would end the process with another status. Ignored instead."""
    if _State.installed and threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, signal.SIG_IGN)


def _again(signum: int) -> None:
    """A signal during the end. After a normal end: stop now, with its code. After a first signal: within
    GRACE_S of it, the same request (ignored); later, stop now, with the first one's code."""
    if _State.first is None:
        _State.first, _State.at = signum, time.monotonic()
        _exit_now(exit_code(signum), f"\n{how(exit_code(signum))} while exiting: nothing was lost")
    if time.monotonic() - _State.at < GRACE_S:
        return
    _exit_now(exit_code(_State.first), f"\n{name(signum)} again: stopped at once; what was still being written "
                                       f"is lost (a launch trains those runs again, from their checkpoints)")


def _exit_now(code: int, message: str) -> None:
    cleanup()
    if not _State.said:
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(code)
