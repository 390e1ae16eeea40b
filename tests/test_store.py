"""The sweep store as its users meet it: which sweeps are stored, what a store sweep holds, and that every reader
of a sweep (placement and the skip, the contract, rw-status) treats a stored run as it treats a run folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rw_sweeps.core import contract, store
from rw_sweeps.core.store import shard
from rw_sweeps.sweeps import status

from .conftest import ROOT, launch, summaries

TINY = ["data.n_train=16", "data.n_test=16", "data.N=9", "model.M=20", "optim.steps=3", "wandb.mode=disabled"]
pytestmark = pytest.mark.e2e


def files(sweep: Path) -> list[str]:
    return sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*"))


def test_a_new_sweep_of_store_from_runs_is_stored_and_a_smaller_one_keeps_its_folders(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    r = launch("-m", *TINY, f"seed=range(0,{store.STORE_FROM})", f"hydra.sweep.dir={big}")
    assert r.returncode == 0, r.stderr
    r = launch("-m", *TINY, "seed=range(0,3)", f"hydra.sweep.dir={small}")
    assert r.returncode == 0, r.stderr
    assert store.present(big) and not store.present(small)
    assert all((small / str(i) / "summary.json").is_file() for i in range(3))
    # the stored sweep: no run folder, a handful of files for a thousand runs
    assert {n for n in os.listdir(big) if not n.startswith(".")} == {"multirun.yaml", "store"}
    entries = files(big)
    assert len(entries) <= 8, entries  # store/, its sweep.id and two files a job
    idx = store.index(big)
    assert sorted(idx.runs, key=int) == [str(i) for i in range(store.STORE_FROM)]
    assert idx.refused == {} and idx.duplicates == {}
    got = summaries(big)
    assert len(got) == store.STORE_FROM and {s["status"] for s in got.values()} == {"done"}
    assert sorted(s["seed"] for s in got.values()) == list(range(store.STORE_FROM))


def test_a_store_sweep_holds_heads_bodies_the_job_log_and_its_hydra_config(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", *TINY, "data.p=0.1,0.5", "seed=0,1", "hydra.launcher.store=true",
               "hydra.launcher.max_runs_per_job=2", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    names = os.listdir(sweep / "store")
    assert store.sweep_id(sweep) is not None and "sweep.id" in names  # the store's own id, sealed into its heads
    names.remove("sweep.id")
    jobs = {n.split("-")[0] for n in names}
    assert len(jobs) == 2  # two packed jobs, each its own writer id
    for job in jobs:  # two files a job: ~0.007 a run for the §5 shape's CPU jobs of 286 runs
        assert sorted(n for n in names if n.startswith(job)) == [f"{job}-00000.body.parquet", f"{job}-00000.runs.parquet"]
    hydra = {store.index(sweep).heads[sid][1]["hydra"] for sid in store.index(sweep).heads}
    assert len(hydra) == 2 and all("job:" in h and "sweep:" in h for h in hydra)  # each job's hydra.yaml, in its head
    # no checkpoint is left once every run is stored
    assert not [n for n in names if n.endswith(shard.CHECKPOINT)]
    idx = store.index(sweep)
    config, summary = idx.record("3")
    assert config["data"]["p"] == 0.5 and config["seed"] == 1 and summary["status"] == "done"
    assert contract.judge(sweep / "3").state == "done"  # a run with no folder: judged by its record
    assert contract.judge(sweep / "4").state == "unfinished"


def test_a_relaunch_skips_stored_runs_and_trains_only_the_new_ones(tmp_path):
    sweep = tmp_path / "S"
    first = launch("-m", *TINY, "seed=0,1,2", "hydra.launcher.store=true", f"hydra.sweep.dir={sweep}")
    assert first.returncode == 0, first.stderr
    before = {n: (sweep / "store" / n).read_bytes() for n in os.listdir(sweep / "store")}
    again = launch("-m", *TINY, "seed=0,1,2,3", f"hydra.sweep.dir={sweep}")  # the store is kept: no key needed
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1].endswith("4 runs: 1 done, 3 skipped, 0 failed, 0 diverged")
    for n, raw in before.items():  # a finished record is never rewritten
        assert (sweep / "store" / n).read_bytes() == raw
    assert not (sweep / "3").exists()  # the new run is stored too
    assert sorted(store.index(sweep).runs) == ["0", "1", "2", "3"]
    snap = status.Sweep(sweep, whole=True).poll(ask_slurm=False)
    assert sorted(snap.states) == ["0", "1", "2", "3"] and set(snap.states.values()) <= {"done", "skipped"}


def test_rw_status_counts_stored_runs_and_names_a_refused_shard_in_one_line(tmp_path):
    sweep = tmp_path / "S"
    r = launch("-m", *TINY, "seed=0,1", "hydra.launcher.store=true", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    st = status.main([str(sweep)])
    assert st == 0
    head = next(p for p in (sweep / "store").iterdir() if p.name.endswith(shard.HEAD))
    raw = bytearray(head.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    head.write_bytes(bytes(raw))
    idx = store.index(sweep)
    assert idx.runs == {} and list(idx.refused) == [head.name]
    assert "does not verify" in idx.refused[head.name] or "not a whole head" in idx.refused[head.name]
    again = launch("-m", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr
    lines = [ln for ln in again.stdout.splitlines() if ln.startswith("not a record:")]
    assert len(lines) == 1 and head.name in lines[0] and lines[0].endswith("no run is done by it")
    assert again.stdout.strip().splitlines()[-1].endswith("2 runs: 2 done, 0 skipped, 0 failed, 0 diverged")


def test_a_sweep_of_run_folders_keeps_its_folders_when_it_grows_past_store_from(tmp_path):
    sweep = tmp_path / "S"
    assert launch("-m", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep}").returncode == 0
    r = launch("-m", *TINY, f"seed=range(0,{store.STORE_FROM + 1})", "hydra.launcher.max_runs_per_job=2000",
               f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert not store.present(sweep)
    assert (sweep / str(store.STORE_FROM) / "summary.json").is_file()
    assert r.stdout.strip().splitlines()[-1].endswith(f"{store.STORE_FROM + 1} runs: {store.STORE_FROM - 1} done, "
                                                      "2 skipped, 0 failed, 0 diverged")


def test_the_store_key_is_a_boolean_or_null(tmp_path):
    r = launch("-m", *TINY, "seed=0", "hydra.launcher.store=maybe", f"hydra.sweep.dir={tmp_path / 'S'}")
    assert r.returncode != 0
    assert "hydra.launcher.store" in r.stderr and not (tmp_path / "S" / "store").exists()


def test_a_stored_record_equals_the_run_folder_of_the_same_run(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    for sweep, stored in ((a, "true"), (b, "false")):
        r = launch("-m", *TINY, "data.p=0.2", "seed=3", f"hydra.launcher.store={stored}", f"hydra.sweep.dir={sweep}")
        assert r.returncode == 0, r.stderr
    config, summary = store.index(a).record("0")
    folder = contract.judge(b / "0")
    assert {**config, "wandb": None} == {**folder.config, "wandb": None}  # wandb's group: the sweep folder
    ignore = {"wall_s", "run_id"}
    assert {k: v for k, v in summary.items() if k not in ignore} == \
        {k: v for k, v in json.loads((b / "0" / "summary.json").read_text()).items() if k not in ignore}
    history, snapshots = store.body_rows(a, ["0"])["0"]
    assert history == list(contract.rows(b / "0", contract.HISTORY))
    assert snapshots == list(contract.rows(b / "0", contract.SNAPSHOTS))


def test_a_body_whose_head_was_never_written_is_removed_by_the_next_launch(tmp_path):
    sweep = tmp_path / "S"
    assert launch("-m", *TINY, "seed=0,1", "hydra.launcher.store=true", f"hydra.sweep.dir={sweep}").returncode == 0
    (head,) = (sweep / "store").glob("*.runs.parquet")
    body = head.with_name(head.name.replace(".runs.parquet", ".body.parquet"))
    head.unlink()  # as a job killed between its flush's two renames leaves it
    planted = sweep / "store" / "notes.body.parquet"  # a name no writer makes: not the project's, left alone
    planted.write_bytes(b"mine")
    r = launch("-m", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert f"removed {body}: a body whose head was never written (no record)" in r.stdout + r.stderr
    assert not body.exists() and planted.read_bytes() == b"mine"
    assert r.stdout.strip().splitlines()[-1].endswith("2 runs: 2 done, 0 skipped, 0 failed, 0 diverged")


READ_EVERYTHING = """
import os, sys, threading
from analysis.load import load_history, load_runs
from rw_sweeps.sweeps import show, status

def native():  # the process's threads, less Python's own (tqdm's monitor): what C++ started
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())

before = native()
sweep = sys.argv[1]
assert status.main([sweep]) == 0
runs = load_runs(sweep, progress=False)
assert len(runs) == 4 and len(load_history(runs)) > 0
assert show.main([sweep, "0"]) == 0
print("threads", before, native())
"""


def test_the_readers_of_a_store_start_no_native_thread_that_could_outlive_them(tmp_path):
    """Arrow's thread pools, started by a threaded read, can abort a process at its exit after its work is done
    (`terminate called without an active exception`, exit -6, seen once from rw-status): every read of the
    store is done in the reading thread, so no such thread exists when a reader exits."""
    sweep = tmp_path / "S"
    r = launch("-m", *TINY, "data.p=0.1,0.5", "seed=0,1", "hydra.launcher.store=true", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "read.py"
    script.write_text(READ_EVERYTHING)
    got = subprocess.run([sys.executable, str(script), str(sweep)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stderr
    before, after = map(int, got.stdout.strip().splitlines()[-1].split()[1:])
    assert after == before, got.stdout
