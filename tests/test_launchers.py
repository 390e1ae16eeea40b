"""The local launchers under real faults (no cluster needed): a sweep killed with SIGKILL and run again,
a run resumed from its checkpoint, `local_gpus` on a machine without a GPU, packed runs against unpacked."""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import torch

from .conftest import SMALL, launch, start_launch, status_cmd, steps_lasting, summaries, wait_until

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

QUIET = [*SMALL, "wandb.mode=disabled"]


def files_of(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """The run's result files (its Hydra job log is appended to by every launch, as Hydra does)."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run_dir.iterdir())
            if p.is_file() and p.suffix != ".log"}


@pytest.mark.parametrize("launcher", [["hydra/launcher=local"], ["hydra/launcher=packed", "hydra.launcher.max_runs_per_job=1"]],
                         ids=["local", "packed"])
def test_a_sweep_killed_with_sigkill_is_completed_by_running_it_again(launcher, tmp_path):
    sweep = tmp_path / "sweep"
    steps = steps_lasting(1.5)  # each run: time enough to be killed in the middle of the second one
    args = ["-m", *launcher, "data.p=0.2,0.4,0.6,0.8", "data.n_test=200", f"optim.steps={steps}",
            "wandb.mode=disabled", f"hydra.sweep.dir={sweep}"]
    proc = start_launch(*args)
    wait_until(lambda: list(sweep.glob("*/summary.json")) or proc.poll() is not None, 120, "the first run to end")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the sweep ended before it could be killed: make its runs longer"
    finished = {p.parent.name: files_of(p.parent) for p in sweep.glob("*/summary.json")}
    assert 1 <= len(finished) < 4

    if launcher[0] == "hydra/launcher=packed":  # the status command sees the dead sweep for what it is
        st = status_cmd(str(sweep))
        assert st.returncode == 1
        assert f"4 runs: {len(finished)} done, 0 skipped, {4 - len(finished)} failed, 0 diverged" in st.stdout
    r = launch(*args)
    assert r.returncode == 0, r.stderr
    k = len(finished)
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 4 runs: {4 - k} done, {k} skipped, 0 failed, 0 diverged"
    for name, files in finished.items():
        assert files_of(sweep / name) == files  # untouched: same bytes, same mtimes
    runs = summaries(sweep)
    assert sorted(s["p"] for s in runs.values()) == [0.2, 0.4, 0.6, 0.8]
    assert all(s["status"] == "done" and s["steps"] == steps for s in runs.values())


def test_a_run_killed_mid_way_resumes_from_its_checkpoint_and_ends_as_if_uninterrupted(tmp_path):
    steps = steps_lasting(4, lo=50)
    args = ["data.p=0.3", "init=gaussian", "data.n_test=200", f"optim.steps={steps}",
            f"checkpoint_every={max(1, steps // 30)}", "wandb.mode=disabled"]
    ref = start_launch("-m", *args, f"hydra.sweep.dir={tmp_path / 'ref'}")  # uninterrupted, meanwhile
    sweep = tmp_path / "sweep"
    proc = start_launch("-m", *args, f"hydra.sweep.dir={sweep}")
    wait_until(lambda: (sweep / "0" / "checkpoint.pt").exists(), 120, "the first checkpoint")
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (sweep / "0" / "summary.json").exists(), "the run ended before it could be killed: make it longer"

    r = launch("-m", *args, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    resumed = re.search(r"resuming .* from its checkpoint at step (\d+)", r.stdout)
    assert resumed, r.stdout
    assert 0 < int(resumed.group(1)) < steps
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 1 run: 1 done, 0 skipped, 0 failed, 0 diverged"
    assert ref.wait(timeout=300) == 0
    a, b = summaries(tmp_path / "ref")["0"], summaries(sweep)["0"]
    differ = {k for k in a if a[k] != b[k]}
    assert differ <= {"wall_s", "run_id"}, {k: (a[k], b[k]) for k in differ}  # bit-identical on CPU
    for f in ("history.jsonl", "snapshots.jsonl"):
        assert (sweep / "0" / f).read_text() == (tmp_path / "ref" / "0" / f).read_text(), f
    assert not (sweep / "0" / "checkpoint.pt").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CPU fallback is not exercised")
def test_local_gpus_without_a_gpu_runs_the_jobs_on_the_cpu_and_says_so(tmp_path):
    sweep = tmp_path / "sweep"
    r = launch("-m", "hydra/launcher=local_gpus", "data.p=0.2,0.8", *QUIET, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert "local_gpus: no GPU visible: running the jobs on the CPU" in r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 2 done, 0 skipped, 0 failed, 0 diverged"
    runs = summaries(sweep)
    assert all(s["status"] == "done" for s in runs.values()) and runs["1"]["test_acc"] > 0.7
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))  # each run was its own submitit job
    assert len(logs) == 2 and all("done: p=" in p.read_text() for p in logs)
