"""Shared helpers: run `launch.py` as users do (a real process, real Hydra)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# One thread each, inherited by the processes the tests start (launch.py, …): parallel workers share the cores
# (with every worker's torch spinning threads for all cores, a 25 s sweep was seen to take over 600 s), and the
# server the suite's commands fork from (tests/_forked.py) must be single-threaded, which OpenBLAS's pool is not.
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")
# The suite tests how launches answer SIGINT and SIGHUP. Started under `nohup`, or in the background of a shell
# without job control, it would hand every launch (and the server they fork from) those signals ignored, which
# a launch honours, as `nohup` users expect, and each signal test would fail for it: set back to their defaults.
for _signum, _default in ((signal.SIGHUP, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _default)
from . import _forked  # noqa: E402 - after the settings above: the environment and signals its server starts with


# Small but real runs: every test sweep uses these unless it needs the paper's shape.
SMALL = ["data.n_test=200", "optim.steps=10"]  # n_train stays 1000: with fewer, p = 0.5 often locks on a wrong position


def _names(args: tuple, key: str) -> bool:
    """Does the command set `key` (as `key=…`, `+key=…`, `++key=…` or `~key`)?"""
    return any(a.lstrip("+~").startswith(key) for a in args)


def _with_analysis_named(args: tuple) -> list[str]:
    """The command a test runs, with the sweep-end wandb analysis run (`wandb.analysis`) off unless the test
    names the key: it is one report of the whole sweep, drawn after the last run is written (a Hydra callback
    whose failure is a warning), and costs a launch ~2.5 s of imports and drawing. The tests that are about it
    say `wandb.analysis=true`; every other launch runs as the user's command otherwise would."""
    if _names(args, "wandb.analysis"):
        return list(args)
    return [*args, "wandb.analysis=false"]


def _environment(args: tuple, env: dict | None) -> dict:
    """The launch's environment: wandb disabled (`WANDB_MODE`, the default of `wandb.mode`) unless the test names
    `wandb.mode` or passes its own `WANDB_MODE`. An offline wandb run costs a launch ~1.5 s of CPU (wandb's
    service process, a run per job); the tests about wandb, its files and its behaviour under faults and signals
    say `wandb.mode=offline`, and every other launch is the user's command with `wandb.mode=disabled`."""
    e = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    if not _names(args, "wandb.mode"):
        e["WANDB_MODE"] = "disabled"
    return {**e, **(env or {})}


def declared_in(text: str, test_file: str) -> str:
    """A registration refusal's one line less the file it ends by naming (`registry.Unregistrable`), which must
    be `test_file`, the test module that declared the option, as seen from the working folder."""
    here = os.path.relpath(test_file)
    where = f" ({test_file if here.startswith('..') else here})"
    assert text.endswith(where), text
    return text[:-len(where)]


def python(*argv, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python ARGV` run to its end, as `subprocess.run(…, text=True, capture_output=True)` runs it, unbuffered:
    in a process forked from this worker's server, which has imported torch and the other libraries once
    (`tests/_forked.py`: ~1 s of CPU less a launch), or in a fresh interpreter where the environment changes what
    a library read as the server loaded it. `env`: the whole environment (default: this process's)."""
    e = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    # A command typed in a shell starts its own wandb service. wandb hands its service to child processes
    # through WANDB_SERVICE, which a test calling wandb in this worker leaves set: a command that inherited it
    # would share this worker's service, where a run of an earlier command that died stays registered (`run ID
    # … is in use`).
    e.pop("WANDB_SERVICE", None)
    if _forked.serves(e, list(argv)):
        return _forked.run(list(argv), cwd, e, timeout)
    return subprocess.run([sys.executable, *map(os.fspath, argv)], cwd=cwd, env=e, text=True, capture_output=True,
                          timeout=timeout)


def launch(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` (`python`), with the suite's wandb defaults (`_environment`)."""
    return python(ROOT / "launch.py", *_with_analysis_named(args), cwd=cwd, env=_environment(args, env),
                  timeout=timeout)


def summaries(sweep_dir: Path) -> dict[str, dict]:
    """Every run's summary by its name: a run folder's summary.json, and a stored run's record (a sweep of
    1,000 runs or more is stored: `rw_sweeps.core.store`)."""
    from rw_sweeps.core import store

    out = {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(sweep_dir).glob("*/summary.json"))}
    index = store.index(sweep_dir)
    return {**{name: index.record(name)[1] for name in index.runs}, **out}


@pytest.fixture
def launch_fn():
    return launch


def start_launch(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.Popen:
    """`launch.py` in the background (to kill it, or to act on its jobs while it runs)."""
    return subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *_with_analysis_named(args)], cwd=cwd,
                            env=_environment(args, env), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_training(p: subprocess.Popen) -> None:
    """Read a background `launch.py`'s output until its training loop announces itself (before its first
    step); fail with its stderr if it ends first."""
    line = wait_until(lambda: p.stdout.readline() if p.poll() is None else "gone", 120, "the training to start")
    while "training" not in line:
        line = p.stdout.readline()
        assert line, p.stderr.read()


def status_cmd(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m rw_sweeps.sweeps.status ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "rw_sweeps.sweeps.status", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def status_here(*args: str) -> subprocess.CompletedProcess:
    """`rw_sweeps.sweeps.status` as `status_cmd` runs it, in this process: for refusals, whose exit code and
    lines are all there is to see (a test that must survive a hang marks itself with a pytest timeout)."""
    import contextlib
    import io

    from rw_sweeps.sweeps import status

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = status.main(list(args))
        except SystemExit as e:  # argparse's refusals
            code = e.code
    return subprocess.CompletedProcess(["rw-status", *args], code, out.getvalue(), err.getvalue())


def forget_version_base() -> None:
    """Hydra's launcher test suite runs its apps without a version_base: forget the one earlier tests' compose()
    set (Hydra keeps it in a process-wide singleton)."""
    from hydra.core.singleton import Singleton
    from hydra.version import VersionBase

    Singleton._instances.pop(VersionBase, None)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The refusal a launch printed: one line on stderr, no traceback anywhere."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    return lines[0]


def wait_until(predicate, timeout: float, what: str, poll: float = 0.05):
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` s."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far (user + system, /proc/PID/stat): it grows only while the process
    runs, so waiting for it is waiting for work done, however loaded the machine is."""
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_work(pid: int, seconds: float, timeout: float = 300, what: str = "the process to work") -> None:
    """Wait until a process has used `seconds` more CPU time than now (not wall time: a loaded machine only
    makes the wait longer, never the work shorter)."""
    start = cpu_seconds(pid)
    wait_until(lambda: cpu_seconds(pid) - start >= seconds, timeout, what)


_PER_STEP: list[float] = []


def seconds_per_step() -> float:
    """Wall time of one training step of the SMALL shape here and now, measured once per session. Tests that
    must catch a run mid-way size it with this: machines, their load and the engine's speed all differ."""
    if not _PER_STEP:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            r = launch("data.n_test=200", "optim.steps=200", "wandb.mode=disabled", f"hydra.run.dir={d}/run")
            assert r.returncode == 0, r.stderr
            wall = json.loads((Path(d) / "run" / "summary.json").read_text())["wall_s"]
        _PER_STEP.append(max(wall / 200, 1e-5))
    return _PER_STEP[0]


def steps_lasting(seconds: float, lo: int = 20, hi: int = 20000) -> int:
    """A step count whose training takes about `seconds` on this machine (a multiple of 10, in [lo, hi])."""
    return int(min(hi, max(lo, -(-seconds / seconds_per_step() // 10) * 10)))


# `make test-fast` is the unit layer, in this process. A test that starts a Python process (launch.py, analysis,
# status, a child that measures), a SLURM command or a browser is end to end: most of its cost is that
# process's start-up, and it carries the `e2e` mark. Under RW_UNIT_ONLY=1 starting one fails the test that does,
# so no unmarked one slips into the fast loop. Cheap helpers the product itself calls (git for provenance, the C
# compiler that builds the fused kernel once per machine) are not such processes.
SLURM_COMMANDS = {"sbatch", "srun", "squeue", "sinfo", "scancel", "sacct", "scontrol"}


def pytest_configure(config):
    xdist_controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if os.environ.get("RW_UNIT_ONLY") == "1" and not xdist_controller:  # the controller starts the workers
        refuse_processes()


def end_to_end(argv0: str) -> bool:
    name = os.path.basename(argv0)
    return (argv0 == sys.executable or name.startswith("python") or name in SLURM_COMMANDS
            or name.startswith("chrom") or name == "node")  # node: the browser driver of playwright


def refuse_processes() -> None:
    start = subprocess.Popen.__init__

    def unit_only(self, args, *rest, **kwargs):
        argv0 = os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
        if end_to_end(argv0.split()[0] if kwargs.get("shell") and argv0.strip() else argv0):
            pytest.fail(f"this test starts a process ({argv0!r}) under RW_UNIT_ONLY=1: mark it `e2e`", pytrace=False)
        start(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = unit_only


# Parallel workers: `make test` runs `pytest -n N --dist loadfile`, which keeps a test module on one worker, so its
# module- and session-scoped sweeps are built once. The SLURM tests share one module for the same reason: one
# worker runs them one after another (the cluster is one node, and they read its queue).
SLURM_MODULE = "test_slurm.py"


def pytest_runtest_setup(item):
    if item.get_closest_marker("slurm") and item.path.name != SLURM_MODULE:
        pytest.fail(f"{item.nodeid} is marked slurm: tests that need the SLURM cluster live in tests/{SLURM_MODULE}, "
                    f"which one worker runs", pytrace=False)


def pytest_runtest_logreport(report):
    """On the controller of a parallel run, which worker ran each module (`report.node`, xdist's public report
    attribute): checked at the end, so a scheduler that stops keeping modules together under `--dist loadfile`
    (`make test`) fails the run. Other modes spread a module on purpose and are not checked."""
    node = getattr(report, "node", None)
    if node is not None:
        _WORKERS.setdefault(report.nodeid.split("::", 1)[0], set()).add(node.gateway.id)


_WORKERS: dict[str, set] = {}


def pytest_sessionfinish(session, exitstatus):
    split = sorted(m for m, w in _WORKERS.items() if len(w) > 1)
    if split and session.config.getoption("dist", "no") == "loadfile":
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"error: {len(split)} test module(s) ran on more than one worker ({split[0]}, …): their shared "
            f"sweeps were built once per worker; see tests/conftest.py", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "1m"):
    """A tmpfs of `size` mounted at the new folder `folder` (root only; CI runs as root), unmounted after; the
    test is skipped where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)
