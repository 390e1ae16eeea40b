"""`python ARGS` for the test suite (`launch.py …`, `-m analysis …`), in a process forked from a server that has
imported the libraries these commands import (torch alone is ~1.4 s of CPU a process; the suite starts ~300
launches on 2 cores).

What the forked process is given is what `subprocess.run([python, *ARGS], cwd=…, env=…)` gives: its own pid,
the environment (replaced whole), the folder, `sys.argv` and `sys.path[0]` as the interpreter sets them for a
script or a `-m` module, stdin from /dev/null, stdout and stderr to their own files, an exception's trace as the
interpreter prints it, and the interpreter's own end (atexit functions, flushed streams, the exit status or the
signal that ended it, as `os.waitpid` reports it). Not one module of this repository is imported by the server:
the command imports the project as a fresh process does, so no state of an earlier command, and no environment
variable a module reads when it is imported, carries over. What the server cannot give is an environment that
changes what a library read when the server imported it (its thread pools, the interpreter's own settings):
`serves(env)` says so, and `tests/conftest.py` starts a fresh interpreter then.

The server is single-threaded (a fork copies one thread), runs no torch operation (its thread pools are not
started), and answers each request in a waiter process of its own, so that commands may overlap:

    server ──fork──> waiter ──fork──> the command
                       └── reports the command's pid, then its exit status, on the request's socket

`-m` runs through `runpy._run_module_as_main`, the function the interpreter itself calls for `python -m` (so
the trace of an exception has the frames a fresh `python -m` prints); this module is its one user.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imported once by the server: the libraries, none of this repository's modules (nor matplotlib, which reads
# MPLBACKEND as it is imported)
PRELOAD = ("numpy", "torch", "yaml", "omegaconf", "hydra", "hydra.main", "hydra.core.config_store",
           "hydra.core.plugins", "hydra._internal.utils", "hydra._internal.hydra", "pandas", "pyarrow.parquet")
# What a library or the interpreter reads when it loads (thread pools, allocators, encodings, hash seed):
# a launch whose environment differs from the server's in one of these is not forked
AT_LOAD = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "LD_", "MALLOC_", "TORCH_", "CUDA_", "LC_",
           "LANG")


def at_load(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(AT_LOAD)}


def serve(path: str) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print(json.dumps({"ready": os.getpid(), "at_load": at_load(dict(os.environ))}), flush=True)
    while True:
        conn, _ = server.accept()
        _reap()
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
    request = json.loads(conn.makefile("rb").readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_the_command(request)
        return
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    finally:
        os._exit(0)


def _become_the_command(request: dict) -> None:
    """This process becomes `python ARGS`: its files, environment, folder, argv and sys.path[0], then the script
    or module; an exception is reported as the interpreter reports one, from the same first frame."""
    import runpy
    import signal
    import traceback

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    try:
        if argv[0] == "-m":   # as `python -m`: the folder first on the path, argv[0] the module's file
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            first = "_run_module_as_main"
            runpy._run_module_as_main(argv[1], alter_argv=True)
        else:                 # as `python script`: the script's folder first on the path
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(script)
            first = "<module>"
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - as the interpreter reports an exception the command raised
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != first:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        sys.stderr.flush()
        if isinstance(exc, KeyboardInterrupt):  # the interpreter ends by the signal itself
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None
    # the command ended without raising: the interpreter's exit, status 0


# ------------------------------------------------------------------------------------------ the client
class _Server:
    proc: subprocess.Popen | None = None
    path = ""
    at_load: dict = {}


def _server() -> type[_Server]:
    """This process's server, started at its first launch, with this process's environment (as each launch
    gets it from `tests/conftest.py`: unbuffered, wandb silent); ended with this process."""
    if _Server.proc is None or _Server.proc.poll() is not None:
        folder = tempfile.mkdtemp(prefix="rw-forked-")
        path = os.path.join(folder, "socket")
        env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-c", f"from tests._forked import serve; serve({path!r})"], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the launch server ended at start-up with status {proc.wait()}")
        _Server.proc, _Server.path, _Server.at_load = proc, path, json.loads(line)["at_load"]
        atexit.register(_stop, proc)
    return _Server


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def serves(env: dict) -> bool:
    """Can a forked process have this environment? Not where it differs from the server's in what a library
    read as the server imported it."""
    return at_load(env) == _server().at_load


def run(argv: list[str], cwd, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *argv], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)`,
    forked from the server (`serves(env)` must hold); argv: a script and its arguments, or `-m` and a module's."""
    server = _server()
    argv = [os.fspath(a) for a in argv]
    cmd = [sys.executable, *argv]
    with tempfile.TemporaryDirectory(prefix="rw-launch-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(server.path)
            request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                       "stderr": str(err)}
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = _Lines(conn)
            pid = replies.next()["pid"]
            conn.settimeout(timeout)
            try:
                code = replies.next()["returncode"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)   # as subprocess.run kills its process at the timeout
                conn.settimeout(None)
                replies.next()
                raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())


class _Lines:
    """The waiter's JSON lines, read from the socket itself (a file over it refuses to read after a timeout)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buf = conn, b""

    def next(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.conn.recv(1 << 12)
            if not chunk:
                raise RuntimeError("the launch server's waiter ended without the launch's status")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)
