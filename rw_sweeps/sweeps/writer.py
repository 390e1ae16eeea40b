"""The one thread per process that writes a packed chunk's files while the next chunk trains.

A chunk's `.hydra/` files are handed over when it starts training and its results (every run's folder, its
log lines, its JobReturn's status) when it ends, so that chunk k is written while chunk k+1 trains. Tasks
run in order, one at a time. At most one chunk's results wait at once: handing over chunk k+1's results
waits until chunk k's are written, so memory holds at most the chunk that trains and the chunk that is
written, whatever the grid's size.

Nothing finished is lost on an orderly end: `flush()` waits for every task, the launcher calls it before a
process's work counts as ended (before its wandb logging, which the writes queue), the front door calls
it on Ctrl-C, and the interpreter joins the thread at exit (`concurrent.futures` does). A process killed
outright (SIGKILL, OOM) loses the results of the chunk being written, as a synchronous writer would lose
the run being written: those runs train again, from their checkpoints where they have one, on the next
launch.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional


class _Writer:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rw-writer")
        self.results: Optional[Future] = None  # the last chunk's results, handed over and maybe not yet written

    def submit(self, fn: Callable[[], Any], results: bool) -> Future:
        if results and self.results is not None:
            self.results.exception()  # bounded: the previous chunk's results are written first
        fut = self.pool.submit(fn)
        if results:
            self.results = fut
        return fut


_writer: Optional[_Writer] = None
_lock = threading.Lock()


def submit(fn: Callable[[], Any], results: bool = False) -> Future:
    """fn() on this process's writer thread, after everything handed over before it. `results`: fn writes a
    chunk's results (held to one waiting at a time); else it writes what is small (a chunk's envelopes)."""
    global _writer
    with _lock:
        if _writer is None or _writer.pid != os.getpid():  # none yet, or inherited through a fork
            _writer = _Writer()
        writer = _writer
    return writer.submit(fn, results)


def on_writer_thread() -> bool:
    return threading.current_thread().name.startswith("rw-writer")


def flush() -> None:
    """Block until everything handed over in this process is written (its errors are in its futures)."""
    writer = _writer
    if writer is None or writer.pid != os.getpid() or on_writer_thread():
        return
    writer.pool.submit(lambda: None).result()  # the queue is FIFO: this runs after all before it
