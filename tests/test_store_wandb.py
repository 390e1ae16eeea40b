"""The wandb export and sync of a sweep whose runs its store holds: each stored run replayed from its verified
record into `<sweep>/wandb_store/<run id>/` (no run folder made), skipped once exported, refused where its
body does not verify; above `EXPORT_ALL` runs, a fixed sample and the per-cell table. Real offline wandb files
(read back with tests/wandb_files.py)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from rw_sweeps.core import contract, metrics, results, store
from rw_sweeps.core.config import canonical

from .conftest import launch, python
from .wandb_files import read_run, read_table

TINY = ["optim.steps=2", "data.n_train=64", "data.n_test=64", "model.M=200"]


def _export(*args: str) -> subprocess.CompletedProcess:
    return python("-m", "rw_sweeps.sweeps.wandb_export", *map(str, args), env={**os.environ, "WANDB_SILENT": "true"})


def _stored_sweep(sweep, *grid: str) -> None:
    r = launch("-m", *grid, *TINY, "wandb.mode=disabled", "hydra.launcher.store=true",
               "hydra.launcher.max_runs_per_job=2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert store.present(sweep)


def _body(sweep, name: str) -> list[dict]:
    return store.body_rows(sweep, [name])[name][0]


@pytest.mark.e2e
def test_a_store_sweep_exports_each_run_from_its_record_and_syncs(tmp_path):
    sweep = tmp_path / "S"
    _stored_sweep(sweep, "data.p=0.3,0.7", "seed=0,1")
    idx = store.index(sweep)
    names = sorted(idx.runs)
    assert names == ["0", "1", "2", "3"]
    r = _export(sweep, "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wandb export {sweep}: 4 exported, 0 skipped (0 already exported, 0 unfinished), 0 failed"
    assert sorted(os.listdir(sweep)) == [".rw_sweep.json", "multirun.yaml", "store", "wandb_store"]  # no run folder
    for name in names:
        config, summary = idx.record(name)
        run_id = results.run_id(sweep / name)
        home = sweep / "wandb_store" / run_id
        wb = read_run(home)
        assert wb["id"] == run_id == summary["run_id"] and wb["job_type"] == "train"
        assert wb["group"] == config["wandb"]["group"] == "/".join(sweep.parts[-2:])
        assert wb["name"] == config["wandb"]["name"] and wb["name"].startswith(f"data.p={summary['p']:g} seed=")
        assert {k: v for k, v in wb["config"].items() if k != "_wandb"} == \
            {**canonical(config), "wandb": {**canonical(config)["wandb"], "mode": "offline"}}
        history = _body(sweep, name)
        assert [h["step"] for h in wb["history"]] == [h["step"] for h in history] == [0, 1, 2]
        assert [h["test_acc"] for h in wb["history"]] == [h["test_acc"] for h in history]
        assert wb["summary"]["test_acc"] == summary["test_acc"] and wb["summary"]["status"] == "done"
        marker = json.loads((home / ".wandb_exported.json").read_text())
        assert marker["run"] == name and marker["run_id"] == run_id and marker["mode"] == "offline"
        assert contract.judge(sweep / name).state == "done"  # still judged by its record: no folder was made

    r = _export(sweep, "--workers", "1")
    assert r.stdout.strip().endswith("0 exported, 4 skipped (4 already exported, 0 unfinished), 0 failed"), r.stdout
    r = _export(sweep, "--workers", "2", "--force")
    assert r.stdout.strip().endswith("4 exported, 0 skipped (0 already exported, 0 unfinished), 0 failed"), r.stdout
    for name in names:  # redone in place: one offline run per training run, never two
        home = sweep / "wandb_store" / results.run_id(sweep / name)
        assert len(list((home / "wandb").glob("offline-run-*"))) == 1

    r = python("-m", "rw_sweeps.sweeps.sync", sweep, "--dry-run", env={**os.environ, "WANDB_SILENT": "true"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"sync {sweep}: 4 offline wandb run(s) to wandb sync" in r.stdout
    assert f"sync {sweep}: its store holds 4 run(s), 4 of them with an offline wandb run here" in r.stdout
    listed = {line.split()[-1] for line in (r.stdout + r.stderr).splitlines() if line.strip().endswith(".wandb")}
    assert listed == {str(p) for p in sweep.glob("wandb_store/*/wandb/offline-run-*/run-*.wandb")} and len(listed) == 4

    # a body that does not verify: its shard is no record (its runs are not done, as for every reader), the
    # export names it in one line and ends 1
    sid = idx.runs["0"][0]
    body = sweep / "store" / f"{sid}.body.parquet"
    raw = bytearray(body.read_bytes())
    raw[len(raw) // 3] ^= 0xFF
    body.write_bytes(bytes(raw))
    held = sorted(n for n, (s, _, _) in idx.runs.items() if s == sid)
    r = _export(sweep, "--workers", "1", "--force")
    assert r.returncode == 1 and 0 < len(held) < 4
    assert r.stdout.strip().endswith(f"{4 - len(held)} exported, 0 skipped (0 already exported, 0 unfinished), "
                                     "0 failed"), r.stdout
    assert r.stderr.splitlines() == [f"not a record: {body}: it is not the body its head was sealed with (edited, "
                                     "truncated or replaced); no run is exported from it"]


@pytest.mark.e2e
def test_above_export_all_a_fixed_sample_and_the_per_cell_table_are_logged(tmp_path, monkeypatch, capsys):
    from rw_sweeps.sweeps import wandb_export

    sweep = tmp_path / "S"
    _stored_sweep(sweep, "data.p=0.3,0.7", "seed=0,1,2")
    idx = store.index(sweep)
    records = {n: idx.record(n) for n in idx.runs}
    assert len(records) == 6
    monkeypatch.setattr(wandb_export, "EXPORT_ALL", 4)
    monkeypatch.setattr(wandb_export, "SAMPLE", 2)
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert wandb_export.main([str(sweep), "--workers", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"wandb export {sweep}: 6 runs, above 4: 2 of them logged (a fixed sample, the same at every "
                   f"export) and the table of its 2 cells (data.p) in {sweep / 'wandb_store' / 'cells'}",
                   f"wandb export {sweep}: 2 exported, 0 skipped (0 already exported, 0 unfinished), 0 failed"]
    lowest = sorted(records, key=lambda n: hashlib.sha1(n.encode()).hexdigest())[:2]
    ids = {results.run_id(sweep / n): n for n in records}
    logged = sorted(p.name for p in (sweep / "wandb_store").iterdir() if p.name != "cells")
    assert sorted(ids[i] for i in logged) == sorted(lowest)
    for run_id in logged:
        assert read_run(sweep / "wandb_store" / run_id)["summary"]["test_acc"] == records[ids[run_id]][1]["test_acc"]

    cells = read_run(sweep / "wandb_store" / "cells")
    assert cells["job_type"] == "cells" and cells["id"] == wandb_export.cells_id(sweep)
    assert cells["summary"]["runs"] == 6 and cells["summary"]["cells"] == 2 and cells["config"]["swept"] == ["data.p"]
    table = {row["data.p"]: row for row in read_table(sweep / "wandb_store" / "cells", "cells")}
    assert sorted(table) == [0.3, 0.7]
    for p, row in table.items():
        runs = [s for _, s in records.values() if s["p"] == p]
        accs = [s["test_acc"] for s in runs]
        won = sum(metrics.succeeded(s) for s in runs)
        assert (row["runs"], row["done"], row["success"]) == (3, 3, won) and row["success_rate"] == won / 3
        assert row["test_acc_min"] == min(accs) and row["test_acc_max"] == max(accs)
        assert row["test_acc_mean"] == pytest.approx(sum(accs) / 3, rel=1e-12)

    assert wandb_export.main([str(sweep), "--workers", "1"]) == 0  # the same sample again: already exported
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"wandb export {sweep}: 0 exported, 2 skipped (2 already exported, 0 unfinished), 0 failed"
    assert len(list((sweep / "wandb_store" / "cells" / "wandb").glob("offline-run-*"))) == 1  # replaced, not added
