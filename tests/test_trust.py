"""Trust: no wrong number marked done, no finished run overwritten, no planted file obeyed.

Each test plays a hostile but fair user of a shared sweep folder (or an unlucky one: a kill at the wrong
step, a grid that grows, a disk that fills) and checks what they then find. Real processes wherever a
process boundary matters; `S` is a small sweep.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rw_sweeps.sweeps import lock, run
from rw_sweeps.core import results
from rw_sweeps.core.config import RunConfig, data_config, validate, option_config
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.optimisers.gd import Gd
from rw_sweeps.core.optimisers.adam import Adam

from .conftest import launch, one_error_line, python, start_launch, summaries, wait_until

S = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled"]


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under a folder, by relative path (what a user could compare)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ resume at any step
class Interrupted(BaseException):
    """A kill right after a checkpoint (a BaseException: nothing in the run path may catch it)."""


RESULT_FIELDS_THAT_VARY = ("wall_s",)


def _resume_cfg(backend_opt: str) -> RunConfig:
    optim = Adam(name="adam", lr=0.01, steps=300) if backend_opt == "adam" else Gd(lr=1.0, steps=300)
    return validate(RunConfig(data=data_config(K=5, N=21, p=0.7, n_train=60, n_test=40), model=ModelConfig(M=64),
                              optim=optim, eval_every=100, checkpoint_every=30, snapshot_steps=[0, 100, 200],
                              seed=3, wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))


@pytest.mark.parametrize("path", ["fused", "torch", "adam"])
@pytest.mark.parametrize("kill_after", [90, 150, 300])
def test_a_run_resumed_from_a_checkpoint_off_the_evaluation_grid_equals_an_uninterrupted_one(
        tmp_path, monkeypatch, path, kill_after):
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch" if path == "torch" else "auto")
    cfg = _resume_cfg(path)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run.execute([cfg], [whole], progress=False)
    save = results.save_checkpoint

    def save_then_die(run_dir, blob):
        save(run_dir, blob)
        if blob["state"]["step"] == kill_after:
            raise Interrupted

    monkeypatch.setattr(results, "save_checkpoint", save_then_die)
    with pytest.raises(Interrupted):
        run.execute([cfg], [resumed], progress=False)
    monkeypatch.setattr(results, "save_checkpoint", save)
    assert results.load_checkpoint(cfg.to_dict(), resumed)["state"]["step"] == kill_after
    run.execute([cfg], [resumed], progress=False)
    a, b = results.read_summary(whole), results.read_summary(resumed)
    assert a["status"] == b["status"] == "done" and b["eval_step"] == 300 and b["parents_attention"] is not None
    for k in set(a) - {"wall_s", "run_id"}:
        assert a[k] == b[k], k
    for name in ("history.jsonl", "snapshots.jsonl", "config.yaml"):
        assert (whole / name).read_bytes() == (resumed / name).read_bytes(), name
    assert [json.loads(r)["step"] for r in (resumed / "history.jsonl").read_text().splitlines()] == [0, 100, 200, 300]
    assert not (resumed / results.CHECKPOINT).exists()


# ------------------------------------------------------------------------------ a finished run is kept
@pytest.mark.e2e
def test_a_grown_grid_keeps_every_finished_folder_and_trains_only_the_new_runs(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", *S, "data.p=0,0.5", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    before = {n: (sweep / n / "summary.json").read_bytes() for n in "0123"}
    r = launch("-m", *S, "data.p=0,0.1,0.5", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 6 runs: 2 done, 4 skipped, 0 failed, 0 diverged"
    after = summaries(sweep)
    assert {n: (sweep / n / "summary.json").read_bytes() for n in "0123"} == before  # not one byte changed
    assert {(s["p"], s["seed"]) for s in after.values()} == {(p, s) for p in (0, 0.1, 0.5) for s in (0, 1)}
    assert {(after[n]["p"], after[n]["seed"]) for n in ("4", "5")} == {(0.1, 0), (0.1, 1)}
    for n in ("4", "5"):  # the new runs' Hydra files name their own folder and number
        hydra = (sweep / n / ".hydra" / "hydra.yaml").read_text()
        assert f"num: {n}\n" in hydra and f"output_dir: {sweep / n}\n" in hydra


@pytest.mark.e2e
def test_a_changed_value_is_refused_in_one_line_naming_the_folder_and_key_unless_overwrite(tmp_path):
    sweep = tmp_path / "S"
    assert launch("-m", *S, "seed=0,1", f"hydra.sweep.dir={sweep}").returncode == 0
    files = tree(sweep)
    r = launch("-m", *S[:-2], "optim.steps=10", "wandb.mode=disabled", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2
    line = one_error_line(r)
    assert f"{sweep / '0'} holds a run of another config" in line and "optim.steps=5 there, 10 here" in line
    assert "; to continue it, add optim.steps=5; add hydra.launcher.overwrite=true" in line  # both ways out
    assert tree(sweep) == files  # nothing written, multirun.yaml included
    r = launch("-m", *S[:-2], "optim.steps=10", "wandb.mode=disabled", "seed=0,1", f"hydra.sweep.dir={sweep}",
               "hydra.launcher.overwrite=true")
    assert r.returncode == 0, r.stderr
    assert [s["steps"] for s in summaries(sweep).values()] == [10, 10]


@pytest.mark.e2e
def test_keys_that_change_no_result_do_not_make_a_run_different(tmp_path):
    sweep = tmp_path / "S"
    assert launch("-m", *S, "seed=0,1", f"hydra.sweep.dir={sweep}").returncode == 0
    runs = lambda: {k: v for k, v in tree(sweep).items() if "/" in k}  # noqa: E731 - the run folders' files
    files = runs()
    r = launch("-m", *S, "seed=0,1", "checkpoint_every=3", "wandb.project=elsewhere", "objective=test_acc",
               f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 0 done, 2 skipped, 0 failed, 0 diverged"
    assert runs() == files


@pytest.mark.e2e
def test_a_sweep_without_a_named_folder_records_its_resolved_folder_as_the_wandb_group(tmp_path):
    r = launch("-m", *S, "seed=0,1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (sweep,) = [p for p in (tmp_path / "multirun").glob("*/*") if p.is_dir()]
    expected = f"{sweep.parent.name}/{sweep.name}"
    for n in "01":
        cfg = results.read_config(sweep / n)
        assert cfg["wandb"]["group"] == expected and "${" not in json.dumps(cfg)


# ------------------------------------------------------------------------------ nothing planted is obeyed
class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.e2e
def test_a_planted_checkpoint_that_would_run_code_is_ignored_and_the_run_trains_from_scratch(tmp_path):
    sweep, marker = tmp_path / "S", tmp_path / "pwned"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "checkpoint.pt").write_bytes(pickle.dumps({"config": _Payload(str(marker))}))
    r = launch("-m", *S, "seed=0", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert summaries(sweep)["0"]["status"] == "done" and summaries(sweep)["0"]["steps"] == 5


@pytest.mark.e2e
def test_links_planted_in_a_sweep_folder_are_never_followed(tmp_path):
    sweep, outside = tmp_path / "S", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious\n")
    for n in "0123":
        (sweep / n).mkdir(parents=True)
    (sweep / "0" / "summary.json").symlink_to(victim)       # a result file's name
    (sweep / "1" / "launch.log").symlink_to(victim)         # the run's log
    (sweep / "2" / ".hydra").symlink_to(outside)            # the run's Hydra folder
    (sweep / "3").rmdir()
    (sweep / "3").symlink_to(outside)                       # the run folder itself
    r = launch("-m", *S, "seed=range(0,5)", f"hydra.sweep.dir={sweep}")
    assert victim.read_text() == "precious\n" and sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    got = summaries(sweep)
    assert {n: got[n]["status"] for n in ("0", "1", "4")} == {"0": "done", "1": "done", "4": "done"}
    assert not (sweep / "0" / "summary.json").is_symlink()  # replaced, not written through
    assert r.returncode == 1
    failed = [ln for ln in r.stderr.splitlines() if ln.startswith("failed ")]
    assert len(failed) == 2 and all("symbolic link" in ln for ln in failed), r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ the lock
@pytest.mark.e2e
@pytest.mark.parametrize("content", ["", "garbage", '{"host": "h", "pid": 1, "since": 1e300, "arrays": []}'])
def test_a_lock_that_cannot_be_read_is_reported_in_one_line_and_not_taken_over(tmp_path, content):
    sweep = tmp_path / "S"
    sweep.mkdir()
    (sweep / lock.LOCK).write_text(content)
    if content == "":  # an empty lock is being written by its holder right now: held while young
        os.utime(sweep / lock.LOCK, (1, 1))
    r = launch("-m", *S, "seed=0", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2
    assert "cannot be read as a holder record" in one_error_line(r)
    assert (sweep / lock.LOCK).read_text() == content and not (sweep / "0").exists()
    assert not (sweep / "multirun.yaml").exists()


def test_a_young_empty_lock_counts_as_held(tmp_path, monkeypatch):
    sweep = tmp_path / "S"
    sweep.mkdir()
    (sweep / lock.LOCK).write_text("")  # its writer is between creating and filling it (an older version)
    monkeypatch.setattr(lock, "YOUNG_S", 1e9)  # young however long this machine takes to get to the next line
    with pytest.raises(lock.SweepLocked, match="being locked by another launch"):
        lock.acquire(sweep)
    assert (sweep / lock.LOCK).read_text() == ""


@pytest.mark.e2e
def test_a_refused_second_launch_writes_nothing_not_even_multirun_yaml(tmp_path):
    sweep = tmp_path / "S"
    sweep.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (sweep / lock.LOCK).write_text(json.dumps({"host": os.uname().nodename, "pid": holder.pid,
                                                   "since": 1.7e9, "arrays": []}))
        (sweep / "multirun.yaml").write_text("theirs\n")
        r = launch("-m", *S, "seed=0", f"hydra.sweep.dir={sweep}")
        assert r.returncode == 2 and f"pid {holder.pid}" in one_error_line(r)
        assert (sweep / "multirun.yaml").read_text() == "theirs\n" and not (sweep / "0").exists()
    finally:
        holder.kill()


def test_the_lock_is_created_with_its_content_in_one_step(tmp_path):
    me = lock.acquire(tmp_path)
    try:
        assert json.loads((tmp_path / lock.LOCK).read_text()) == me
        lock.acquire(tmp_path)  # held by this process already: a no-op
        assert json.loads((tmp_path / lock.LOCK).read_text()) == me
        assert sorted(p.name for p in tmp_path.iterdir()) == [lock.LOCK]  # no temp file left behind
    finally:
        lock.release(tmp_path)
    assert not (tmp_path / lock.LOCK).exists()


# ------------------------------------------------------------------------------ unusable sweep folders
@pytest.mark.e2e
def test_a_file_given_as_the_sweep_folder_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    r = launch("-m", *S, "seed=0", f"hydra.sweep.dir={tmp_path / 'f'}")
    assert r.returncode == 2 and "exists and is not a folder" in one_error_line(r)


@pytest.fixture
def read_only(tmp_path):
    """Make a folder read-only for this (possibly root) process: a read-only bind mount of it on itself."""
    mounted = []

    def make(folder: Path) -> None:
        if os.geteuid() != 0:
            os.chmod(folder, 0o555)
            return
        ok = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
        ok = ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode == 0
        if not ok:
            pytest.skip("cannot make a read-only folder here (no bind mounts)")
        mounted.append(folder)

    yield make
    for folder in mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.e2e
def test_a_read_only_finished_sweep_reports_every_run_done_and_writes_nothing(tmp_path, read_only):
    sweep = tmp_path / "S"
    assert launch("-m", *S, "seed=0,1", f"hydra.sweep.dir={sweep}").returncode == 0
    files = tree(sweep)
    read_only(sweep)
    r = launch("-m", *S, "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 0 done, 2 skipped, 0 failed, 0 diverged"
    assert tree(sweep) == files and "Traceback" not in r.stderr
    r = launch("-m", *S, "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2 and "not writable, and 1 of its 3 runs are not done" in one_error_line(r)


@pytest.mark.e2e
def test_a_sweep_folder_under_a_read_only_parent_is_one_line(tmp_path, read_only):
    parent = tmp_path / "ro"
    parent.mkdir()
    read_only(parent)
    r = launch("-m", *S, "seed=0", f"hydra.sweep.dir={parent / 'S'}")
    assert r.returncode == 2 and "cannot be created" in one_error_line(r)


# ------------------------------------------------------------------------------ a full disk
@pytest.mark.e2e
def test_a_nearly_full_disk_keeps_every_run_that_fit(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        sweep = disk / "S"
        r = launch("-m", *S, "seed=range(0,40)", f"hydra.sweep.dir={sweep}", "hydra.launcher.lean=true")
        got = summaries(sweep) if sweep.exists() else {}
        done = [n for n, s in got.items() if s["status"] == "done"]
        assert 0 < len(done) < 40, r.stderr[-2000:]
        for n in done:  # a done run is complete
            assert run.done_summary(run_validated(sweep / n), sweep / n) is not None
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "No space left on device" in r.stderr
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def run_validated(folder: Path) -> RunConfig:
    from rw_sweeps.core.config import from_dict

    return from_dict(results.read_config(folder), complete=True)


# ------------------------------------------------------------------------------ interrupts at start-up
@pytest.mark.e2e
def test_an_interrupt_during_start_up_leaves_a_sweep_the_next_launch_completes(tmp_path):
    sweep = tmp_path / "S"
    args = ["-m", *S, "seed=range(0,2000)", f"hydra.sweep.dir={sweep}"]
    proc = start_launch(*args)
    wait_until(lambda: (sweep / "multirun.yaml").exists() or proc.poll() is not None, 120, "the sweep to start")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    r = launch(*args)
    assert r.returncode == 0, r.stderr
    got = summaries(sweep)
    assert len(got) == 2000 and all(s["status"] == "done" and s["steps"] == 5 for s in got.values())


# ------------------------------------------------------------------------------ failures stay local
@pytest.mark.e2e
def test_an_optuna_study_where_half_the_trials_diverge_records_them_failed_and_goes_on(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    import yaml

    sweep = tmp_path / "s"
    r = launch("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=8", "hydra.sweeper.n_jobs=4",
               "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=1",
               "optim.lr=choice(0.5,1e300)", "data.p=interval(0.55,0.95)", "objective=test_acc",
               *S, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    runs = summaries(sweep)
    status = sorted(s["status"] for s in runs.values())
    assert len(runs) == 8 and "diverged" in status and "done" in status, status
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_params"]["optim.lr"] == 0.5
    assert best["best_value"] == max(s["test_acc"] for s in runs.values() if s["status"] == "done")


# ------------------------------------------------------------------------------ claims that say what they show
TWO_SWAPS = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]             # (0 1)(2 3)
CYCLE_AND_FIXED = [[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]]       # (0 1 2)(3), N − 1 = 96
TWO_BLOCKS = [[.5, .5, 0, 0], [.5, .5, 0, 0], [0, 0, .5, .5], [0, 0, .5, .5]]      # block diagonal, stochastic


def _chain_run(tmp_path, Pi, name: str) -> dict:
    cfg = validate(RunConfig(data=data_config(name="markov_matrix", K=4, N=97, Pi=Pi, n_train=200, n_test=200),
                             model=ModelConfig(M=200), optim=Gd(lr=1.0, steps=100), eval_every=10,
                             wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))
    return run.execute([cfg], [tmp_path / name], progress=False)[0]


@pytest.mark.parametrize("Pi", [TWO_SWAPS, CYCLE_AND_FIXED], ids=["two-swaps", "3-cycle+fixed-point"])
def test_a_multi_cycle_permutation_is_flagged_a_trap_and_zero_init_stays_at_the_symmetric_point(tmp_path, Pi):
    s = _chain_run(tmp_path, Pi, "run")
    assert s["status"] == "done" and s["trap"] is True
    assert s["symmetry_break_step"] is None and s["attention_spread"] == 0.0  # uniform attention, exactly
    assert s["opt_acc"] == 1.0 and s["test_acc"] < 0.75  # deterministic chain, yet far from it


def test_a_block_diagonal_chain_with_random_blocks_is_no_trap_and_reaches_its_optimum(tmp_path):
    s = _chain_run(tmp_path, TWO_BLOCKS, "run")  # y is uniform within x's block: the block is all there is to learn
    assert s["trap"] is False and s["symmetry_break_step"] is not None
    assert s["opt_acc"] == 0.5 and s["test_acc"] >= s["opt_acc"] - 0.05


def test_closed_classes_are_the_components_no_transition_leaves():
    from rw_sweeps.core.training import closed_classes

    assert closed_classes(TWO_SWAPS) == [0, 0, 1, 1]
    assert closed_classes(CYCLE_AND_FIXED) == [0, 0, 0, 1]
    assert closed_classes([[.5, .5, 0], [0, 1, 0], [0, .5, .5]]) == [-1, 0, -1]  # 0 and 2 drain into 1


# ------------------------------------------------------------------------------ analysis of a damaged folder
@pytest.mark.e2e
def test_analysis_counts_ill_typed_and_unknown_status_summaries_as_corrupt_and_rebuilds_a_mistyped_cache(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis import load_runs

    sweep = tmp_path / "S"
    assert launch("-m", *S, "seed=range(0,4)", f"hydra.sweep.dir={sweep}").returncode == 0
    assert load_runs(sweep, progress=False)["test_acc"].dtype == float  # and the sweep's cache is written
    cache = sweep / "runs.parquet"
    table = pq.read_table(cache)
    i = table.column_names.index("test_acc")
    pq.write_table(table.set_column(i, "test_acc", table.column("test_acc").cast(pa.string())), cache)
    runs = load_runs(sweep, progress=False)  # the same stamps, but a column of the wrong type: rebuilt
    assert runs["test_acc"].dtype == float and len(runs) == 4
    for n, change in (("1", {"test_acc": "high"}), ("2", {"status": "pending-review"})):
        f = sweep / n / "summary.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), **change}))
    r = python("-m", "analysis", sweep, "--out", tmp_path / "R")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    runs = load_runs(sweep, progress=False)
    assert sorted(runs["run"]) == ["0", "3"] and runs["test_acc"].dtype == float
    reasons = sorted(s["reason"] for s in runs.attrs["skipped"])
    assert [s["status"] for s in runs.attrs["skipped"]] == ["corrupt", "corrupt"]
    assert "status='pending-review' is not one of done, failed, diverged" in reasons[0]
    assert "test_acc='high' must be a finite number" in reasons[1]


def test_the_escape_theory_is_judged_on_late_breaking_trap_runs_apart_from_the_rest():
    import pandas as pd

    from analysis import escape

    runs = pd.DataFrame({"status": ["done"] * 5, "trap": [True, True, True, False, False],
                         "symmetry_break_step": [400, 800, 2, 3, 5],
                         escape.PREDICTED: [440, 720, 2, 3, 5]})
    parts = {label: escape.ratio_stats(runs[mask]) for label, mask in escape.regimes(runs).items()}
    late = parts[f"trap runs breaking after step {escape.LATE}"]
    assert late["n"] == 2 and late["median"] == pytest.approx((1.1 + 0.9) / 2)
    assert parts["the rest"]["n"] == 3 and parts["the rest"]["median"] == 1.0  # easy, and exact


@pytest.mark.e2e
def test_a_single_run_into_a_folder_of_another_config_is_refused_unless_overwrite(tmp_path):
    folder = tmp_path / "run"
    assert launch(*S, f"hydra.run.dir={folder}").returncode == 0
    before = tree(folder)
    assert launch(*S, f"hydra.run.dir={folder}").returncode == 0  # the same run: found done
    r = launch(*S, "data.p=0.9", f"hydra.run.dir={folder}")
    line = one_error_line(r)
    assert r.returncode == 2 and "holds a run of another config (data.p=0.5 there, 0.9 here); to continue it, add " \
        "data.p=0.5; add hydra.launcher.overwrite=true" in line
    assert all((folder / n).read_bytes() == before[n] for n in ("config.yaml", "summary.json", "history.jsonl"))
    r = launch(*S, "data.p=0.9", f"hydra.run.dir={folder}", "hydra.launcher.overwrite=true")
    assert r.returncode == 0 and results.read_summary(folder)["p"] == 0.9


def test_a_run_whose_predictions_left_the_symmetric_point_says_so_even_below_the_spread_threshold(tmp_path):
    base = dict(data=data_config(p=1.0), model=ModelConfig(normalize="whole"), eval_every=10, seed=103,
                wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))

    below = validate(RunConfig(**base, init=GaussianInit("gaussian", 1e-3), optim=Gd(lr=1.0, steps=1000)))
    trapped = validate(RunConfig(**{**base, "model": ModelConfig()}, optim=Gd(lr=1.0, steps=200)))
    s, z = run.execute([below, trapped], [tmp_path / "below", tmp_path / "zero"], progress=False)
    # the spread never crossed 1e-3, yet the predictions changed: accuracy doubled from the trap's 1/6
    assert s["symmetry_break_step"] is None and s["attention_spread"] < 1e-3
    assert s["prediction_break_step"] is not None and s["test_acc"] > 0.3
    history = [json.loads(r) for r in (tmp_path / "below" / "history.jsonl").read_text().splitlines()]
    # before, every test sequence got the symmetric point's one prediction (the histogram is the same for all):
    # the share of its label, about 1/K
    assert max(r["test_acc"] for r in history if r["step"] < s["prediction_break_step"]) < 0.25
    # zero init on the trap: exactly uniform attention, the symmetric point's predictions throughout
    assert z["trap"] is True and z["attention_spread"] == 0 and z["prediction_break_step"] is None


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("K,model_keys", [(4, dict(normalize="whole")), (4, dict(normalize="none")),
                                          (4, dict(normalize="positional")), (11, dict(normalize="whole")),
                                          (4, dict(name="transformer_ffn", m=7, normalize="whole")),
                                          (4, dict(name="transformer_ffn", m=7, normalize="whole", ffn="before"))],
                         ids=["eq2.1-whole", "eq2.1-none", "eq2.1-positional", "eq2.1-K11", "ffn-after", "ffn-before"])
def test_the_prediction_check_from_an_evaluations_predictions_equals_the_exact_forward_pass(K, model_keys, precision):
    """The prediction check reads the evaluation's own argmax (the compiled kernel's for eq. 2.1 on a CPU, K = 4
    its AVX-512 path, K = 11 its plain C one; PyTorch's for the FFN) and gives engine's exact pass the runs a
    kernel is unsure of: the flags equal the exact pass on runs from nearly flat to peaked attention, with
    exact ties (two equal rows of V, or of A) and ties one ulp apart, which the kernel must leave to engine."""
    import torch

    from rw_sweeps.core import data as data_mod, engine, fused, model, training
    from rw_sweeps.core.loop import Record
    N, R, T = 17, 24, 10
    dtype = getattr(torch, precision)
    cfg = validate(RunConfig(precision=precision, data=data_config(K=K, N=N, p=0.7, n_train=8, n_test=50),
                             model=option_config("model", M=32, **model_keys)))
    geo = model.geometry(cfg.model, N)
    _, test = data_mod.make(cfg.data, 0)
    g = torch.Generator().manual_seed(0)
    scale = torch.logspace(-12, 0, R, dtype=torch.float64)[:, None]  # attention logits from nearly flat to not
    m = cfg.model.m if cfg.model.is_ffn else K
    params = {"V": torch.randn(R, m, K, generator=g, dtype=torch.float64)}
    if cfg.model.is_ffn:
        params["A"] = torch.randn(R, K, m, generator=g, dtype=torch.float64)
    top = params["A"] if cfg.model.is_ffn else params["V"]  # the matrix whose rows are f's
    top[0:R:2, 0] = top.abs().amax() + 1  # f_0 the largest output of every sequence, …
    top[0:R:4, 1] = top[0:R:4, 0]  # … tied exactly with f_1, or one ulp apart
    top[2:R:4, 1] = torch.nextafter(top[2:R:4, 0].to(dtype), torch.tensor(0.0, dtype=dtype)).double()
    params = {k: v.to(dtype) for k, v in params.items()}
    state = engine.State(params, (scale * torch.randn(R, K, generator=g, dtype=torch.float64)).to(dtype),
                         (scale * torch.randn(R, N, generator=g, dtype=torch.float64)).to(dtype))
    tokens = test.tokens[None].expand(R, *test.tokens.shape)
    batch = engine.Batch(tokens, test.y[None].expand(R, -1), test.P_true[None].expand(R, -1, -1).to(dtype))
    eps = torch.full((R,), 1e-12, dtype=dtype)
    probe = fused.evaluate(state, batch, eps, geo)
    kernel = fused.available(cfg)
    assert (probe.pred_unsure is not None) == kernel
    if kernel:  # where the kernel is sure, its argmax is engine's; exact ties it never decides itself
        sure = ~probe.pred_unsure
        assert torch.equal(probe.pred.long()[sure], engine.evaluate(state, batch, eps, geo).pred[sure])
        assert probe.pred_unsure[0:R:2].all() and sure.sum() >= R // 3
    log = training._Log([Record(cfg, None) for _ in range(R)], "cpu", T, kernel)  # the kernel's histograms where it runs
    log.predictions(3, state, batch, geo, probe)
    h_sym = engine.symmetric_h(batch, K, dtype)
    exact = engine.off_symmetric(state, tokens, geo, h_sym) & (probe.spread > 0)
    assert log.off.tolist() == [3 if e else T + 1 for e in exact.tolist()]
    assert not exact[2] and exact[-1]  # both outcomes occur


@pytest.mark.e2e
def test_unpacked_jobs_refuse_a_planted_link_before_hydra_writes_through_it(tmp_path):
    sweep, outside = tmp_path / "S", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.yaml"
    victim.write_text("precious\n")
    (sweep / "1" / ".hydra").mkdir(parents=True)
    (sweep / "1" / ".hydra" / "config.yaml").symlink_to(victim)  # Hydra's run_job opens this with open()
    r = launch("-m", *S, "seed=0,1", "hydra.launcher.pack=false", f"hydra.sweep.dir={sweep}")
    assert victim.read_text() == "precious\n"
    assert r.returncode == 1 and summaries(sweep)["0"]["status"] == "done"
    assert "symbolic link" in r.stderr and "Traceback" not in r.stderr


def test_a_packed_job_trusts_placements_done_check_only_in_the_process_that_placed(tmp_path):
    """A SLURM job requeued after some of its runs finished must not train them again: the packed task skips
    its own done check only for specs placed in its own process, and asks the folders otherwise."""
    from rw_sweeps.sweeps.app import train_batch
    from rw_sweeps.sweeps.planner import Spec

    cfg = validate(RunConfig(data=data_config(K=5, N=13, p=0.7, n_train=32, n_test=32), model=ModelConfig(M=40),
                             optim=Gd(steps=3), wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))
    folder = tmp_path / "0"
    first = run.execute([cfg], [folder])[0]
    assert first["status"] == "done"
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def spec(placed_in: int) -> Spec:  # placed by a launcher: not done then
        return Spec(0, [], {}, {}, {"job": {"name": "launch"}}, output_dir=str(folder), sweep_dir=str(tmp_path),
                    cfg=cfg, placed=False, placed_in=placed_in)

    (value, lines), = train_batch([spec(os.getpid() + 1)]).write()  # another process placed it: the folder is asked
    assert value["skipped"] is True and value["test_acc"] == first["test_acc"]
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # nothing trained or rewritten


def test_a_sweep_subdir_that_maps_two_runs_to_one_folder_is_refused_before_anything_is_written(tmp_path):
    """`hydra.sweep.subdir=x` for `seed=0,1` would train both into x, the second over the first."""
    from rw_sweeps.sweeps import placement
    from rw_sweeps.sweeps.planner import Spec

    cfgs = [validate(RunConfig(seed=i)) for i in range(2)]
    specs = [Spec(i, [f"seed={i}"], {}, {}, {"job": {}}, output_dir=str(tmp_path / "x"), cfg=c)
             for i, c in enumerate(cfgs)]
    with pytest.raises(placement.FolderTaken, match=r"hydra.sweep.subdir='x': two runs of this launch would share "
                                                    r".*/x \(seed=0; seed=1\): one would overwrite the other"):
        placement.place(specs, tmp_path, default_subdir=False)
    assert list(tmp_path.iterdir()) == []


def test_the_hint_to_continue_a_folder_is_given_only_where_pasting_it_trains_the_runs_it_holds():
    """`to continue it, add K=V`: one set of overrides for every conflicting folder, read back by Hydra's grammar
    as the value the folder holds; none for a key the command sweeps, a group or preset choice, or a value the
    grammar would read otherwise."""
    from rw_sweeps.sweeps.placement import _continue

    from .test_config import composed

    def cfg(*overrides):
        return composed(*overrides).to_dict()

    old, new = cfg("model=gpt", "precision=float64"), cfg("model=gpt")
    assert _continue([(old, new)], [new]) == "to continue it, add precision=float64; "
    assert _continue([(cfg("optim.steps=5"), cfg()), (cfg("optim.steps=5", "seed=1"), cfg("seed=1"))],
                     [cfg(), cfg("seed=1")]) == "to continue it, add optim.steps=5; "
    # a swept key: pasting one value would collapse the sweep; two folders that need different values
    assert _continue([(cfg("data.p=0.5"), cfg("data.p=0.7"))], [cfg("data.p=0.7"), cfg("data.p=0.8")]) == ""
    assert _continue([(cfg("data.p=0.5"), cfg("data.p=0.7")), (cfg("data.p=1"), cfg("data.p=0.7", "seed=1"))],
                     [cfg("data.p=0.7"), cfg("data.p=0.7", "seed=1")]) == ""
    # a preset or group choice brings other keys with it
    assert _continue([(cfg("experiment=fig5"), cfg("experiment=fig4"))], [cfg("experiment=fig4")]) == ""
    assert _continue([(cfg("init=gaussian"), cfg())], [cfg()]) == ""
    # text the grammar reads otherwise: a float, a non-ASCII letter
    for text in ("1.10", "Π.txt", "null", "a b"):
        assert _continue([({**cfg(), "device": text}, cfg())], [cfg()]) == ""
    assert _continue([({**cfg(), "device": "cuda"}, cfg())], [cfg()]) == "to continue it, add device=cuda; "
