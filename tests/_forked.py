"""`python ARGS` for the test suite (`launch.py …`, `-m analysis …`), in a process forked from a server that has
imported the libraries these commands import (torch alone is ~1.4 s of CPU a process; the suite starts ~300
launches on 2 cores).

What the forked process is given is what `subprocess.run([python, *ARGS], cwd=…, env=…, text=True,
capture_output=True, timeout=…)` gives: its own pid; the environment (replaced whole), the folder, `sys.argv` and
`sys.path[0]` as the interpreter sets them for a script or a `-m` module; the caller's stdin; stdout and stderr as
pipes the caller reads to their end (a grandchild's late lines included); the random state of a fresh process;
an uncaught exception through `sys.excepthook`, then the interpreter's own end (atexit functions, flushed
streams, the exit status or the signal that ended it, as `os.waitpid` reports it); at a timeout or any other
exception in the caller, the process killed, and `TimeoutExpired` with the bytes read so far. No module of the
project (`rw_sweeps`, `analysis`, `hydra_plugins`) is imported by the server: the command imports it as a fresh
process does, so no state of an earlier command, and no environment variable a module reads when it is
imported, carries over.

What the server cannot give a command: an environment that changes what the interpreter or a preloaded library
read as it loaded (thread pools, allocators, locale, time zone, …): `serves(env, argv)` accepts only a difference
in the variables listed in RUNTIME, read when the project runs, and `tests/conftest.py` starts a fresh
interpreter otherwise (also for a script that is not a file); the hash seed, which is the server's; and the
command line in /proc, which is the server's (`sys.argv` is the command's).

The server is single-threaded (it refuses to serve otherwise: a fork copies one thread), runs no torch operation
(its thread pools are not started), ends when its parent does, and answers each request in a waiter process of
its own, so that commands may overlap:

    server ──fork──> waiter ──fork──> the command
                       └── reports the command's pid, then its exit status, on the request's socket

`-m` runs through `runpy._run_module_as_main`, the function the interpreter itself calls for `python -m` (so
the trace of an exception has the frames a fresh `python -m` prints); this module is its one user.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imported once by the server: libraries that start no thread as they load (pandas does: pyarrow's allocator),
# none of the project's modules, nor matplotlib (it reads MPLBACKEND as it is imported)
PRELOAD = ("numpy", "torch", "yaml", "omegaconf", "hydra", "hydra.main", "hydra.core.config_store",
           "hydra.core.plugins", "hydra._internal.utils", "hydra._internal.hydra")
# The variables a command's environment may change from the server's: read by the project (or by libraries
# the server has not imported) when it runs, never by the interpreter or a preloaded library as it loads
RUNTIME = ("WANDB_", "RW_", "HYDRA_FULL_ERROR", "COMP_LINE", "COMP_POINT", "MPLBACKEND", "SUBMITIT_", "SLURM_",
           "CI", "COLUMNS", "LINES", "XDG_CACHE_HOME", "CUDA_VISIBLE_DEVICES", "CC", "PYTEST_",
           "TORCHINDUCTOR_CACHE_DIR")  # read when inductor compiles (which sets it in a worker that has compiled)
_CHUNK = 1 << 16  # bytes read from a request at a time (a request is a few KiB: its environment, argv, folder)
# The environment the server is started with: this process's when the module is first imported (by
# tests/conftest.py, before any test runs), not whatever a test has set when the first command comes
BASE = {**os.environ, "PYTHONUNBUFFERED": "1"}


# ------------------------------------------------------------------------------------------ the server
def serve(path: str) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    # the preloaded libraries' objects are never garbage: out of every collection in the commands (as the
    # front door does in a fresh process, `rw_sweeps.sweeps.app.run_front_door`), and out of the pages a
    # collection would write to, which a fork would then copy
    gc.freeze()
    threads = len(os.listdir("/proc/self/task"))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print(json.dumps({"ready": os.getpid(), "env": dict(os.environ), "threads": threads}), flush=True)
    while True:
        ready, _, _ = select.select([server, sys.stdin], [], [], 1.0)
        _reap()
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return  # the parent has ended (its end of the pipe is closed): so does the server
        if server in ready:
            conn, _ = server.accept()
            if os.fork() == 0:
                server.close()
                _wait_on_a_command(conn)  # returns only in the command's own process, to end as an interpreter does
                return
            conn.close()


def _reap() -> None:
    """Collect the waiters that have ended (the server never blocks on one)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _wait_on_a_command(conn: socket.socket) -> None:
    raw, fds, _, _ = socket.recv_fds(conn, _CHUNK, 3)
    while not raw.endswith(b"\n"):
        chunk = conn.recv(_CHUNK)
        if not chunk:   # the caller went away mid-request: nothing to run
            os._exit(0)
        raw += chunk
    request = json.loads(raw)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_the_command(request, fds)
        return
    try:
        for fd in fds:  # the command's ends only: the caller sees the end of its output when the command's is closed
            os.close(fd)
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:   # the caller is gone (its timeout came first): so goes the command
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass
    finally:
        os._exit(0)


def _become_the_command(request: dict, fds: list[int]) -> None:
    """This process becomes `python ARGS`: its files, environment, folder, argv and sys.path[0], then the script
    or module; an uncaught exception goes to sys.excepthook, then the interpreter's end."""
    import builtins
    import importlib.machinery
    import io
    import random
    import runpy
    import types

    import numpy

    for fd, to in zip(fds, (0, 1, 2)):
        os.dup2(fd, to)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()           # a fresh process's: drawn from the system, not the server's
    numpy.random.seed()
    argv = request["argv"]
    try:
        if argv[0] == "-m":   # as `python -m`: the folder first on the path, argv[0] the module's file
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            first = "_run_module_as_main"
            runpy._run_module_as_main(argv[1], alter_argv=True)
        else:                 # as `python script`: argv as given, the script's real folder first on the path,
            sys.argv = list(argv)  # and the script run in a `__main__` of its own, named by its absolute path
            path = os.path.abspath(argv[0])
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            first = "<module>"
            with io.open_code(path) as f:
                code = compile(f.read(), path, "exec")
            main = types.ModuleType("__main__")
            main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __package__=None,
                                 __spec__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            sys.modules["__main__"] = main
            exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports an exception the command raised
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != first:
            tb = tb.tb_next
        exc.__traceback__ = tb   # the interpreter's hook prints the exception's own traceback
        sys.excepthook(type(exc), exc, tb)
        if isinstance(exc, KeyboardInterrupt):
            # raised on, said once: the interpreter then ends as for any uncaught Ctrl-C (atexit, then SIGINT)
            sys.excepthook = lambda *_: None
            raise
        raise SystemExit(1) from None
    # the command ended without raising: the interpreter's exit, status 0


# ------------------------------------------------------------------------------------------ the client
class _Server:
    lock = threading.Lock()
    proc: subprocess.Popen | None = None
    folder = ""
    env: dict = {}
    threads = 0


def _server() -> type[_Server]:
    """This process's server, started at its first command, with BASE (unbuffered, as `tests/conftest.py` runs
    every command); it reads EOF on its stdin, and ends, when this process ends."""
    with _Server.lock:
        if _Server.proc is None or _Server.proc.poll() is not None:
            folder = tempfile.mkdtemp(prefix="rw-forked-")
            proc = subprocess.Popen([sys.executable, "-c", f"from tests._forked import serve; "
                                     f"serve({os.path.join(folder, 'socket')!r})"], cwd=ROOT, env=BASE,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the command server ended at start-up with status {proc.wait()}")
            ready = json.loads(line)
            _Server.proc, _Server.folder, _Server.env, _Server.threads = proc, folder, ready["env"], ready["threads"]
            atexit.register(_stop, proc, folder)
    return _Server


def _stop(proc: subprocess.Popen, folder: str) -> None:
    proc.kill()
    proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def serves(env: dict, argv: list | None = None) -> bool:
    """Can a forked process be this command? Its environment differs from the server's only in RUNTIME
    variables, its script is a file (or it is `-m`), and the server is single-threaded."""
    server = _server()
    if server.threads != 1:
        return False
    if argv and str(argv[0]) != "-m" and not os.path.isfile(argv[0]):
        return False   # the interpreter's own refusal (`can't open file`, a folder, …): a fresh one says it
    changed = {k for k in set(env) | set(server.env) if env.get(k) != server.env.get(k)}
    return all(k.startswith(RUNTIME) for k in changed)


def run(argv: list, cwd, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *argv], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)`,
    forked from the server (`serves(env, argv)` must hold); argv: a script and its arguments, or `-m` and a
    module's."""
    argv = [os.fspath(a) for a in argv]
    cmd = [sys.executable, *argv]
    if not os.path.isdir(cwd):   # what subprocess raises, before any process
        raise FileNotFoundError(2, "No such file or directory", os.fspath(cwd))
    if any("=" in k or not k for k in env):
        raise ValueError("illegal environment variable name")
    server = _server()
    deadline = None if timeout is None else time.monotonic() + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(os.path.join(server.folder, "socket"))
            request = {"argv": argv, "cwd": os.fspath(cwd), "env": env}
            stdin = _stdin()
            try:
                socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [stdin, out_w, err_w])
            finally:
                if stdin != 0:   # our own /dev/null: the command has its copy
                    os.close(stdin)
            os.close(out_w)
            os.close(err_w)
            out_w = err_w = None
            streams = {out_r: bytearray(), err_r: bytearray()}
            replies = _Lines(conn)
            open_fds = [out_r, err_r, conn]
            while open_fds:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(cmd, timeout, bytes(streams[out_r]), bytes(streams[err_r]))
                ready, _, _ = select.select(open_fds, [], [], left)
                for r in ready:
                    if r is conn:
                        replies.read()
                        while (reply := replies.next()) is not None:
                            if "pid" in reply:
                                pid = reply["pid"]
                            else:
                                code = reply["returncode"]
                                open_fds.remove(conn)
                        if replies.closed and conn in open_fds:
                            raise RuntimeError("the command server's waiter ended without the command's status")
                    else:
                        chunk = os.read(r, 1 << 16)
                        if chunk:
                            streams[r] += chunk
                        else:
                            open_fds.remove(r)
        except BaseException:
            if pid is not None:   # as subprocess.run: the process is killed on a timeout or any other exception
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise
        finally:
            for fd in (out_r, err_r, out_w, err_w):
                if fd is not None:
                    os.close(fd)
    return subprocess.CompletedProcess(cmd, code, _text(streams[out_r]), _text(streams[err_r]))


def _stdin() -> int:
    """The caller's stdin, which a command inherits (/dev/null where it has none)."""
    try:
        os.fstat(0)
        return 0
    except OSError:
        return os.open(os.devnull, os.O_RDONLY)


def _text(data: bytes) -> str:
    """As `subprocess.run(text=True)` decodes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


class _Lines:
    """The waiter's JSON lines, as they arrive on the socket."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buf, self.closed = conn, b"", False

    def read(self) -> None:
        chunk = self.conn.recv(1 << 12)
        self.closed = not chunk
        self.buf += chunk

    def next(self) -> dict | None:
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)
