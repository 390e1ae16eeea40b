"""Ctrl-C, SIGTERM and SIGHUP anywhere in a launch take one path (`rw_sweeps.sweeps.signals`): what is in
flight is checkpointed or written, one line, the sweep's lock released, exit 130, 143 or 129.

Every test signals a real `launch.py` process, and only once its output or its files prove it has reached
the state the test is about (training, a chunk handed to the writer, the sweep's analysis run).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from rw_sweeps.sweeps import lock
from .conftest import ROOT, cpu_seconds, launch, start_launch, wait_for_work, wait_until

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

TINY = ["data.n_train=64", "data.n_test=64", "model.M=200"]
QUIET = [*TINY, "wandb.mode=disabled"]
# About 7 s of training for two runs here (7.5 µs a step): a signal after half a CPU second of it, handled at
# the end of a block of at most a second, always finds them mid-way, on a loaded machine as on an idle one.
LONG = ["optim.steps=1000000", "eval_every=100000"]
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
# Fields of a summary.json that say where and when, not what: the folder's run id, the wall time, the commit
# of a checkout other people commit to
LOCAL = {"wall_s", "run_id", "git_commit", "git_dirty"}


class Output:
    """A background launch's stdout and stderr, read on threads: waiting for a line never blocks past its
    timeout, and neither pipe can fill up."""

    def __init__(self, p: subprocess.Popen):
        self.p = p
        self.out: list[str] = []
        self.err: list[str] = []
        self.cursor = 0  # stdout lines already looked at
        self.cond = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(fh, lines), daemon=True)
                        for fh, lines in ((p.stdout, self.out), (p.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, fh, lines: list[str]) -> None:
        for line in fh:
            with self.cond:
                lines.append(line)
                self.cond.notify_all()

    def wait_for(self, pred, what: str, timeout: float = 180) -> str:
        """The next stdout line (after the one the last call returned) for which pred holds; fails if the
        process ends first or after timeout."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, line in enumerate(self.out[self.cursor:], self.cursor):
                    if pred(line):
                        self.cursor = i + 1
                        return line
                self.cursor = len(self.out)
                if self.p.poll() is not None and not self.readers[0].is_alive():
                    pytest.fail(f"the launch ended before {what}: {''.join(self.err)[-3000:]}")
                left = end - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
                self.cond.wait(min(left, 0.2))

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """Wait for the process to end: (its exit status, all of its stdout, all of its stderr)."""
        code = self.p.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout=30)
        return code, "".join(self.out), "".join(self.err)


def start(*args: str) -> Output:
    return Output(start_launch(*args))


def the_line(out: str, err: str) -> str:
    """The one line a signal's end prints (stderr), and no traceback anywhere."""
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def summaries(sweep: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))}


def complete(run: Path) -> bool:
    """A finished run by the contract: its summary says done and its three files are there and parse."""
    s = json.loads((run / "summary.json").read_text())
    yaml.safe_load((run / "config.yaml").read_text())
    for name in ("history.jsonl", "snapshots.jsonl"):
        [json.loads(ln) for ln in (run / name).read_text().splitlines()]
    return s["status"] == "done"


def temps(sweep: Path) -> list[Path]:
    return [p for p in sweep.rglob("*.tmp")]


def checkpoint_step(run: Path) -> int:
    import torch

    return int(torch.load(run / "checkpoint.pt", weights_only=True)["state"]["step"])


def training(o: Output) -> None:
    """The step loop has started (its first line), and has taken steps for half a CPU second since."""
    o.wait_for(lambda ln: "training" in ln, "the training to start")
    wait_for_work(o.p.pid, 0.5, what="the runs to take steps")


# ------------------------------------------------------------------------------------ training
def test_sigterm_during_training_checkpoints_releases_the_lock_and_resumes_to_the_uninterrupted_results(tmp_path):
    args = ["-m", *QUIET, *LONG, "seed=0,1"]
    cut = tmp_path / "cut"
    o = start(*args, f"hydra.sweep.dir={cut}")
    training(o)
    assert (cut / lock.LOCK).exists()
    o.p.send_signal(signal.SIGTERM)
    code, out, err = o.finish()
    assert code == 143, err
    assert the_line(out, err).startswith("stopped by SIGTERM: finished runs are kept and the others checkpointed")
    steps = [checkpoint_step(cut / n) for n in "01"]
    assert all(0 < s < 1000000 for s in steps), steps  # at most one block lost, and nothing finished
    assert not summaries(cut) and not (cut / lock.LOCK).exists() and not temps(cut)

    again = launch(*args, f"hydra.sweep.dir={cut}")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("from its checkpoint at step") == 2
    whole = tmp_path / "whole"
    assert launch(*args, f"hydra.sweep.dir={whole}").returncode == 0
    for n in "01":
        a, b = json.loads((cut / n / "summary.json").read_text()), json.loads((whole / n / "summary.json").read_text())
        assert {k: v for k, v in a.items() if k not in LOCAL} == {k: v for k, v in b.items() if k not in LOCAL}
        assert a["status"] == "done" and a["steps"] == 1000000
        for name in ("history.jsonl", "snapshots.jsonl"):  # config.yaml names its sweep (wandb.group)
            assert (cut / n / name).read_bytes() == (whole / n / name).read_bytes(), name
    assert not (cut / lock.LOCK).exists()


def test_sighup_during_training_checkpoints_and_exits_129(tmp_path):
    sweep = tmp_path / "S"
    o = start("-m", *QUIET, *LONG, "seed=0,1", f"hydra.sweep.dir={sweep}")
    training(o)
    o.p.send_signal(signal.SIGHUP)
    code, out, err = o.finish()
    assert code == 129, err
    assert the_line(out, err).startswith("stopped by SIGHUP: finished runs are kept")
    assert all(checkpoint_step(sweep / n) > 0 for n in "01")
    assert not summaries(sweep) and not (sweep / lock.LOCK).exists()


# ------------------------------------------------------------------------------------ writing
def test_sigterm_while_results_are_written_behind_loses_nothing_finished(tmp_path):
    """Four chunks of two runs (two short, then two long), each chunk's results written on the writer thread
    while the next trains. SIGTERM as soon as chunk 3 starts, right after chunk 2's results were handed to
    the writer: the launch ends 143 only once they are written, and every short run is done and whole."""
    sweep = tmp_path / "S"
    o = start("-m", *QUIET, "optim.steps=20,1000000", "eval_every=100000", "seed=range(0,4)",
              "hydra.launcher.write_behind=true", "hydra.launcher.max_runs_per_job=2", f"hydra.sweep.dir={sweep}")
    o.wait_for(lambda ln: ln.startswith("job 3/4"), "chunk 2 to be handed to the writer")
    o.p.send_signal(signal.SIGTERM)
    code, out, err = o.finish()
    assert code == 143, err
    assert the_line(out, err).startswith("stopped by SIGTERM")
    done = summaries(sweep)
    assert sorted(done) == ["0", "1", "2", "3"], sorted(done)
    assert all(complete(sweep / n) and done[n]["steps"] == 20 for n in "0123")
    announced = [ln for ln in out.splitlines() if ln.startswith("done:")]
    assert len(announced) == 4  # every run said done is done on disk, and the other way round
    assert not temps(sweep) and not (sweep / lock.LOCK).exists()


# ------------------------------------------------------------------------------------ two Ctrl-C
def test_two_ctrl_c_half_a_second_apart_end_quietly_and_keep_the_wandb_markers(tmp_path):
    """The first Ctrl-C checkpoints and ends the launch; the second, half a second later, is the same
    request: no thread traceback, no wandb warning, one line, exit 130, and the finished runs' wandb runs
    are complete (their markers written)."""
    sweep = tmp_path / "S"
    o = start("-m", *TINY, "wandb.mode=offline", "optim.steps=10,1000000", "eval_every=100000", "seed=0,1",
              "hydra.launcher.write_behind=true", f"hydra.sweep.dir={sweep}")
    o.wait_for(lambda ln: ln.startswith("job 2/2"), "chunk 1 to end")
    training(o)
    o.p.send_signal(signal.SIGINT)
    time.sleep(0.5)
    o.p.send_signal(signal.SIGINT)
    code, out, err = o.finish()
    assert code == 130, err
    assert the_line(out, err).startswith("interrupted: finished runs are kept") and "warning" not in err
    assert all(complete(sweep / n) and (sweep / n / ".wandb_exported.json").exists() for n in "01")
    assert all(checkpoint_step(sweep / n) > 0 for n in "23")
    assert not (sweep / lock.LOCK).exists()


def test_a_later_second_signal_stops_at_once_with_the_first_ones_code_and_releases_what_it_holds(tmp_path):
    """The mechanism under a long end (a slow flush): a second signal within a second is ignored, one after
    a second stops the process at once, with the first signal's code, after its `on_stop` functions."""
    marker = tmp_path / "released"
    script = tmp_path / "slow_end.py"
    script.write_text(f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from rw_sweeps.core import signals
signals.install()
signals.on_stop(lambda: open({str(marker)!r}, "w").close())
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt as exc:
    code = signals.stopping(exc)
    print("ending", code, flush=True)
    time.sleep(60)  # a flush that takes long
sys.exit(0)
""")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGTERM)
    assert p.stdout.readline() == "ending 143\n"
    p.send_signal(signal.SIGINT)  # within the second: the same request
    time.sleep(1.5)
    assert p.poll() is None and not marker.exists()
    p.send_signal(signal.SIGINT)  # later: now
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143 and marker.exists()
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "SIGINT again: stopped at once; what was still being written is lost (a launch trains those runs "
        "again, from their checkpoints)"]


# ------------------------------------------------------------------------------------ the analysis run
def test_sigterm_during_the_sweeps_analysis_run_is_one_line_and_exit_143(tmp_path):
    sweep = tmp_path / "S"
    o = start("-m", *TINY, "wandb.mode=offline", "wandb.analysis=true", "optim.steps=10", "seed=0,1",
              f"hydra.sweep.dir={sweep}")
    o.wait_for(lambda ln: ln.startswith(f"sweep {sweep}:"), "the sweep's line (its analysis run follows)")
    o.p.send_signal(signal.SIGTERM)
    code, out, err = o.finish()
    assert code == 143, err
    assert the_line(out, err).startswith("stopped by SIGTERM")
    assert all(complete(sweep / n) for n in "01") and not (sweep / lock.LOCK).exists()


# ------------------------------------------------------------------------------------ local jobs
def test_sigterm_to_a_launch_whose_jobs_run_in_their_own_process_checkpoints_them_first(tmp_path):
    """packed_gpus on a machine without a GPU: one submitit process trains the chunk. SIGTERM to the launch
    reaches that job (as SIGINT), which checkpoints and ends before the launch does: no process is left
    writing into the sweep once its lock is released."""
    sweep = tmp_path / "S"
    o = start("-m", "hydra/launcher=packed_gpus", *QUIET, "optim.steps=5000000", "eval_every=500000", "seed=0,1",
              f"hydra.sweep.dir={sweep}")
    logs = sweep / ".submitit"
    wait_until(lambda: any("training" in f.read_text() for f in logs.glob("*/*_log.out")), 180,
               "the job to start training")
    jobs = descendants(o.p.pid)  # submitit's controller and the job's process, which trains
    start_cpu = sum(cpu_seconds(pid) for pid in jobs)
    wait_until(lambda: sum(cpu_seconds(pid) for pid in jobs) - start_cpu >= 0.5, 300, "the job's runs to take steps")
    o.p.send_signal(signal.SIGTERM)
    code, out, err = o.finish()
    assert code == 143, err
    assert the_line(out, err).startswith("stopped by SIGTERM")
    assert all(checkpoint_step(sweep / n) > 0 for n in "01")
    assert not [pid for pid in jobs if alive(pid)]
    assert not (sweep / lock.LOCK).exists()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc)."""
    parent = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as fh:
                parent[int(name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [c for c, p in parent.items() if p == here]
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------ killed writes
def test_stale_temp_files_of_killed_writes_are_removed_by_the_next_launch(tmp_path):
    """Only in the folders the sweep's record names (its own and its runs'), never by walking a tree."""
    sweep, outside = tmp_path / "S", tmp_path / "outside"
    r = launch("-m", *QUIET, "optim.steps=10", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    for n in "01":  # the runs are done: the next launch must write (retrain) something to hold the lock
        (sweep / n / "summary.json").unlink()
    (sweep / "notes" / "deep").mkdir(parents=True)
    outside.mkdir()
    old = time.time() - 3600
    stale = [sweep / ".multirun.yaml.0123456789abcdef.tmp", sweep / "0" / ".summary.json.0123456789abcdef.tmp",
             sweep / "0" / ".hydra" / ".config.yaml.fedcba9876543210.tmp"]
    kept = [sweep / "0" / ".history.jsonl.0123456789ABCDEF.tmp",  # not a name of ours (upper-case hex)
            sweep / "0" / "notes.0123456789abcdef.tmp",            # nor this (no leading dot)
            sweep / "notes" / "deep" / ".n.0123456789abcdef.tmp",   # a folder no record names: not walked
            outside / ".x.0123456789abcdef.tmp"]                   # outside the sweep: reached only by a link
    for f in stale + kept:
        f.write_text("partial")
        os.utime(f, (old, old))
    young = sweep / ".x.0123456789abcdef.tmp"  # being written right now, for all a launch can tell
    young.write_text("partial")
    soon = time.time() + 3600  # fresh whenever the launch looks, however loaded the machine (no timing luck)
    os.utime(young, (soon, soon))
    link = sweep / ".y.0123456789abcdef.tmp"  # a link with one of our names: the link goes, not its target
    os.symlink(outside / ".x.0123456789abcdef.tmp", link)
    os.utime(link, (old, old), follow_symlinks=False)
    os.symlink(outside, sweep / "elsewhere")  # a link to a folder is never entered

    r = launch("-m", *QUIET, "optim.steps=10", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert not any(f.exists() for f in stale) and not os.path.lexists(link)
    assert all(f.exists() for f in kept) and young.exists()
    assert all(complete(sweep / n) for n in "01")
