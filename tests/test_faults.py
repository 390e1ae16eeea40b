"""Nothing a user types, a disk holds or a cluster does loses a result or runs a stranger's code.

Each test reproduces one fault the way it happens (real processes for kills, Ctrl-C, two launches, SLURM's
USR2) and checks what a user now sees. `L` below is the issue's small sweep.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rw_sweeps.core import fused
from rw_sweeps.sweeps import lock
from .conftest import launch, one_error_line, start_launch, wait_for_training, wait_for_work, wait_until
from .test_config import checked

L = ["model.M=200", "data.n_train=200", "data.n_test=200", "optim.steps=20", "wandb.mode=disabled"]
FIVE = ["seed=range(0,5)"]


def summaries(sweep: Path) -> dict[str, dict]:
    """The run folders' summaries (a directory planted at a summary's place is no summary)."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(sweep).glob("*/summary.json")) if p.is_file()}


def sweep_line(r: subprocess.CompletedProcess) -> str:
    return r.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------- isolation, resume
@pytest.mark.e2e
@pytest.mark.parametrize("culprit", ["2/summary.json", "3/history.jsonl"])
def test_an_unwritable_run_folder_fails_only_its_own_run(tmp_path, culprit):
    sweep = tmp_path / "S"
    assert launch("-m", *L, "seed=0", f"hydra.sweep.dir={sweep}").returncode == 0  # a sweep of ours, shared
    (sweep / culprit).mkdir(parents=True)  # a directory where a result file must go (planted by a co-worker)
    for _ in range(2):  # and again: the others stay done, the culprit fails again with its own message
        r = launch("-m", *L, *FIVE, f"hydra.sweep.dir={sweep}")
        assert r.returncode == 1
        runs = summaries(sweep)
        bad = culprit.split("/")[0]
        assert {n: s["status"] for n, s in runs.items() if n != bad} == {n: "done" for n in "01234" if n != bad}
        assert f"failed {sweep / bad}: " in r.stderr and culprit.split("/")[1] in r.stderr
        assert r.stderr.count("failed /") == 1


@pytest.mark.e2e
def test_a_file_where_a_run_folder_must_go_fails_only_that_run(tmp_path):
    sweep = tmp_path / "S"
    assert launch("-m", *L, "seed=0", f"hydra.sweep.dir={sweep}").returncode == 0  # a sweep of ours, shared
    (sweep / "2").write_text("x")
    r = launch("-m", *L, *FIVE, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert sweep_line(r) == f"sweep {sweep}: 5 runs: 3 done, 1 skipped, 1 failed, 0 diverged"
    assert f"failed {sweep / '2'}: " in r.stderr and "Not a directory" in r.stderr


@pytest.mark.e2e
def test_damaged_or_incomplete_folders_are_retrained_and_counted_corrupt(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", *L, "seed=range(0,9)", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    good = summaries(sweep)
    (sweep / "5" / "config.yaml").write_bytes(b"x\xff")       # not UTF-8
    (sweep / "7" / "config.yaml").write_text("hello\n")       # not a mapping
    (sweep / "8" / "summary.json").write_text("[1,2]\n")      # not an object
    (sweep / "4" / "history.jsonl").unlink()                  # a contract file missing
    (sweep / "6" / "snapshots.jsonl").write_text("garbage\n")  # a contract file that does not parse
    cfg = (sweep / "3" / "config.yaml").read_text()
    (sweep / "3" / "config.yaml").write_text(cfg.replace("seed: 3", "seed: three"))  # ill-typed

    from analysis import load_runs

    df = load_runs([sweep], cache=False)  # never crashes: the damaged folders are corrupt, not rows
    corrupt = {Path(s["path"]).name for s in df.attrs["skipped"] if s["status"] == "corrupt"}
    assert {"3", "4", "5", "7", "8"} <= corrupt and len(df) == 9 - len(corrupt)

    r = launch("-m", *L, "seed=range(0,9)", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert sweep_line(r) == f"sweep {sweep}: 9 runs: 6 done, 3 skipped, 0 failed, 0 diverged"
    again = summaries(sweep)
    for n in "345678":  # retrained to the very same numbers
        assert again[n]["status"] == "done" and again[n]["test_acc"] == good[n]["test_acc"], n
    assert len(load_runs([sweep], cache=False)) == 9


@pytest.mark.e2e
def test_a_second_launch_into_a_busy_sweep_folder_refuses_in_one_line_or_waits(tmp_path):
    sweep = tmp_path / "S"
    first = start_launch("-m", "data.n_test=100", "optim.steps=200000", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}")
    try:
        wait_until(lambda: (sweep / lock.LOCK).exists(), 120, "the first launch to take the lock")
        r = launch("-m", "data.n_test=100", "optim.steps=19", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}")
        assert r.returncode == 2
        line = one_error_line(r)
        assert f"is in use by pid {first.pid}" in line and "wait_for_lock=true" in line
        assert not (sweep / "0" / "summary.json").exists()
        waiting = start_launch("-m", "data.n_test=100", "optim.steps=19", "wandb.mode=disabled",
                               "hydra.launcher.wait_for_lock=true", f"hydra.sweep.dir={sweep}")
        time.sleep(1)
        assert waiting.poll() is None  # it waits…
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 130
        out, err = waiting.communicate(timeout=300)  # …and runs once the first is gone
        assert waiting.returncode == 0, err
        assert summaries(sweep)["0"]["steps"] == 19
    finally:
        first.kill()
    assert not (sweep / lock.LOCK).exists()  # released at exit


@pytest.mark.e2e
def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    sweep = tmp_path / "S"
    sweep.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (sweep / lock.LOCK).write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid, "since": 0, "arrays": []}))
    r = launch("-m", *L, "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr


def _interrupt(tmp_path: Path, sig: int, extra: list[str]) -> tuple[Path, subprocess.Popen, list[str]]:
    sweep = tmp_path / "S"
    args = ["-m", "data.n_test=100", "optim.steps=100000", "eval_every=1000", "wandb.mode=disabled", *extra,
            f"hydra.sweep.dir={sweep}"]
    p = start_launch(*args)
    wait_for_training(p)  # a 100,000-step run lasts far longer than this test waits
    # half a CPU second of training is hundreds of steps of this shape, on a loaded machine as on an idle one
    wait_for_work(p.pid, 0.5, what="the runs to take steps")
    p.send_signal(sig)
    return sweep, p, args


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_sweep_checkpoints_every_run_and_resumes_from_there(tmp_path, sig):
    sweep, p, args = _interrupt(tmp_path, sig, ["seed=0,1"])  # checkpoint_every=0, the default
    out, err = p.communicate(timeout=120)
    # one line, exit 130 (Ctrl-C) or 143 (SIGTERM): the same path (rw_sweeps/sweeps/signals.py)
    code, word = (130, "interrupted") if sig == signal.SIGINT else (143, "stopped by SIGTERM")
    assert p.returncode == code and "Traceback" not in err, err[-2000:]
    assert [ln for ln in err.splitlines() if ln.strip()][-1].startswith(f"{word}: finished runs are kept")
    assert not (sweep / ".rw_lock").exists()
    import torch

    steps = [torch.load(sweep / n / "checkpoint.pt", weights_only=False)["state"]["step"] for n in "01"]
    assert all(s > 0 for s in steps), steps  # progress kept: at most one step lost per run
    assert not list(sweep.glob("*/summary.json"))  # and nothing is falsely finished


@pytest.mark.e2e
def test_ctrl_c_keeps_the_runs_of_a_chunk_whose_results_were_being_written_behind(tmp_path):
    """Chunk 1 (two short runs) ends, and its results go to the writer thread while chunk 2 trains; Ctrl-C
    in chunk 2 still leaves chunk 1's runs done on disk, and chunk 2's checkpointed."""
    sweep = tmp_path / "S"
    p = start_launch("-m", "optim.steps=10,100000", "seed=0,1", "data.n_test=100", "eval_every=1000",
                     "wandb.mode=disabled", "hydra.launcher.write_behind=true", f"hydra.sweep.dir={sweep}")
    line = wait_until(lambda: p.stdout.readline() if p.poll() is None else "gone", 120, "the launch to start")
    while not line.startswith("job 2/2"):
        line = p.stdout.readline()
        assert line, p.stderr.read()
    wait_for_work(p.pid, 0.5, what="chunk 2 to take steps")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    done = summaries(sweep)
    assert sorted(done) == ["0", "1"] and all(s["status"] == "done" and s["steps"] == 10 for s in done.values())
    assert all((sweep / n / "checkpoint.pt").exists() for n in "23")


@pytest.mark.e2e
def test_resumed_runs_continue_from_the_signal_checkpoint_bit_for_bit(tmp_path):
    sweep, p, args = _interrupt(tmp_path, signal.SIGINT, ["optim.steps=100000"])
    p.communicate(timeout=120)
    import torch

    blob = torch.load(sweep / "0" / "checkpoint.pt", weights_only=False)
    step = blob["state"]["step"]
    assert 0 < step < 100000
    # Resume that run with the same config; it must go on from `step`, not from 0 (the log says so), and
    # its history up to `step` is the checkpoint's.
    p2 = start_launch(*args)
    line = ""
    while "resuming" not in line:
        line = p2.stdout.readline()
        assert line, p2.stderr.read()
    assert f"from its checkpoint at step {step}" in line
    p2.send_signal(signal.SIGINT)
    p2.communicate(timeout=120)
    assert torch.load(sweep / "0" / "checkpoint.pt", weights_only=False)["state"]["step"] >= step


@pytest.mark.e2e
def test_a_resumed_run_keeps_one_offline_wandb_run(tmp_path):
    sweep = tmp_path / "S"
    args = ["-m", *L[:-1], "wandb.mode=offline", "seed=0", f"hydra.sweep.dir={sweep}"]
    assert launch(*args).returncode == 0
    first = list((sweep / "0" / "wandb").glob("offline-run-*"))
    assert len(first) == 1
    (sweep / "0" / "summary.json").unlink()  # as if the job had been killed after logging
    partial = first[0].with_name(first[0].name.replace(first[0].name[12:27], "19990101_000000"))
    shutil.copytree(first[0], partial)  # and an older partial attempt under the same id
    assert launch(*args).returncode == 0
    runs = list((sweep / "0" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(summaries(sweep)["0"]["run_id"])


@pytest.mark.e2e
def test_packed_wandb_jobs_keep_their_artifacts_inside_the_sweep_folder(tmp_path):
    sweep = tmp_path / "S"
    home = tmp_path / "home"
    r = launch("-m", *L[:-1], "wandb.mode=offline", "wandb.granularity=job", "seed=0,1", f"hydra.sweep.dir={sweep}",
               env={"HOME": str(home), "XDG_DATA_HOME": str(home / "data")})
    assert r.returncode == 0, r.stderr
    assert list((sweep / "wandb_jobs").glob("*/history.parquet"))
    assert not list(home.rglob("staging/*"))  # nothing staged outside the sweep folder


@pytest.mark.e2e
def test_a_diverged_run_reports_its_last_finite_evaluation(tmp_path):
    r = launch("init=gaussian", "init.sigma=0.01", "optim.lr=1e200", "data.n_test=100", "optim.steps=5",
               "wandb.mode=disabled", f"hydra.run.dir={tmp_path / 'r'}")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    first = json.loads((tmp_path / "r" / "history.jsonl").read_text().splitlines()[0])
    assert s["status"] == "diverged" and s["eval_step"] == 0 and s["steps"] == 1
    for k in ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention", "pred_dist"):
        assert s[k] == first[k] and s[k] is not None, k  # all from one evaluation, none left null


# ------------------------------------------------------------------------------------- validation gaps
@pytest.mark.parametrize("override,key,rule", [
    ("optim.eps=inf", "optim.eps", "finite"), ("optim.lr=inf", "optim.lr", "finite"),
    ("init=gaussian init.sigma=inf", "init.sigma", "finite"), ("init=gaussian init.sigma=nan", "init.sigma", "finite"),
    ("model.pos_scale=inf", "model.pos_scale", "finite"), ("seed=-1", "seed", "[0, 4294967295]"),
    ("seed=100000000000000000000", "seed", "[0, 4294967295]"), ("seed=18446744073709551616", "seed", "[0, "),
    ("~data", "data", "required config group"), ("~seed", "seed", "cannot be removed"), ("+foo=1", "foo", "unknown key"),
])
def test_bad_values_are_one_line(override, key, rule):
    from rw_sweeps.core.config import ConfigError

    for args in (override.split(), ["-m", "seed=0,1", *override.split()]):
        with pytest.raises(ConfigError) as err:
            checked(*args)
        assert key in str(err.value) and rule in str(err.value)


@pytest.mark.parametrize("override,key", [("device=cuda:9", "device"), ("data.K=100000", "data.K"),
                                          ("data.n_train=1000000000", "data.n_train")])
@pytest.mark.e2e
def test_runs_that_cannot_work_here_are_one_line_before_anything_is_written(tmp_path, override, key):
    import torch

    if override.startswith("device") and torch.cuda.device_count() > 9:
        pytest.skip("this machine has a tenth GPU")
    for mode in (["hydra.run.dir=" + str(tmp_path / "r")], ["-m", "seed=0,1", "hydra.sweep.dir=" + str(tmp_path / "s")]):
        r = launch(*mode, override, cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        line = one_error_line(r)
        # data.K=100000: the planner finds first that its snapshot lines would exceed their reader's cap
        assert f"invalid config: {key}=" in line and ("GB" in line or "GPU" in line or "its reader allows" in line), line
        assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


@pytest.mark.e2e
def test_plus_key_in_a_single_run_writes_nothing(tmp_path):
    r = launch("+foo=1", cwd=tmp_path)
    assert r.returncode == 2 and "foo" in one_error_line(r) and not (tmp_path / "outputs").exists()


@pytest.mark.e2e
def test_long_runs_print_progress_lines_without_a_terminal(tmp_path):
    r = launch("data.n_test=100", "optim.steps=3000", "wandb.mode=disabled", f"hydra.run.dir={tmp_path / 'r'}",
               env={"RW_SWEEPS_PROGRESS_S": "0.05"})
    assert r.returncode == 0, r.stderr
    ticks = [ln for ln in r.stdout.splitlines() if ln.startswith("training 1 run(s): step ") and "left" in ln]
    assert len(ticks) >= 2, r.stdout


# ------------------------------------------------------------------------------------- security
@pytest.mark.parametrize("override", [
    "hydra.launcher.partition='gpu\ntouch {pwned} #'", "hydra.launcher.gres='gpu:1\ntouch {pwned}'",
    "+hydra.launcher.additional_parameters.comment='x\ntouch {pwned}'", "hydra.job.name='job\ntouch {pwned}'",
    "hydra.sweep.dir='{tmp}/s\ntouch {pwned}'", "hydra.launcher.partition='gpu;touch {pwned}'",
])
@pytest.mark.e2e
def test_no_value_smuggles_a_command_into_an_sbatch_script(tmp_path, override):
    pwned = tmp_path / "pwned"
    r = launch("-m", "hydra/launcher=packed_slurm", "hydra.launcher.dry_run=true",
               override.format(pwned=pwned, tmp=tmp_path), *L, f"hydra.sweep.dir={tmp_path / 's'}"
               if "sweep.dir" not in override else "seed=0", cwd=tmp_path)
    assert r.returncode == 2 and "#!/bin/bash" not in r.stdout
    assert "invalid config: hydra." in one_error_line(r)
    assert not pwned.exists()


def test_the_kernel_is_never_loaded_from_a_folder_others_can_write(tmp_path, monkeypatch):
    if not fused.available():
        pytest.skip(f"no compiled kernel here: {fused.last_error()}")
    cc = shutil.which(fused.CC)
    version = fused._compiler_version(cc)
    flags = fused.VARIANTS[fused.isa_variant()][0]
    own = tmp_path / "own"
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(own))
    name = fused._build(cc, flags, version).name  # the file name the kernel would be loaded from
    # A cache folder others can write to, holding a planted library under that name: not loaded.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / name).write_bytes(b"planted")
    monkeypatch.setenv("RW_SWEEPS_CACHE", str(shared))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    # …and the per-user temp folder already made, world-writable, by someone else, with the same plant
    planted = tmp_path / "tmp" / f"rw_sweeps-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / name).write_bytes(b"planted")
    got = fused._build(cc, flags, version)
    assert got.read_bytes() != b"planted" and got.parent not in (shared, planted)
    st = os.stat(got.parent)
    assert st.st_uid == os.getuid() and not st.st_mode & 0o022
