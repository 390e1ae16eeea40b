"""A stop is a deadline. After SIGTERM, SIGHUP or SIGINT a launch exits within a bounded
time whatever else fails: a run whose checkpoint cannot be written (a folder planted at `checkpoint.pt`, a
seal key that cannot be used, a full disk) is one line on stdout, naming its folder and why, and stays
unfinished; the chunk's other runs are checkpointed; nothing is trained once the stop is asked for (the
chunk used to fall back to retraining every run alone from step 0, past the signal: 131 s instead of 2 s).
A periodic checkpoint (`checkpoint_every`) that cannot be written is one line, once, and training goes on.

The e2e tests signal a real `launch.py` once its output and its CPU time prove it is training, and measure
the time from the signal to the process's end (printed; asserted under a bound far above it, for a loaded
machine).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from rw_sweeps.core import results, training
from rw_sweeps.core.config import RunConfig, data_config, validate
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.optimisers.gd import Gd
from rw_sweeps.sweeps import lock, run

from .conftest import cpu_seconds, launch, start_launch, wait_until
from .test_signals import (LOCAL, QUIET, Output, alive, checkpoint_step, descendants, start, summaries, the_line,
                           training as trains)

LONG = ["optim.steps=1000000", "eval_every=100000"]  # ~7 s for two runs: a signal always finds them mid-way
# The bounds asserted, from the signal to the process's end: ~2 s idle here (load 0), ~19 s for a stop with nothing
# wrong at load 10 on this 2-core VM, where the old fallback trained both runs again alone. The CPU time the
# launch spends stopping does not depend on the load: the aim: 10 s beyond the running step.
DEADLINE_S = 120.0
STOP_CPU_S = 10.0
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """Every test seals with a key of its own (created on first use), never the user's."""
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "keys" / "seal.key"))


def stopped(o, sig: int) -> tuple[int, str, str, float]:
    """Send `sig` to the launch and wait for its end: (exit status, stdout, stderr, seconds from the signal).
    Its CPU time from the signal to its end is held to STOP_CPU_S (the work a stop does, whatever the load);
    the wall time, printed with it, to DEADLINE_S."""
    # its jobs' processes too (packed_gpus): their CPU time reaches the launch's when they are reaped
    before = sum(cpu_seconds(pid) for pid in [o.p.pid, *descendants(o.p.pid)])
    t0 = time.monotonic()
    o.p.send_signal(sig)
    _, status, usage = os.wait4(o.p.pid, 0)  # reaped here, for its CPU time to the end
    took, work = time.monotonic() - t0, usage.ru_utime + usage.ru_stime - before
    o.p.returncode = os.waitstatus_to_exitcode(status)
    code, out, err = o.finish()
    print(f"stop latency ({signal.Signals(sig).name}): {took:.2f} s, {work:.2f} CPU s")
    assert work <= STOP_CPU_S, (work, out)
    return code, out, err, took


def unsaved(out: str, run_dir: Path) -> list[str]:
    """The lines saying that a run's checkpoint could not be written."""
    return [ln for ln in out.splitlines() if ln.startswith(f"{run_dir}: could not write its checkpoint")]


def batches(out: str) -> list[str]:
    """The lines a batch's training starts with (`training 2 run(s): step 0 → 12`)."""
    return [ln for ln in out.splitlines() if re.fullmatch(r"training \d+ run\(s\): step \d+ → \d+", ln)]


def nothing_trained_after(out: str) -> None:
    """No run ended and none was trained again alone (the old fallback's `training 1 run(s)`): one batch."""
    assert not [ln for ln in out.splitlines() if ln.startswith(("done:", "failed:", "diverged:"))], out
    assert len(batches(out)) == 1 and batches(out)[0].startswith("training 2 run(s)"), out


# ------------------------------------------------------------------------------------ the stop (e2e)
@pytest.mark.e2e
def test_a_folder_planted_at_a_checkpoint_neither_delays_a_stop_nor_retrains_anything(tmp_path):
    """a co-worker plants `1/checkpoint.pt/` while a 2-run grid trains. SIGTERM: exit 143
    within the bound, run 1's one line, run 0 checkpointed, nothing retrained; the same command then resumes
    run 0 from its checkpoint, to an uninterrupted run's results, and trains run 1 from step 0."""
    args = ["-m", *QUIET, *LONG, "data.p=0,0.5"]
    sweep = tmp_path / "S"
    o = start(*args, f"hydra.sweep.dir={sweep}")
    trains(o)
    (sweep / "1" / "checkpoint.pt").mkdir()
    code, out, err, took = stopped(o, signal.SIGTERM)
    assert code == 143, err
    assert took <= DEADLINE_S, took
    assert the_line(out, err).startswith("stopped by SIGTERM")
    assert unsaved(out, sweep / "1") == [f"{sweep / '1'}: could not write its checkpoint (checkpoint.pt: Is a "
                                         f"directory); it stays unfinished and starts over from step 0 next time"]
    nothing_trained_after(out)
    saved = checkpoint_step(sweep / "0")
    assert 0 < saved < 1000000 and not unsaved(out, sweep / "0")
    assert not summaries(sweep) and not (sweep / lock.LOCK).exists()

    again = launch(*args, f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr
    assert f"resuming {sweep / '0'} from its checkpoint at step {saved}" in again.stdout
    assert f"{sweep / '1'}: its checkpoint is not this run's" in again.stdout  # the folder: refused, step 0
    assert json.loads((sweep / "1" / "summary.json").read_text())["status"] == "done"
    whole = tmp_path / "whole"  # run 0 never interrupted
    assert launch("-m", *QUIET, *LONG, "data.p=0", f"hydra.sweep.dir={whole}").returncode == 0
    a, b = json.loads((sweep / "0" / "summary.json").read_text()), json.loads((whole / "0" / "summary.json").read_text())
    assert a["status"] == "done" and a["steps"] == 1000000
    assert {k: v for k, v in a.items() if k not in LOCAL} == {k: v for k, v in b.items() if k not in LOCAL}
    for name in ("history.jsonl", "snapshots.jsonl"):
        assert (sweep / "0" / name).read_bytes() == (whole / "0" / name).read_bytes(), name


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_checkpoint_that_cannot_be_written_keeps_every_signal_a_deadline(tmp_path, sig):
    """The same with SIGHUP and Ctrl-C, the folder planted at the first run's checkpoint: the run after it
    is still checkpointed, and the launch ends with the signal's own code."""
    sweep = tmp_path / "S"
    o = start("-m", *QUIET, *LONG, "data.p=0,0.5", f"hydra.sweep.dir={sweep}")
    trains(o)
    (sweep / "0" / "checkpoint.pt").mkdir()
    code, out, err, took = stopped(o, sig)
    assert code == CODES[sig], err
    assert took <= DEADLINE_S, took
    assert len(unsaved(out, sweep / "0")) == 1 and not unsaved(out, sweep / "1")
    nothing_trained_after(out)
    assert 0 < checkpoint_step(sweep / "1") < 1000000
    assert not summaries(sweep) and not (sweep / lock.LOCK).exists()


@pytest.mark.e2e
def test_a_seal_key_that_cannot_be_used_neither_delays_a_stop_nor_retrains_anything(tmp_path):
    """the seal key (RW_SWEEPS_SEAL_KEY) turns to mode 0644 while a 2-run grid trains in a
    job process of its own (`packed_gpus` without a GPU: that process reads the key first when it seals the
    stop's checkpoints; the launch's front door checked it before any job). SIGTERM: exit 143 within the
    bound, one line per run naming the key and the fix (in the job's log), nothing retrained, no job left."""
    sweep, key = tmp_path / "S", tmp_path / "own" / "seal.key"
    key.parent.mkdir()
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    o = Output(start_launch("-m", "hydra/launcher=packed_gpus", *QUIET, "optim.steps=5000000", "eval_every=500000",
                            "data.p=0,0.5", f"hydra.sweep.dir={sweep}", env={"RW_SWEEPS_SEAL_KEY": str(key)}))
    logs = sweep / ".submitit"
    wait_until(lambda: any("training" in f.read_text() for f in logs.glob("*/*_log.out")), 180,
               "the job to start training")
    jobs = descendants(o.p.pid)  # submitit's controller and the job's process, which trains
    start_cpu = sum(cpu_seconds(pid) for pid in jobs)
    wait_until(lambda: sum(cpu_seconds(pid) for pid in jobs) - start_cpu >= 0.5, 300, "the job's runs to take steps")
    key.chmod(0o644)
    code, out, err, took = stopped(o, signal.SIGTERM)
    assert code == 143, err
    assert took <= DEADLINE_S, took
    assert the_line(out, err).startswith("stopped by SIGTERM")
    job_out = "".join(f.read_text() for f in logs.glob("*/*_log.out"))
    for n in "01":
        [line] = unsaved(job_out, sweep / n)  # the key's own line (`seal.SealKeyError`): the file, why, the fix
        assert line.startswith(f"{sweep / n}: could not write its checkpoint ({key}: ") and "0644" in line, line
        assert f"chmod 600 {key}" in line and line.endswith("); it stays unfinished and starts over from step 0 next time")
        assert not (sweep / n / "checkpoint.pt").exists()
    nothing_trained_after(job_out)
    assert not summaries(sweep) and not [pid for pid in jobs if alive(pid)]
    assert not (sweep / lock.LOCK).exists()


# ------------------------------------------------------------------------------------ periodic checkpoints
def cfg(p: float, checkpoint_every: int = 2) -> RunConfig:
    return validate(RunConfig(data=data_config(K=5, N=21, p=p, n_train=60, n_test=40), model=ModelConfig(M=64),
                              optim=Gd(lr=1.0, steps=12), eval_every=4, checkpoint_every=checkpoint_every,
                              snapshot_steps=[0, 4, 8], seed=3,
                              wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))


def same_files(a: Path, b: Path) -> None:
    for name in ("history.jsonl", "snapshots.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), (a, name)
    sa, sb = json.loads((a / "summary.json").read_text()), json.loads((b / "summary.json").read_text())
    assert sa["status"] == "done" and {k: v for k, v in sa.items() if k not in LOCAL} == \
        {k: v for k, v in sb.items() if k not in LOCAL}


def test_a_periodic_checkpoint_planted_over_is_one_line_and_the_runs_train_on(tmp_path, capsys):
    """checkpoint_every=2, a folder at the first run's checkpoint: one line for it (not one per checkpoint),
    the second run's checkpoints still written (the last at step 12), both runs trained in their batch, never
    alone, to the results of runs that were never disturbed."""
    cs, dirs = [cfg(0.7), cfg(0.3)], [tmp_path / "a0", tmp_path / "a1"]
    (dirs[0] / "checkpoint.pt").mkdir(parents=True)
    recs = training.train(cs, dirs, progress=False)
    out = capsys.readouterr().out
    assert unsaved(out, dirs[0]) == [f"{dirs[0]}: could not write its checkpoint (checkpoint.pt: Is a directory); "
                                     f"training goes on"]
    assert [r.status for r in recs] == ["done", "done"] and [r.steps for r in recs] == [12, 12]
    assert results.load_checkpoint(cs[1].to_dict(), dirs[1])["state"]["step"] == 12

    dirs = [tmp_path / "e0", tmp_path / "e1"]  # the same through the batch, its results written
    (dirs[0] / "checkpoint.pt").mkdir(parents=True)
    run.execute(cs, dirs, progress=False)
    out = capsys.readouterr().out
    assert batches(out) == ["training 2 run(s): step 0 → 12"], out
    assert len(unsaved(out, dirs[0])) == 1 and not unsaved(out, dirs[1])
    # the planted folder stays (not ours to remove); the run is done
    assert f"{dirs[0]}: its checkpoint could not be removed (checkpoint.pt: Is a directory); the run is done" in out
    clean = [tmp_path / "b0", tmp_path / "b1"]
    run.execute([cfg(0.7, 0), cfg(0.3, 0)], clean, progress=False)
    for a, b in zip(dirs, clean):
        same_files(a, b)
    assert not (dirs[1] / "checkpoint.pt").exists() and (dirs[0] / "checkpoint.pt").is_dir()


def test_a_periodic_checkpoint_with_an_unusable_seal_key_is_one_line_a_run_and_the_runs_finish(
        tmp_path, monkeypatch, capsys):
    """A seal key of mode 0644 (a launch with checkpoint_every failed every run with a
    traceback): each run's checkpoint is one line naming the key and the fix, once, and both runs end done,
    equal to runs that never checkpointed."""
    key = tmp_path / "open" / "seal.key"
    key.parent.mkdir()
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(key))
    cs, dirs = [cfg(0.7), cfg(0.3)], [tmp_path / "k0", tmp_path / "k1"]
    summaries_ = run.execute(cs, dirs, progress=False)
    out = capsys.readouterr().out
    assert [s["status"] for s in summaries_] == ["done", "done"]
    for d in dirs:
        lines = unsaved(out, d)
        assert len(lines) == 1 and f"({key}: " in lines[0] and "0644" in lines[0], out
        assert lines[0].endswith("; training goes on")
    assert "Traceback" not in out + capsys.readouterr().err
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "keys" / "seal.key"))
    clean = [tmp_path / "c0", tmp_path / "c1"]
    run.execute([cfg(0.7, 0), cfg(0.3, 0)], clean, progress=False)
    for a, b in zip(dirs, clean):
        same_files(a, b)


def test_the_line_names_the_system_error_and_the_file_it_is_about(tmp_path):
    """What a failed checkpoint's line says for the errors a disk gives: the checkpoint's name for anything
    in the run's folder (its temp file included, by path or relative to the folder's handle), a file
    elsewhere by its path; an error without errno by its own line."""
    from rw_sweeps.core.loop import checkpoint_error

    d = tmp_path / "r"
    full = OSError(28, os.strerror(28))
    assert checkpoint_error(d, full) == "checkpoint.pt: No space left on device"
    denied = PermissionError(13, os.strerror(13), str(d / ".checkpoint.pt.0123456789abcdef.tmp"))
    assert checkpoint_error(d, denied) == "checkpoint.pt: Permission denied"
    relative = IsADirectoryError(21, os.strerror(21), ".checkpoint.pt.0123456789abcdef.tmp", "checkpoint.pt")
    assert checkpoint_error(d, relative) == "checkpoint.pt: Is a directory"
    elsewhere = PermissionError(13, os.strerror(13), "/home/u/.cache/rw_sweeps/seal.key")
    assert checkpoint_error(d, elsewhere) == "/home/u/.cache/rw_sweeps/seal.key: Permission denied"
    assert checkpoint_error(d, TypeError("a checkpoint holds no set")) == "TypeError: a checkpoint holds no set"



# ------------------------------------------------------------------------------------ the hand-over
def test_a_signal_pending_when_the_step_loop_raises_goes_first_and_is_never_dropped():
    """A signal that came during a step that then raised (anything but a checkpoint's write: a bug, a device
    error) is handed to its own handler as the loop ends, not dropped: the handler's stop (Ctrl-C's
    KeyboardInterrupt, submitit's requeue) replaces the error, so no caller retries the batch past it; a
    handler that only records it (the front door's `later`) gets it for its next safe point."""
    from rw_sweeps.core.loop import SaveOnSignal

    seen: list[int] = []

    def stop_now(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    def record(signum, frame):
        seen.append(-signum)

    record.later = lambda signum: seen.append(signum)  # type: ignore[attr-defined]
    old = signal.getsignal(signal.SIGUSR2)
    try:
        for handler, raised, expected in ((stop_now, KeyboardInterrupt, [signal.SIGUSR2]),
                                          (record, ZeroDivisionError, [signal.SIGUSR2])):
            seen.clear()
            signal.signal(signal.SIGUSR2, handler)
            with pytest.raises(raised):
                with SaveOnSignal() as stop:
                    os.kill(os.getpid(), signal.SIGUSR2)
                    wait_until(lambda: stop.pending, 10, "the signal to arrive")
                    1 / 0
            assert seen == expected and signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_the_first_kernel_call_of_a_batch_is_short_so_a_signal_waits_for_no_evaluation_interval():
    """Before a step's time is known, a call of the compiled kernel runs at most `PROBE` steps, not the
    whole evaluation interval (500,000 steps: 16 CPU s past a signal in a job of the seal-key case above)."""
    block = training._Block()
    assert block.steps(to_eval=500000, checkpoint_every=0, step=0) == block.PROBE == 16
    block.done(16)
    assert block.steps(to_eval=500000, checkpoint_every=0, step=16) > 16  # then sized by BLOCK_S


# ------------------------------------------------------------------------------------------ a signal at any moment
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

SHORT = ["optim.steps=20000", "eval_every=5000"]  # ~1–3 s of training for two runs: start-up, training and writing
_WHOLE: dict = {}  # the uninterrupted sweep, made once


def _whole(tmp_path_factory) -> Path:
    if "dir" not in _WHOLE:
        whole = tmp_path_factory.mktemp("whole")
        assert launch("-m", *QUIET, *SHORT, "seed=0,1", f"hydra.sweep.dir={whole}").returncode == 0
        _WHOLE["dir"] = whole
    return _WHOLE["dir"]


@pytest.mark.e2e  # it launches
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(delay_s=st.floats(min_value=0.5, max_value=6.0), sig=st.sampled_from(sorted(CODES)))
def test_a_signal_at_any_moment_is_a_clean_stop_and_the_relaunch_equals_the_uninterrupted_sweep(
        tmp_path_factory, delay_s, sig):
    """Whenever the signal comes (start-up, training, writing, after the end), the launch ends with its code
    (or 0, done first), no traceback, the lock released; the same command then gives the uninterrupted results."""
    whole, cut = _whole(tmp_path_factory), tmp_path_factory.mktemp("cut")
    args = ["-m", *QUIET, *SHORT, "seed=0,1", f"hydra.sweep.dir={cut}"]
    p = start_launch(*args)
    # the moment is drawn; what is asserted holds at every moment from the interpreter's first line on (before
    # it, in its first ~50 ms, a signal has the operating system's default effect: nothing of ours has run)
    time.sleep(delay_s)
    if p.poll() is None:
        p.send_signal(sig)
    out, err = p.communicate(timeout=600)
    assert p.returncode in (0, CODES[sig]), err
    assert "Traceback" not in out + err, err
    assert not (cut / lock.LOCK).exists()
    again = launch(*args)
    assert again.returncode == 0, again.stderr
    for n in "01":
        a, b = (json.loads((d / n / "summary.json").read_text()) for d in (cut, whole))
        assert {k: v for k, v in a.items() if k not in LOCAL} == {k: v for k, v in b.items() if k not in LOCAL}
        for name in ("history.jsonl", "snapshots.jsonl"):
            assert (cut / n / name).read_bytes() == (whole / n / name).read_bytes(), name
