"""Sweeps on a real SLURM cluster (`make slurm-up`, or `.ci/run`): real sbatch, real job arrays, real
faults (`scontrol requeue`, a run that raises, `scancel`), real accounting.

Without a reachable cluster the cluster tests skip and say why, unless RW_REQUIRE_SLURM=1 (set by
`.ci/run`), which turns the skip into a failure. The sbatch-script and parsing tests need no cluster.
Every test that needs the cluster lives in this module (tests/conftest.py holds to it): `make test` keeps a
module on one worker, so they run one after another on the one-node cluster whose queue they read.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import LauncherTestSuite

from rw_sweeps.core import contract, store
from rw_sweeps.core.console import counted
from rw_sweeps.core.store import shard
from rw_sweeps.sweeps import status
from .conftest import SMALL, forget_version_base, launch, one_error_line, start_launch, status_cmd, steps_lasting, summaries, wait_until
from .wandb_files import read_run
from .test_store_trust import HANG_S, STORED, counts, records, shards

QUIET = [*SMALL, "wandb.mode=disabled"]
GRID16 = ["data.p=0,0.1,0.5,1", "init=zero,gaussian", "seed=0,1"]  # 16 runs


def _cluster_problem() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no SLURM client (sinfo/sbatch) on PATH: start a local cluster with `make slurm-up`"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%a %t"], capture_output=True, text=True, timeout=20)
    except subprocess.SubprocessError as exc:
        return f"SLURM did not answer (sinfo: {exc}): start a local cluster with `make slurm-up`"
    if r.returncode != 0:
        return f"the SLURM cluster is down (sinfo: {r.stderr.strip() or r.returncode}): `make slurm-up`"
    if not any(ln.split()[:1] == ["up"] and ln.split()[1].rstrip("*~#") in ("idle", "mix", "alloc", "comp")
               for ln in r.stdout.splitlines() if len(ln.split()) == 2):
        return f"no SLURM node is up and usable: sinfo says {r.stdout.strip()!r}"
    r = subprocess.run(["sacct", "-n", "-X", "-S", "now"], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        return f"SLURM accounting is off (sacct: {r.stderr.strip()})"
    return None


@pytest.fixture(scope="module")
def cluster():
    problem = _cluster_problem()
    if problem:
        if os.environ.get("RW_REQUIRE_SLURM") == "1":
            pytest.fail(f"RW_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


@pytest.fixture
def sweep_dir(tmp_path, cluster):
    """A sweep folder; whatever the test leaves queued or running there is cancelled afterwards."""
    yield tmp_path / "sweep"
    for rec in tmp_path.rglob(status.STATE):
        arrays = json.loads(rec.read_text()).get("arrays", [])
        if arrays:
            subprocess.run(["scancel", *arrays], capture_output=True)


def record(sweep: Path) -> dict:
    return json.loads((sweep / status.STATE).read_text())


def sacct(arrays: list[str], *fields: str, duplicates: bool = False) -> dict[str, list[str]]:
    """Job id → the requested sacct fields (job steps left out); every record with `duplicates`."""
    cmd = ["sacct", "-j", ",".join(arrays), "--parsable2", "-n", "-o", ",".join(["JobID", *fields])]
    out = subprocess.run(cmd + (["-D"] if duplicates else []), capture_output=True, text=True, check=True).stdout
    rows = [ln.split("|") for ln in out.splitlines() if ln and "." not in ln.split("|")[0]]
    if duplicates:
        res: dict[str, list[str]] = {}
        for r in rows:
            res.setdefault(r[0], []).append(r[1])
        return res
    return {r[0]: r[1:] for r in rows}


def line(sweep: Path, n: int, done: int, skipped: int, failed: int, diverged: int) -> str:
    return f"sweep {sweep}: {counted(n, 'run')}: {done} done, {skipped} skipped, {failed} failed, {diverged} diverged"


# ------------------------------------------------------------------------------------------ (a)
@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The 16-run grid trained in this process (the laptop default): what every cluster run must equal."""
    sweep = tmp_path_factory.mktemp("ref") / "sweep"
    r = launch("-m", *GRID16, *QUIET, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    return {(s["p"], s["init"], s["seed"]): s for s in summaries(sweep).values()}


@pytest.mark.slurm
@pytest.mark.parametrize("preset", ["slurm", "packed_slurm"])
def test_a_16_run_sweep_through_slurm_gives_every_run_its_results(preset, sweep_dir, local_reference, capsys):
    extra = ["hydra.launcher.max_runs_per_job=2"] if preset == "packed_slurm" else [
        # what a user asks of the `slurm` preset, with values this one-node cluster accepts (see also (e))
        "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=7", "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=1", "hydra.launcher.array_parallelism=2",
        "hydra.launcher.setup=[echo rw-setup-ran]", "+hydra.launcher.additional_parameters.comment=rw-test"]
    t0 = time.monotonic()
    r = launch("-m", f"hydra/launcher={preset}", *extra, *GRID16, *QUIET, "hydra.launcher.poll_s=2",
               f"hydra.sweep.dir={sweep_dir}")
    wall = time.monotonic() - t0
    with capsys.disabled():
        print(f"\n[timing] 16-run sweep through hydra/launcher={preset}: {wall:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == line(sweep_dir, 16, 16, 0, 0, 0)

    runs = summaries(sweep_dir)
    assert sorted(runs, key=int) == [str(i) for i in range(16)]
    for name, s in runs.items():
        assert s["status"] == "done" and s["error"] is None and s["steps"] == 10
        ref = local_reference[(s["p"], s["init"], s["seed"])]
        for k in ("test_acc", "train_loss", "test_loss", "parent_attention", "test_kl", "attention_spread"):
            assert abs(s[k] - ref[k]) <= 1e-8, (name, k, s[k], ref[k])
        assert s["symmetry_break_step"] == ref["symmetry_break_step"]
        assert (sweep_dir / name / "history.jsonl").read_text().count("\n") == 11
        assert not (sweep_dir / name / "checkpoint.pt").exists()
    zero = {(s["p"], s["seed"]): s for s in runs.values() if s["init"] == "zero"}
    assert zero[(1.0, 0)]["attention_spread"] == 0.0 and zero[(0.5, 0)]["parent_attention"] > 0.99

    rec = record(sweep_dir)
    n_jobs = 16 if preset == "slurm" else 8
    assert len(rec["jobs"]) == n_jobs and len(rec["arrays"]) == 1
    assert sorted(len(v) for v in rec["jobs"].values()) == [16 // n_jobs] * n_jobs
    states = sacct(rec["arrays"], "State")
    assert sorted(states) == sorted(rec["jobs"]) and all(v == ["COMPLETED"] for v in states.values()), states
    for job, names in rec["jobs"].items():  # every array task trained its own runs
        out = next((sweep_dir / ".submitit" / job).glob("*_log.out")).read_text()
        assert out.count("done: p=") == len(names)
        if preset == "slurm":
            assert "rw-setup-ran" in out  # the setup line ran in the job
    if preset == "slurm":  # (e) what SLURM itself recorded for the jobs
        acct = sacct(rec["arrays"], "Partition", "Timelimit", "ReqCPUS")
        assert all(v == ["debug", "00:07:00", "1"] for v in acct.values()), acct
        script = next((sweep_dir / ".submitit").glob("*/*_submission.sh")).read_text()
        for flag in ("--partition=debug", "--time=7", "--cpus-per-task=1", "--mem=1GB", "--array=0-15%2",
                     "--comment=rw-test", "--requeue"):
            assert f"#SBATCH {flag}\n" in script, flag


# ------------------------------------------------------------------------------------------ (b)
@pytest.mark.slurm
def test_b_a_requeued_job_resumes_from_its_checkpoint_and_ends_as_if_uninterrupted(sweep_dir, tmp_path, capsys):
    # long enough to be caught mid-run: SLURM sends SIGTERM (which submitit ignores), then SIGKILL KillWait
    # (5 s here) later, so the run must still be training then
    steps = steps_lasting(15, lo=400)
    args = ["data.p=0.5", "data.n_train=1000", "data.n_test=200", f"optim.steps={steps}",
            f"checkpoint_every={max(1, steps // 50)}", "wandb.mode=offline"]
    t0 = time.monotonic()
    ref = start_launch("-m", *args, f"hydra.sweep.dir={tmp_path / 'ref'}")  # uninterrupted, in this process
    job = start_launch("-m", "hydra/launcher=slurm", *args, "hydra.launcher.poll_s=1", f"hydra.sweep.dir={sweep_dir}")
    run_dir = sweep_dir / "0"
    wait_until(lambda: (run_dir / "checkpoint.pt").exists(), 120, "the SLURM job's first checkpoint")
    job_id = next(iter(record(sweep_dir)["jobs"]))
    # Freeze the job (SIGSTOP) while we look, so it cannot finish before we requeue it: the first checkpoint
    # comes at 2 % of a ≥ 15 s run; SLURM will not requeue a suspended job, so it is resumed just before.
    subprocess.run(["scontrol", "suspend", job_id], check=True, capture_output=True)
    assert not (run_dir / "summary.json").exists(), "the run ended before its job was suspended"
    subprocess.run(["scontrol", "resume", job_id], check=True, capture_output=True)
    subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True)
    out, err = job.communicate(timeout=600)
    wall = time.monotonic() - t0
    with capsys.disabled():
        print(f"\n[timing] requeue test ({steps} steps, requeued once): {wall:.1f} s")
    assert ref.wait(timeout=600) == 0
    assert job.returncode == 0, out + err
    assert out.strip().splitlines()[-1] == line(sweep_dir, 1, 1, 0, 0, 0)

    # it really was requeued, and the second start continued from a checkpoint mid-run
    records = sacct([job_id.split("_")[0]], "State", duplicates=True)[job_id]
    assert records[0] == "REQUEUED" and records[-1] == "COMPLETED", records
    log = next((sweep_dir / ".submitit" / job_id).glob("*_log.out")).read_text()
    assert log.count("Starting with JobEnvironment") == 2
    resumed = re.search(r"resuming .* from its checkpoint at step (\d+)", log)
    assert resumed, f"the second start did not resume from a checkpoint:\n{log}"
    step = int(resumed.group(1))
    assert 0 < step < steps, f"the run was not caught mid-run (resumed at step {step}): make it longer"

    # bit-identical to the uninterrupted run (CPU, float64): summary, history, snapshots
    a, b = summaries(tmp_path / "ref")["0"], summaries(sweep_dir)["0"]
    differ = {k for k in a if a[k] != b[k]}
    assert differ <= {"wall_s", "run_id"}, {k: (a[k], b[k]) for k in differ}
    for f in ("history.jsonl", "snapshots.jsonl"):
        assert (run_dir / f).read_text() == (tmp_path / "ref" / "0" / f).read_text(), f
    assert not (run_dir / "checkpoint.pt").exists()

    # one wandb run, with the run folder's id, holding every step exactly once
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
    wb = read_run(run_dir)
    assert wb["id"] == b["run_id"] and wb["summary"]["status"] == "done"
    assert sorted(h["step"] for h in wb["history"]) == list(range(steps + 1))
    assert wb["summary"]["test_acc"] == b["test_acc"]


# ------------------------------------------------------------------------------------------ (c)
@pytest.mark.slurm
def test_c_a_run_that_raises_is_failed_in_the_sweep_and_in_slurm(sweep_dir):
    # cuda:99 passes validation and fails at run time (no such device)
    r = launch("-m", "hydra/launcher=slurm", "device=cpu,cuda:99", *QUIET, "hydra.launcher.poll_s=1",
               f"hydra.sweep.dir={sweep_dir}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == line(sweep_dir, 2, 1, 0, 1, 0)
    runs = summaries(sweep_dir)
    assert runs["0"]["status"] == "done" and runs["0"]["test_acc"] > 0.3
    assert runs["1"]["status"] == "failed" and "cuda" in runs["1"]["error"].lower()
    assert f"failed {sweep_dir / '1'}: " in r.stderr  # and it says why
    rec = record(sweep_dir)
    by_run = {names[0]: job for job, names in rec["jobs"].items()}
    states = sacct(rec["arrays"], "State", "ExitCode")
    assert states[by_run["0"]] == ["COMPLETED", "0:0"]
    assert states[by_run["1"]][0] == "FAILED" and states[by_run["1"]][1] != "0:0", states

    # the status command reads the same thing from the folder and the accounting
    st = status_cmd(str(sweep_dir), "--wait", "--interval", "1")
    assert st.returncode == 1 and st.stdout.strip().splitlines()[-1] == line(sweep_dir, 2, 1, 0, 1, 0)
    assert "cuda" in st.stderr.lower()


@pytest.mark.slurm
def test_c_a_job_killed_without_writing_its_summary_makes_its_run_failed(sweep_dir):
    steps = steps_lasting(60, lo=1000)  # run 1 would train for a minute
    r = launch("-m", "hydra/launcher=slurm", "hydra.launcher.detach=true", f"optim.steps=10,{steps}",
               "data.n_test=200", f"checkpoint_every={steps // 100}", "wandb.mode=disabled",
               f"hydra.sweep.dir={sweep_dir}")
    assert r.returncode == 0, r.stderr
    long_job = next(job for job, names in record(sweep_dir)["jobs"].items() if names == ["1"])
    wait_until(lambda: (sweep_dir / "1" / "checkpoint.pt").exists(), 120, "the long run to train")
    subprocess.run(["scancel", long_job], check=True)
    st = status_cmd(str(sweep_dir), "--wait", "--interval", "1", "--grace", "2")
    assert st.returncode == 1, st.stderr
    assert st.stdout.strip().splitlines()[-1] == line(sweep_dir, 2, 1, 0, 1, 0)
    assert f"job {long_job} ended (CANCELLED) without writing this run's summary" in st.stderr
    assert not (sweep_dir / "1" / "summary.json").exists() and summaries(sweep_dir)["0"]["status"] == "done"


# ------------------------------------------------------------------------------------------ (d)
@pytest.mark.slurm
def test_d_a_detached_sweep_returns_at_once_and_status_follows_it_to_the_end(sweep_dir):
    steps = steps_lasting(3)
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.detach=true", "data.p=0.2,0.5,0.8", f"optim.steps={steps}",
            "data.n_test=200", f"checkpoint_every={max(1, steps // 10)}", "wandb.mode=disabled",
            f"hydra.sweep.dir={sweep_dir}"]
    r = launch(*args)
    returned = time.time()
    assert r.returncode == 0, r.stderr
    rec = record(sweep_dir)
    assert len(rec["jobs"]) == 3 and rec["detached"]
    assert f"sweep folder: {sweep_dir}" in r.stdout and f"{rec['arrays'][0]}_[0-2]" in r.stdout
    assert f"python -m rw_sweeps.sweeps.status {sweep_dir} --wait" in r.stdout
    assert not re.search(r"^sweep .*: \d+ runs: ", r.stdout, re.M)  # no summary line: nothing has ended
    assert len(summaries(sweep_dir)) < 3

    now = status_cmd(str(sweep_dir))
    assert now.returncode == 0 and re.search(r": 3 runs: \d done, 0 skipped, 0 failed, 0 diverged, \d running, "
                                             r"\d pending", now.stdout), now.stdout
    st = status_cmd(str(sweep_dir), "--wait", "--interval", "1")
    assert st.returncode == 0, st.stderr
    assert st.stdout.strip().splitlines()[-1] == line(sweep_dir, 3, 3, 0, 0, 0)
    assert "[status]" in st.stderr  # it showed progress on the way
    ended = max((sweep_dir / n / "summary.json").stat().st_mtime for n in ("0", "1", "2"))
    assert ended - returned > 3, "the detached launch did not return well before its jobs ended"
    assert all(s["status"] == "done" and s["steps"] == steps for s in summaries(sweep_dir).values())

    # the same command again: nothing to submit, and status says every run was skipped
    again = launch(*args)
    assert again.returncode == 0 and "submitted 0 run(s) (3 already done)" in again.stdout
    st = status_cmd(str(sweep_dir), "--wait", "--interval", "1")
    assert st.returncode == 0 and st.stdout.strip().splitlines()[-1] == line(sweep_dir, 3, 0, 3, 0, 0)


# ------------------------------------------------------------------------------------------ (e)
def dry_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return launch("-m", "hydra/launcher=slurm", "hydra.launcher.dry_run=true", "data.p=0.1,0.2,0.3", *QUIET,
                  f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides)


@pytest.mark.e2e
def test_e_the_sbatch_script_carries_what_the_user_asked_for(tmp_path):  # no cluster needed
    r = dry_run(tmp_path, "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=90",
                "hydra.launcher.cpus_per_task=4", "hydra.launcher.gres=gpu:1", "hydra.launcher.mem_gb=16",
                "hydra.launcher.array_parallelism=2", "hydra.launcher.account=lab", "hydra.launcher.qos=high",
                "hydra.launcher.max_array_size=1001",
                "hydra.launcher.setup=[module load cuda/12.4,source /opt/rw/.venv/bin/activate]",
                "+hydra.launcher.additional_parameters.constraint=a100")
    assert r.returncode == 0, r.stderr
    script = r.stdout[r.stdout.index("#!/bin/bash"):]
    flags = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    for flag in ("--partition=gpu", "--time=90", "--cpus-per-task=4", "--gres=gpu:1", "--mem=16GB",
                 "--array=0-2%2", "--account=lab", "--qos=high", "--constraint=a100", "--requeue",
                 "--signal=USR2@60", "--job-name=rw", "--nodes=1"):
        assert f"#SBATCH {flag}" in flags, flag
    assert not any("gpus-per-node" in f for f in flags)
    body = script.splitlines()
    srun = next(i for i, ln in enumerate(body) if ln.startswith("srun "))
    assert body.index("module load cuda/12.4") < body.index("source /opt/rw/.venv/bin/activate") < srun
    assert "-m submitit.core._submit" in body[srun]
    assert not (tmp_path / "sweep").exists()  # a dry run writes nothing and submits nothing

    # defaults of the preset, and the alternatives
    r = dry_run(tmp_path, "hydra.launcher.gpus_per_node=2", "+hydra.launcher.additional_parameters.requeue=false",
                "hydra.launcher.max_array_size=2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("#!/bin/bash") == 2 and "#SBATCH --array=0-1%2" in r.stdout  # 3 jobs, arrays of ≤ 2
    assert "#SBATCH --gpus-per-node=2" in r.stdout and "#SBATCH --no-requeue" in r.stdout
    assert "#SBATCH --requeue" not in r.stdout and "#SBATCH --time=60" in r.stdout
    assert "--cpus-per-task" not in r.stdout and "--partition" not in r.stdout  # SLURM's own defaults
    r = dry_run(tmp_path, "hydra.launcher.gpus_per_node=1", "hydra.launcher.gres=gpu:1")
    assert r.returncode != 0 and "set gres or gpus_per_node, not both" in r.stderr

    # the keys of hydra-submitit-launcher 1.2.0's submitit_slurm, with the same names and meanings
    r = dry_run(tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4", "hydra.launcher.name=myjob",
                "hydra.launcher.comment=note", "hydra.launcher.constraint=a100", "hydra.launcher.exclude=node7",
                "hydra.launcher.cpus_per_gpu=8", "hydra.launcher.gpus_per_task=1", "hydra.launcher.mem_per_gpu=40G",
                "hydra.launcher.stderr_to_stdout=true", "hydra.launcher.srun_args=['--cpu-bind=none']")
    assert r.returncode == 0, r.stderr
    for flag in ("--nodes=2", "--ntasks-per-node=4", "--job-name=myjob", "--comment=note", "--constraint=a100",
                 "--exclude=node7", "--cpus-per-gpu=8", "--gpus-per-task=1", "--mem-per-gpu=40G"):
        assert f"#SBATCH {flag}\n" in r.stdout, flag
    assert "--srun-args" not in r.stdout and "--cpu-bind=none" in r.stdout.split("srun ")[-1]  # srun's own flags
    assert "#SBATCH --error" not in r.stdout  # stderr goes to the job's stdout file
    r = dry_run(tmp_path, "hydra.launcher.mem_per_cpu=4G")
    assert r.returncode == 0 and "#SBATCH --mem-per-cpu=4G\n" in r.stdout
    r = dry_run(tmp_path, "hydra.launcher.reservation=lab")  # not a launcher key: one line that says where it goes
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "additional_parameters.reservation" in lines[0], r.stderr


# ------------------------------------------------------------------------------------------ (f)
@pytest.mark.slurm
def test_f_a_grid_larger_than_the_max_array_size_is_split_into_several_arrays(sweep_dir):
    r = launch("-m", "hydra/launcher=slurm", "hydra.launcher.max_array_size=3", "seed=range(0,7)", *QUIET,
               "hydra.launcher.poll_s=1", f"hydra.sweep.dir={sweep_dir}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == line(sweep_dir, 7, 7, 0, 0, 0)
    rec = record(sweep_dir)
    assert len(rec["arrays"]) == 3 and len(rec["jobs"]) == 7
    sizes = sorted(sum(1 for j in rec["jobs"] if j.split("_")[0] == a) for a in rec["arrays"])
    assert sizes == [1, 3, 3]
    scripts = sorted(p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_submission.sh"))
    assert sum("#SBATCH --array=0-2%3" in s for s in scripts) == 2
    assert all(v == ["COMPLETED"] for v in sacct(rec["arrays"], "State").values())
    assert sorted(s["seed"] for s in summaries(sweep_dir).values()) == list(range(7))
    assert all(s["status"] == "done" for s in summaries(sweep_dir).values())


# ------------------------------------------------------------------------------------------ parsing
def test_sacct_and_squeue_ids_are_expanded_to_array_tasks():  # no cluster needed
    text = "12_[3-5,8%2]|PENDING\n12_0|RUNNING\n12_0.batch|RUNNING\n12_1|CANCELLED by 0\n13|COMPLETED\n13.0|FAILED\n"
    assert status.parse_states(text) == {"12_3": "PENDING", "12_4": "PENDING", "12_5": "PENDING",
                                         "12_8": "PENDING", "12_0": "RUNNING", "12_1": "CANCELLED", "13": "COMPLETED"}


# ------------------------------------------------------------------------------------------ (g)
@pytest.mark.slurm
def test_g_an_adaptive_sweep_through_slurm_asks_the_points_it_asks_here(sweep_dir, tmp_path):
    """hydra/sweeper=adaptive on packed_slurm: every round one SLURM array, waited for; the same points and
    values as the same sweep trained in this process, and `rw-status` sees every round's runs."""
    args = ["-m", "hydra/sweeper=adaptive", "optim.lr=tag(log,interval(0.01,0.3))", "hydra.sweeper.n_points=6",
            "hydra.sweeper.batch=3", "optim.steps=5", "data.n_train=64", "data.n_test=64", "model.M=200",
            "wandb.mode=disabled"]
    here = tmp_path / "here"
    assert launch(*args, f"hydra.sweep.dir={here}").returncode == 0
    r = launch(*args, "hydra/launcher=packed_slurm", "hydra.launcher.poll_s=1", f"hydra.sweep.dir={sweep_dir}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "round 2: 3 points, 3 runs;" in r.stdout and line(sweep_dir, 6, 6, 0, 0, 0) in r.stdout
    points = lambda d: json.loads((d / "adaptive.json").read_text())["points"]  # noqa: E731
    assert points(sweep_dir) == points(here)
    rec = record(sweep_dir)
    assert len(rec["arrays"]) == 2 and len(rec["runs"]) == 6  # one array a round
    st = status_cmd(str(sweep_dir))
    assert "6 done" in st.stdout, st.stdout + st.stderr


# ------------------------------------------------------------------------------------------ usr2
@pytest.mark.slurm
@pytest.mark.usefixtures("cluster")
def test_on_slurm_usr2_checkpoints_every_run_before_the_requeue(tmp_path):
    sweep = tmp_path / "S"
    # submitted held (sbatch --hold), so the job trains only once this test has released it: what the test does
    # before then takes no time from the runs, whatever the machine's load
    args = ["-m", "hydra/launcher=packed_slurm", "hydra.launcher.detach=true", "data.n_test=100",
            "+hydra.launcher.additional_parameters.hold=true", "optim.steps=60000", "eval_every=1000", "seed=0,1",
            "wandb.mode=disabled", f"hydra.sweep.dir={sweep}"]
    r = launch(*args)
    assert r.returncode == 0, r.stderr
    try:
        # a detached sweep's lock belongs to its jobs, held ones too: a second launch names them
        job = next(iter(record(sweep)["jobs"]))
        r2 = launch(*args)
        assert r2.returncode == 2 and f"SLURM job(s) {job.split('_')[0]}" in one_error_line(r2)

        log = lambda: "\n".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.out"))  # noqa: E731
        held = subprocess.run(["squeue", "-h", "-j", job.split("_")[0], "-o", "%T %r"], capture_output=True, text=True)
        assert set(held.stdout.split("\n")) - {""} == {"PENDING JobHeldUser"}, held.stdout
        subprocess.run(["scontrol", "release", job.split("_")[0]], check=True, capture_output=True)
        wait_until(lambda: "training 2 run(s): step 0" in log(), 180, "the job's training to start")
        # the signal (what SLURM sends before a preemption or the time limit) lands as the 60,000 steps start;
        # SLURM forwards it to the job's step, where the training loop checkpoints and submitit requeues
        assert not (sweep / "0" / "summary.json").exists()
        subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
        wait_until(lambda: "from its checkpoint at step" in log(), 300, "the requeued job to resume")
        step = int(re.search(r"from its checkpoint at step (\d+)", log()).group(1))
        assert step > 0  # with checkpoint_every=0: the progress before the signal was kept
        wait_until(lambda: len(summaries(sweep)) == 2, 600, "the runs to end")
        assert all(s["status"] == "done" and s["steps"] == 60000 for s in summaries(sweep).values())
        assert "REQUEUED" in sacct([job.split("_")[0]], "State", duplicates=True)[job]
    finally:
        subprocess.run(["scancel", *record(sweep).get("arrays", [])], capture_output=True)


# ------------------------------------------------------------------------------------------ Hydra's suite
@pytest.mark.slurm
@pytest.mark.parametrize("launcher_name, overrides", [
    ("rw", ["hydra.launcher.backend=slurm", "hydra.launcher.pack=false", "hydra.launcher.timeout_min=5"]),
    ("rw", ["hydra.launcher.backend=slurm", "hydra.launcher.timeout_min=5"]),
], ids=["slurm", "packed_slurm"])
@pytest.mark.usefixtures("cluster")
class TestRwLauncherOnSlurm(LauncherTestSuite):
    """Hydra's own launcher test suite on the SLURM backend (a SLURM job per job); the other backends pass it in
    tests/test_hydra_citizen.py."""

    @pytest.fixture(autouse=True)
    def _unset_version_base(self):
        forget_version_base()


# ------------------------------------------------------------------------------ the sweep store on the cluster
# The array tasks of a packed store sweep are separate processes (separate nodes on a real cluster) writing into
# one store folder with no lock: each writes only files named by its own writer id, and the sweep's status and a
# relaunch read the shards of all of them as one sweep.
STORE_S = ["data.n_test=200", "optim.steps=10", "wandb.mode=disabled"]
STORE_GRID = ["data.p=0,0.1,0.5,1", "seed=0,1"]  # eight runs; STORED packs them two a job: four array tasks
STORE_RUNS = [str(i) for i in range(8)]
STORE_WRITER = re.compile(r"(w[0-9a-f]{12})[-.]")  # the writer id every store file's name starts with


def store_last_line(sweep, done: int, skipped: int) -> str:
    return f"sweep {sweep}: 8 runs: {done} done, {skipped} skipped, 0 failed, 0 diverged"


@pytest.mark.slurm
def test_a_store_sweep_on_packed_slurm_is_written_by_its_array_tasks_each_in_its_own_files(sweep_dir, tmp_path):
    args = ["-m", *STORE_GRID, *STORE_S, *STORED, "hydra/launcher=packed_slurm", "hydra.launcher.poll_s=1"]
    r = launch(*args, f"hydra.sweep.dir={sweep_dir}", timeout=HANG_S * 3)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == store_last_line(sweep_dir, 8, 0), r.stdout + r.stderr
    rec = record(sweep_dir)
    assert len(rec["arrays"]) == 1 and len(rec["jobs"]) == 4, rec["jobs"]
    states = sacct(rec["arrays"], "State")
    assert sorted(states) == sorted(rec["jobs"]) and all(v == ["COMPLETED"] for v in states.values()), states

    # every file of the store is named by one writer, and each writer is one array task that wrote its own runs
    folder = sweep_dir / store.STORE
    names = sorted(os.listdir(folder))
    by_writer: dict[str, list[str]] = {}
    for name in names:
        if name == store.shard.SWEEP_ID:
            continue
        m = STORE_WRITER.match(name)
        assert m, f"{name}: a store file no writer's id names"
        by_writer.setdefault(m.group(1), []).append(name)
    job_of = {}
    heads = store.index(sweep_dir).heads
    for writer in by_writer:  # each job's hydra.yaml is kept in its heads' metadata
        texts = {meta["hydra"] for sid, (_, meta) in heads.items() if sid.startswith(writer)}
        (job,) = {j for t in texts for j in re.findall(r"^    id: '?([0-9_]+)'?$", t, re.M)}
        job_of[writer] = job
    assert len(by_writer) >= 2 and sorted(job_of.values()) == sorted(rec["jobs"]), job_of  # one writer a task
    held = shards(sweep_dir)
    for writer, job in job_of.items():
        runs = sorted(r for sid, rs in held.items() if sid.startswith(writer) for r in rs)
        assert runs == sorted(rec["jobs"][job]), (writer, job, runs)
    assert not [n for n in names if n.endswith((shard.CHECKPOINT, ".tmp"))], names

    idx = store.index(sweep_dir)
    assert sorted(idx.runs) == STORE_RUNS and idx.refused == {} and idx.duplicates == {}
    assert all(contract.judge(sweep_dir / n).done for n in STORE_RUNS)
    st = status_cmd(str(sweep_dir))
    assert st.returncode == 0 and counts(st.stdout, sweep_dir) == dict(runs=8, done=8, skipped=0, failed=0,
                                                                        diverged=0), st.stdout + st.stderr

    # the same grid in this process: the same records, to the byte of every history and snapshot
    here = tmp_path / "here"
    assert launch("-m", *STORE_GRID, *STORE_S, *STORED, f"hydra.sweep.dir={here}", timeout=HANG_S).returncode == 0
    assert records(sweep_dir) == records(here)

    before = {n: (folder / n).read_bytes() for n in names}
    again = launch(*args, f"hydra.sweep.dir={sweep_dir}", timeout=HANG_S)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == store_last_line(sweep_dir, 0, 8), again.stdout
    assert {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))} == before  # nothing written
    st = status_cmd(str(sweep_dir))
    assert st.returncode == 0 and counts(st.stdout, sweep_dir) == dict(runs=8, done=0, skipped=8, failed=0,
                                                                        diverged=0), st.stdout + st.stderr
