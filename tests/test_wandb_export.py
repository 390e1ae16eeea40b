"""wandb off the critical path: the background logger, `python -m rw_sweeps.sweeps.wandb_export`, the analysis run.

Real offline wandb files throughout (read back with tests/wandb_files.py), no mocks of wandb.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from analysis import wandb_run
from rw_sweeps.core import results
from rw_sweeps.sweeps import tracking

from .conftest import ROOT, launch, python, summaries
from .wandb_files import read_run, read_table

TINY = ["optim.steps=2", "data.n_train=64", "data.n_test=64", "model.M=200"]


def _export(*args: str) -> subprocess.CompletedProcess:
    return python("-m", "rw_sweeps.sweeps.wandb_export", *map(str, args), env={**os.environ, "WANDB_SILENT": "true"})


def _entries(root: Path, n: int, granularity: str = "run") -> list[dict]:
    """n finished runs on disk (config, history, summary), as run_batch hands them to tracking."""
    out = []
    for i in range(n):
        d = root / str(i)
        cfg = {"seed": i, "experiment": None, "data": {"p": 0.1 * (i + 1), "K": 6}, "init": {"name": "zero"},
               "wandb": {"mode": "offline", "project": "rw-test", "group": "g/sweep", "tags": [],
                         "granularity": granularity, "per_run_limit": 32}}
        hist = [{"step": s, "train_loss": 1.0 / (s + 1), "test_acc": 0.5 + 0.1 * s + 0.01 * i} for s in range(3)]
        summary = {"status": "done", "test_acc": hist[-1]["test_acc"], "run_id": results.run_id(d), "seed": i}
        results.write_run(d, cfg, hist, [])
        results.write_summary(d, summary)
        out.append({"cfg": cfg, "run_dir": d, "run_id": summary["run_id"], "history": hist, "summary": summary})
    return out


def _shape(info: dict) -> dict:
    return {k: info[k] for k in ("id", "group", "job_type", "tags", "project", "name")} | {
        "history": [{k: v for k, v in h.items() if not k.startswith("_")} for h in info["history"]],
        "config": {k: v for k, v in info["config"].items() if k != "_wandb"},
        "summary": {k: v for k, v in info["summary"].items() if not k.startswith("_") and k != "run_id"}}


def test_background_logging_writes_the_same_offline_runs_and_wait_waits(tmp_path):
    sync, bg = _entries(tmp_path / "sync", 2), _entries(tmp_path / "bg", 2)
    tracking._log_runs(sync)  # what run_batch used to call inline
    gate = threading.Event()
    tracking.submit(gate.wait)  # the worker is busy: everything queued behind it waits
    tracking.log_runs(bg)  # returns at once
    waiter = threading.Thread(target=tracking.wait)
    try:
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()  # wait() does not return while an entry is still queued
    finally:
        gate.set()
    tracking.wait()
    waiter.join()
    for a, b in zip(sync, bg):
        sa, sb = _shape(read_run(a["run_dir"])), _shape(read_run(b["run_dir"]))
        assert sb["id"] == b["run_id"] and sb["job_type"] == "train" and sb["group"] == "g/sweep"
        assert sb["config"]["data"]["p"] == b["cfg"]["data"]["p"] and sb["summary"]["test_acc"] == b["summary"]["test_acc"]
        assert [h["test_acc"] for h in sb["history"]] == [h["test_acc"] for h in b["history"]]
        assert {**sa, "id": None} == {**sb, "id": None}  # the same run, but for its folder-derived id
        assert tracking.is_exported(b["run_dir"], b["run_id"], "offline")  # the export skips it
    # a packed job (more runs than per_run_limit): one job run, as before
    job = _entries(tmp_path / "job", 3, granularity="auto")
    for e in job:
        e["cfg"]["wandb"]["per_run_limit"] = 2
    tracking.log_runs(job)
    tracking.wait()
    (folder,) = (tmp_path / "job" / "wandb_jobs").iterdir()
    info = read_run(folder)
    assert info["job_type"] == "packed" and info["summary"]["runs"] == 3 and (folder / "history.parquet").exists()


def test_a_failure_in_the_background_is_one_warning_and_wait_raises_nothing(tmp_path, capfd):
    def boom():
        raise RuntimeError("no space left\nsecond line")

    tracking.submit(boom)
    tracking.wait()
    err = capfd.readouterr().err
    assert "warning: wandb logging failed: RuntimeError: no space left" in err and "second line" not in err


@pytest.mark.e2e
def test_wandb_export_replays_finished_runs_skips_and_forces(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", "data.p=0.3,0.7", "seed=0,1", *TINY, "wandb.mode=disabled", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert not (sweep / "wandb_analysis").exists()  # wandb.mode=disabled: no analysis run either
    (sweep / "4").mkdir()  # a job that never finished
    r = _export(sweep, "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("4 exported, 1 skipped (0 already exported, 1 unfinished), 0 failed"), r.stdout
    for name, s in summaries(sweep).items():
        run_dir = sweep / name
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        hist = [json.loads(ln) for ln in (run_dir / "history.jsonl").read_text().splitlines()]
        wb = read_run(run_dir)
        assert wb["id"] == results.run_id(run_dir) == s["run_id"] and wb["job_type"] == "train"
        assert wb["group"] == cfg["wandb"]["group"] == "/".join(sweep.parts[-2:])
        assert wb["config"]["data"]["p"] == s["p"] and wb["config"]["seed"] == s["seed"]
        assert wb["summary"]["status"] == "done" and wb["summary"]["test_acc"] == s["test_acc"]
        assert [h["step"] for h in wb["history"]] == [h["step"] for h in hist] == [0, 1, 2]
        assert [h["test_acc"] for h in wb["history"]] == [h["test_acc"] for h in hist]
    r = _export(sweep, "--workers", "2")
    assert r.stdout.strip().endswith("0 exported, 5 skipped (4 already exported, 1 unfinished), 0 failed"), r.stdout
    s0 = json.loads((sweep / "0" / "summary.json").read_text())
    results.write_summary(sweep / "0", {**s0, "note": "changed"})  # a changed summary is exported again
    r = _export(sweep, "--workers", "1")
    assert r.stdout.strip().endswith("1 exported, 4 skipped (3 already exported, 1 unfinished), 0 failed"), r.stdout
    assert read_run(sweep / "0")["summary"]["note"] == "changed"
    r = _export(sweep, "--workers", "2", "--force")
    assert r.stdout.strip().endswith("4 exported, 1 skipped (0 already exported, 1 unfinished), 0 failed"), r.stdout
    for name in summaries(sweep):  # redone in place: one offline run per training run, never two
        assert len(list((sweep / name / "wandb").glob("offline-run-*"))) == 1


@pytest.mark.e2e
def test_a_finished_sweep_logs_one_analysis_run_with_a_stable_id(tmp_path):
    sweep = tmp_path / "S"
    args = ["-m", "data.p=0.3,0.7", "seed=0,1", *TINY, "wandb.mode=offline", "wandb.analysis=true",
            f"hydra.sweep.dir={sweep}"]
    r = launch(*args)
    assert r.returncode == 0, r.stderr
    info = read_run(sweep / "wandb_analysis")
    assert info["job_type"] == "analysis" and info["id"] == wandb_run.analysis_id(sweep)
    assert info["group"] == "/".join(sweep.parts[-2:]) and info["summary"]["runs"] == 4
    assert info["summary"]["runs/nrows"] == 4 and "phase_success/path" in info["summary"]
    assert info["config"]["axes"] == ["data.p"]
    figures = {p.stem for p in (sweep / "wandb_analysis" / "figures").glob("*.png")}  # the headline: the phase diagram
    assert figures == {"phase_success"}
    assert {k.split("/")[0] for k in info["summary"] if k.endswith("/path")} == figures | {"runs"}
    assert info["summary"]["figures"] == len(figures)
    rows = {row["run"]: row for row in read_table(sweep / "wandb_analysis", "runs")}  # the sweep's runs, one a row
    assert sorted(rows) == sorted(summaries(sweep))
    for d, row in rows.items():
        recorded = tracking.leaves(yaml.safe_load((sweep / d / "config.yaml").read_text()))
        assert {k: row[k] for k in recorded} == recorded and row["name"] == recorded["wandb.name"]
        s = summaries(sweep)[d]
        assert row["test_acc"] == s["test_acc"] and row["status"] == "done" and row["run_id"] == s["run_id"]
        assert row["success"] is (s["test_acc"] >= s["opt_acc"] - 0.02)  # analysis's default tolerance
    _assert_named_by_what_varies(sweep, {d: row["name"] for d, row in rows.items()})
    staged = [p for p in (sweep / "wandb_analysis" / ".wandb_data").rglob("*") if p.is_file()]
    assert staged and all(p.stat().st_mode & 0o777 == 0o644 for p in staged)
    assert read_run(sweep / "0")["id"] == summaries(sweep)["0"]["run_id"]  # and the per-run runs, as before
    r = launch(*args)  # every run is done: a re-run replaces the analysis run, never adds one
    assert r.returncode == 0, r.stderr
    runs = list((sweep / "wandb_analysis" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(wandb_run.analysis_id(sweep))
    off = tmp_path / "off"
    r = launch("-m", "seed=0,1", *TINY, "wandb.mode=offline", "wandb.analysis=false", f"hydra.sweep.dir={off}")
    assert r.returncode == 0, r.stderr
    assert not (off / "wandb_analysis").exists()


def test_the_analysis_callback_travels_pickled_to_a_job_while_it_warms_up(tmp_path):
    """Hydra's context (callbacks included) is pickled into every submitit/SLURM job: the callback, whose
    warm-up thread runs in the launching process, must pickle, and arrive without that thread."""
    import pickle

    from omegaconf import OmegaConf

    from analysis.callback import WandbAnalysis

    cb = WandbAnalysis()
    cfg = OmegaConf.create({"wandb": {"mode": "offline", "analysis": True, "group": None},
                            "hydra": {"sweep": {"dir": str(tmp_path / "s")}, "launcher": {}}})
    cb.on_multirun_start(cfg)
    assert cb._warming is not None
    again = pickle.loads(pickle.dumps(cb))
    assert isinstance(again, WandbAnalysis) and again._warming is None
    cb._warming.join()


# ---------------------------------------------------------------------------------------------------- as users know it
@pytest.mark.e2e
def test_wandb_environment_variables_are_the_defaults_and_explicit_keys_override_them(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_PROJECT": "from-env", "WANDB_ENTITY": "lab", "WANDB_TAGS": "a, b"}
    r = launch(*TINY, f"hydra.run.dir={tmp_path / 'env'}", env=env)
    assert r.returncode == 0, r.stderr
    info = read_run(tmp_path / "env")
    assert info["project"] == "from-env" and info["tags"] == ["a", "b"]
    assert info["name"] == " ".join(TINY)  # a single run: named by its overrides
    recorded = yaml.safe_load((tmp_path / "env" / "config.yaml").read_text())["wandb"]
    assert (recorded["project"], recorded["entity"], recorded["tags"]) == ("from-env", "lab", ["a", "b"])
    r = launch(*TINY, "wandb.project=explicit", "wandb.tags=[c]", f"hydra.run.dir={tmp_path / 'key'}", env=env)
    assert r.returncode == 0, r.stderr
    info = read_run(tmp_path / "key")
    assert info["project"] == "explicit" and info["tags"] == ["c"]
    r = launch(*TINY, f"hydra.run.dir={tmp_path / 'off'}", env={"WANDB_MODE": "disabled"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "off" / "summary.json").exists() and not (tmp_path / "off" / "wandb").exists()
    r = launch(*TINY, "wandb.mode=offline", f"hydra.run.dir={tmp_path / 'back'}", env={"WANDB_MODE": "disabled"})
    assert r.returncode == 0, r.stderr
    assert read_run(tmp_path / "back")["id"] == summaries(tmp_path)["back"]["run_id"]


@pytest.mark.e2e
def test_a_small_batch_streams_its_rows_while_it_trains_each_stamped_when_it_was_evaluated(tmp_path, monkeypatch):
    """The training loop hands the records to `live` as it goes: every report's rows are a prefix of the
    final history, and the front door's offline run holds that history with one real time per row."""
    from rw_sweeps.core import config as config_mod
    from rw_sweeps.core import training

    cfg = config_mod.from_dict({"optim": {"steps": 12}, "eval_every": 3, "model": {"M": 200},
                                "data": {"name": "random_walk", "n_train": 64, "n_test": 64}})
    seen = []
    monkeypatch.setattr(training, "LIVE_S", 0.0)
    recs = training.train([cfg], [tmp_path / "r"], progress=False,
                          live=lambda recs, walls: seen.append(([dict(h) for h in recs[0].history], dict(walls))))
    final = recs[0].history
    assert [len(rows) for rows, _ in seen] == [1, 2, 3, 4, 5]  # each evaluation's row once its loss is known
    assert all(rows == final[:len(rows)] for rows, _ in seen)
    assert sorted(seen[-1][1]) == [0, 3, 6, 9, 12]

    t0 = __import__("time").time()
    r = launch("optim.steps=30", "data.n_train=64", "data.n_test=64", "model.M=200", "wandb.mode=offline",
               f"hydra.run.dir={tmp_path / 'run'}")
    t1 = __import__("time").time()
    assert r.returncode == 0, r.stderr
    info = read_run(tmp_path / "run")
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in info["history"]] == [h["step"] for h in history]
    assert all(h["test_acc"] == w["test_acc"] for h, w in zip(history, info["history"]))
    stamps = [h["_timestamp"] for h in info["history"]]
    assert stamps == sorted(stamps) and t0 <= stamps[0] <= stamps[-1] <= t1
    assert info["summary"]["test_acc"] == summaries(tmp_path)["run"]["test_acc"]
    assert info["config"]["wandb"]["mode"] == "offline" and info["group"] == "/".join((tmp_path / "run").parts[-2:])


# ---------------------------------------------------------------------------------------------------- names, config
def _dotted(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def _assert_named_by_what_varies(sweep: Path, names: dict) -> None:
    """Each run's wandb name is its job's overrides of the keys the sweep varies (no wandb key), each
    `key=value` of it the run's config value at that key, and no two runs share a name."""
    jobs = {d: yaml.safe_load((sweep / d / ".hydra" / "overrides.yaml").read_text()) for d in names}
    values: dict = {}
    for overrides in jobs.values():
        for o in overrides:
            values.setdefault(o.partition("=")[0], set()).add(o.partition("=")[2])
    varies = {k for k, v in values.items() if len(v) > 1 and not k.startswith("wandb.")}
    assert varies, "a sweep that varies nothing names nothing"
    for d, name in names.items():
        assert name == " ".join(o for o in jobs[d] if o.partition("=")[0] in varies), (d, name)
        cfg = yaml.safe_load((sweep / d / "config.yaml").read_text())
        for pair in name.split(" "):
            key, _, value = pair.partition("=")
            assert _dotted(cfg, key) == yaml.safe_load(value), (d, pair)
    assert len(set(names.values())) == len(names)


@pytest.mark.e2e
def test_each_run_is_named_by_the_keys_its_sweep_varies_and_its_config_is_config_yaml(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", "optim.lr=0.1,1", "model.normalize=none,whole", *TINY, "wandb.mode=offline",
               "wandb.analysis=false", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    runs = {name: read_run(sweep / name) for name in summaries(sweep)}
    assert sorted(i["name"] for i in runs.values()) == [
        "optim.lr=0.1 model.normalize=none", "optim.lr=0.1 model.normalize=whole",
        "optim.lr=1 model.normalize=none", "optim.lr=1 model.normalize=whole"]
    _assert_named_by_what_varies(sweep, {d: i["name"] for d, i in runs.items()})
    for d, info in runs.items():  # nested as config.yaml nests it, lists as lists: wandb's UI filters by it
        recorded = yaml.safe_load((sweep / d / "config.yaml").read_text())
        assert {k: v for k, v in info["config"].items() if k != "_wandb"} == recorded
        assert isinstance(info["config"]["snapshot_steps"], list) and info["config"]["optim"]["lr"] in (0.1, 1)
        assert recorded["wandb"]["name"] == info["name"]  # recorded, so a replay names it alike

    # a folder of an older version (its config.yaml has no wandb.name): the export names it the same way,
    # from the Hydra jobs' overrides; an explicit wandb.name is the run's, as in any wandb script
    for d in runs:
        path = sweep / d / "config.yaml"
        cfg = yaml.safe_load(path.read_text())
        del cfg["wandb"]["name"]
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = _export(sweep, "--workers", "1", "--force")
    assert r.returncode == 0, r.stderr
    assert {d: read_run(sweep / d)["name"] for d in runs} == {d: i["name"] for d, i in runs.items()}
    # a batch of one job (an Optuna trial at n_jobs=1) varies nothing within itself: its overrides name it
    study = tmp_path / "study"
    r = launch("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
               "data.p=interval(0.55,0.95)", "objective=test_acc", *TINY, "wandb.mode=offline",
               "wandb.analysis=false", f"hydra.sweep.dir={study}")
    assert r.returncode == 0, r.stderr
    trials = {d: read_run(study / d)["name"] for d in summaries(study)}
    for d, name in trials.items():
        overrides = yaml.safe_load((study / d / ".hydra" / "overrides.yaml").read_text())
        assert name == " ".join(o for o in overrides if not o.startswith("wandb."))
        assert name.startswith(f"data.p={summaries(study)[d]['p']} ")
    assert len(set(trials.values())) == 2
    one = tmp_path / "one"
    r = launch("data.p=1", *TINY, "wandb.mode=offline", "wandb.name=mine", f"hydra.run.dir={one}")
    assert r.returncode == 0, r.stderr
    assert read_run(one)["name"] == "mine"


@pytest.mark.e2e
def test_above_the_per_run_limit_a_packed_runs_table_holds_each_runs_config_and_summary(tmp_path):
    """A packed job's wandb run: its config what its runs share, nested as in config.yaml; its `runs` table
    one row per run, named as its per-run wandb run would be, every config key under its config.yaml path
    with config.yaml's value (lists as lists) and every summary field; `wandb.granularity=run` gives the
    same sweep per-run wandb runs instead."""
    from rw_sweeps.core.summary_fields import ECHOES

    sweep = tmp_path / "S"
    grid = ["-m", "optim.lr=0.1,1", "data=jump_walk", "data.jumps=[0.5,0.5],[0.7,0.3]", *TINY,
            "wandb.mode=offline", "wandb.analysis=false"]
    r = launch(*grid, "wandb.per_run_limit=1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert not list(sweep.glob("[0-9]*/wandb"))  # no per-run wandb runs: packed
    rows = {}
    for job in sorted((sweep / "wandb_jobs").iterdir()):
        info = read_run(job)
        assert info["job_type"] == "packed" and info["group"] == "/".join(sweep.parts[-2:])
        cfg = info["config"]
        assert cfg["data"]["name"] == "jump_walk" and cfg["data"]["K"] == 6 and cfg["optim"]["steps"] == 2
        assert cfg["snapshot_steps"] == yaml.safe_load((sweep / "0" / "config.yaml").read_text())["snapshot_steps"]
        assert "data.K" not in cfg and "jumps" not in cfg["data"] and "lr" not in cfg["optim"]  # nested; swept keys apart
        assert cfg["swept"] == ["data.jumps", "optim.lr"] and cfg["runs"] == info["summary"]["runs"]
        rows.update({row["run"]: row for row in read_table(job, "runs")})
    assert sorted(rows) == sorted(summaries(sweep)) == ["0", "1", "2", "3"]
    for d, row in rows.items():
        recorded = yaml.safe_load((sweep / d / "config.yaml").read_text())
        flat = tracking.leaves(recorded)
        config_cols = {k: v for k, v in row.items() if k in flat or "." in k and not k.startswith("summary.")}
        assert config_cols == flat  # every key, with config.yaml's value: nothing added, nothing stringified
        assert isinstance(row["data.jumps"], list) and row["data.jumps"] == recorded["data"]["jumps"]
        assert row["name"] == recorded["wandb"]["name"]
        summary = json.loads((sweep / d / "summary.json").read_text())
        assert {k: row[k] for k in summary if k not in ECHOES} == {k: v for k, v in summary.items() if k not in ECHOES}
        assert set(ECHOES) & set(row) <= set(flat)  # a copy of a config key is the config's column, once
    _assert_named_by_what_varies(sweep, {d: row["name"] for d, row in rows.items()})

    per_run = tmp_path / "P"  # one setting away: the same grid, a wandb run per training run
    r = launch(*grid, "wandb.per_run_limit=1", "wandb.granularity=run", f"hydra.sweep.dir={per_run}")
    assert r.returncode == 0, r.stderr
    assert not (per_run / "wandb_jobs").exists()
    assert {read_run(per_run / d)["name"] for d in rows} == {row["name"] for row in rows.values()}


# ---------------------------------------------------------------------------------------------------- sync
def _sync(*args: str) -> subprocess.CompletedProcess:
    return python("-m", "rw_sweeps.sweeps.sync", *map(str, args), env={**os.environ, "WANDB_SILENT": "true"})


def _would_sync(text: str, batches: int = 1) -> set[Path]:
    """The run files `wandb sync --dry-run` lists (`wandb: Would sync N run(s):` then one per line), over
    `batches` commands; each listed once."""
    out = text.splitlines()
    starts = [i for i, line in enumerate(out) if line.startswith("wandb: Would sync ")]
    assert len(starts) == batches, out
    listed = []
    for start in starts:
        n = int(out[start].split()[3])
        listed += [(ROOT / line.removeprefix("wandb:").strip()).resolve() for line in out[start + 1:start + 1 + n]]
    assert len(set(listed)) == len(listed)
    return set(listed)


@pytest.mark.e2e
def test_sync_hands_every_offline_run_of_a_sweep_to_wandb_sync_and_follows_no_link(tmp_path, monkeypatch, capfd):
    sweep = tmp_path / "S"
    r = launch("-m", "model.normalize=none,whole", "seed=0,1", *TINY, "wandb.mode=offline", "wandb.analysis=true",
               "wandb.per_run_limit=1", f"hydra.sweep.dir={sweep}")  # packed jobs, and the analysis run
    assert r.returncode == 0, r.stderr
    assert _export(sweep, "--workers", "1").returncode == 0  # and a wandb run per training run
    where = {"run": sorted(sweep.glob("[0-9]*/wandb/offline-run-*/run-*.wandb")),
             "job": sorted(sweep.glob("wandb_jobs/*/wandb/offline-run-*/run-*.wandb")),
             "analysis": sorted(sweep.glob("wandb_analysis/wandb/offline-run-*/run-*.wandb"))}
    assert [len(where["run"]), len(where["analysis"])] == [4, 1] and len(where["job"]) >= 1
    every = {p.resolve() for files in where.values() for p in files}
    r = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", str(sweep)], cwd=ROOT, text=True,
                       capture_output=True, timeout=600)
    assert "No runs to sync" in r.stdout + r.stderr  # wandb's own, given the sweep: why this module exists
    r = _sync(sweep, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"sync {sweep}: {len(every)} offline wandb run(s) to wandb sync" in r.stdout
    assert _would_sync(r.stdout + r.stderr) == every  # wandb sync's own dry run lists each of them, once
    from rw_sweeps.sweeps import sync

    monkeypatch.setattr(sync, "BATCH", 2)  # in batches (a command line has a limit): every batch runs
    capfd.readouterr()
    assert sync.main([str(sweep), "--dry-run"]) == 0
    c = capfd.readouterr()
    assert _would_sync(c.out + c.err, batches=-(-len(every) // 2)) == every

    # planted links: a run folder that is a link, a run's wandb folder that is a link, a link among the files
    # a run would upload: none is followed, and no run with a link in its folder is handed to wandb
    kept = every - {where["run"][1].resolve(), where["run"][2].resolve()}
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not for upload")
    import shutil

    shutil.copytree(sweep / "0", outside / "run", symlinks=True)
    (sweep / "9").symlink_to(outside / "run")
    moved = outside / "wandb1"
    shutil.move(sweep / "1" / "wandb", moved)
    (sweep / "1" / "wandb").symlink_to(moved)
    (where["run"][2].parent / "files" / "planted.txt").symlink_to(outside / "secret")
    r = _sync(sweep, "--dry-run")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"not followed: {sweep / '9'}: a symbolic link" in r.stdout
    assert f"not followed: {sweep / '1' / 'wandb'}: a symbolic link" in r.stdout
    assert f"not synced: {where['run'][2].parent}: a symbolic link in its folder" in r.stdout
    assert _would_sync(r.stdout + r.stderr) == kept
    assert f"{len(every) - 2} offline wandb run(s) to wandb sync, 1 not synced (a link in its folder)" in r.stdout
    r = _sync(sweep / "9")
    assert r.returncode == 2 and "is a symbolic link; not followed" in r.stderr


def test_export_names_older_folders_from_their_overrides_read_as_planted_files(tmp_path):
    """`wandb_export.names`: what the sweep's recorded overrides vary, per folder; a `.hydra` that is a link,
    an overrides.yaml that is not a list of strings, or one over its cap names nothing."""
    from rw_sweeps.sweeps import wandb_export

    def job(name: str, text: str) -> Path:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(text)
        return tmp_path / name

    a = job("0", "- optim.lr=0.1\n- optim.steps=2\n- wandb.mode=offline\n")
    b = job("1", "- optim.lr=1\n- optim.steps=2\n- wandb.mode=online\n")
    bad = job("2", "{a: 1}\n")
    big = job("3", "- x=" + "y" * wandb_export.OVERRIDES_CAP + "\n")
    linked = tmp_path / "4"
    linked.mkdir()
    (linked / ".hydra").symlink_to(b / ".hydra")
    assert wandb_export.names([a, b, bad, big, linked]) == {a: "optim.lr=0.1", b: "optim.lr=1"}


def test_a_runs_table_row_is_the_runs_config_yaml_but_for_a_matrix(tmp_path):
    """runs_table over runs of different options: each row's config columns are its config.yaml's leaves
    (null where its options lack a key), summary copies of config keys are not repeated, and a list of
    more than CELL_CAP numbers (a K×K `data.Pi`) has no column."""
    from rw_sweeps.core import wandb_io

    K = 20
    Pi = [[1.0 / K] * K for _ in range(K)]
    cfgs = [{"seed": 0, "data": {"name": "markov_matrix", "K": K, "Pi": Pi}, "init": {"name": "zero"},
             "snapshot_steps": [0, 1, 2], "wandb": {"name": "init=zero"}},
            {"seed": 0, "data": {"name": "markov_matrix", "K": K, "Pi": Pi}, "init": {"name": "gaussian", "sigma": 0.1},
             "snapshot_steps": [0, 1, 2], "wandb": {"name": "init=gaussian"}}]
    entries = [{"cfg": c, "run_dir": tmp_path / str(i), "summary": {"status": "done", "test_acc": 0.5 + i, "K": K,
                                                                     "run": "x"}}
               for i, c in enumerate(cfgs)]
    cols, rows = wandb_io.runs_table(entries, tmp_path)
    assert cols == ["run", "name", "seed", "data.name", "data.K", "init.name", "snapshot_steps", "wandb.name",
                    "init.sigma", "status", "test_acc", "summary.run"]
    table = [dict(zip(cols, r)) for r in rows]
    assert [t["run"] for t in table] == ["0", "1"] and [t["name"] for t in table] == ["init=zero", "init=gaussian"]
    assert [t["init.sigma"] for t in table] == [None, 0.1] and table[0]["snapshot_steps"] == [0, 1, 2]
    assert [t["test_acc"] for t in table] == [0.5, 1.5] and table[0]["summary.run"] == "x"
    assert wandb_io.CELL_CAP < K * K


def test_the_runs_table_is_the_one_wandbs_constructor_makes_without_its_per_cell_inference(tmp_path):
    """`wandb_io.table` (the runs tables of a packed job and of a sweep's analysis run) against
    wandb.Table(columns, data, allow_mixed_types=True) on rows of every kind a runs table holds (strings,
    numbers, null, bools, lists): the same columns, rows, column types and serialised table. It reads wandb's
    private `_column_types` and `_to_table_json`: this is the adapter's test."""
    from rw_sweeps.core import wandb_io

    wandb = wandb_io.wandb()
    entries = [{"cfg": {"seed": s, "data": {"name": "random_walk", "p": p}, "snapshot_steps": [0, 5],
                        "init": {"name": "gaussian", "sigma": 0.01} if s else {"name": "zero"}},
                "run_dir": tmp_path / str(s),
                "summary": {"status": "done" if s else "diverged", "test_acc": 0.5 * s or None, "trap": bool(s),
                            "break_step": s or None}}
               for s, p in enumerate((0.1, 0.5, 1.0))]
    cols, rows = wandb_io.runs_table(entries, tmp_path)
    ours, theirs = wandb_io.table(cols, rows), wandb.Table(columns=cols, data=rows, allow_mixed_types=True)
    assert ours.columns == theirs.columns and ours.data == theirs.data == [list(r) for r in rows]
    assert ours._column_types.to_json() == theirs._column_types.to_json()
    assert ours._to_table_json() == theirs._to_table_json()
    assert ours.data is not rows  # its own rows: the caller's list is not wandb's


@pytest.mark.e2e
def test_sync_hands_a_sweep_whose_name_starts_with_a_dash_to_wandb_as_a_path(tmp_path):
    """A folder named `-x` (given after `--`, as for any command) is a path to `wandb sync`, never an
    option: wandb's own dry run lists its offline run."""
    import os

    run = tmp_path / "-x" / "0" / "wandb" / "offline-run-20260101_000000-abc"
    run.mkdir(parents=True)
    (run / "run-abc.wandb").touch()
    r = subprocess.run([sys.executable, "-m", "rw_sweeps.sweeps.sync", "--dry-run", "--", "-x"], cwd=tmp_path,
                       text=True, capture_output=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No such option" not in r.stderr
    assert "wandb: Would sync 1 run(s):" in r.stdout + r.stderr
    assert "-x/0/wandb/offline-run-20260101_000000-abc/run-abc.wandb" in r.stdout + r.stderr


def test_sync_shows_a_planted_name_s_control_characters_as_escapes(tmp_path, capsys):
    """A link a stranger planted under a name holding an escape sequence (`\\x1b[2J` clears the screen) or a
    newline (a forged line) is reported with those characters as visible escapes, as rw-status shows them."""
    from rw_sweeps.sweeps import sync

    sweep = tmp_path / "S"
    run = sweep / "0" / "wandb" / "offline-run-20260101_000000-abc"
    run.mkdir(parents=True)
    (sweep / "0" / "a\x1b[2Jb\nnot followed: forged").symlink_to(tmp_path)
    assert sync.main([str(sweep), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and len(out.splitlines()) == 3   # no forged line
    lines = out.splitlines()
    assert lines[0] == f"not followed: {sweep / '0'}/a\\x1b[2Jb\\x0anot followed: forged: a symbolic link"
    assert lines[1].startswith(f"not synced: {run}: a symbolic link in its folder (") and "\x1b" not in lines[1]
    assert lines[2] == f"sync {sweep}: 0 offline wandb run(s) to wandb sync, 1 not synced (a link in its folder)"
