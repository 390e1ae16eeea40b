"""Packed sweeps: grouping by shape, chunking by memory, isolation inside a chunk, memory per run."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from rw_sweeps.core import resources
from rw_sweeps.core.config import RunConfig, data_config, validate
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.optimisers.gd import Gd
from rw_sweeps.sweeps import packing, run
from rw_sweeps.sweeps.planner import Spec

from .conftest import ROOT, SMALL, launch, summaries

OFF = dataclasses.replace(RunConfig().wandb, mode="disabled")


def mk(**kw) -> RunConfig:
    return validate(RunConfig(wandb=OFF, **kw))


def test_mixed_shape_grids_split_into_the_right_groups(tmp_path, monkeypatch):
    cfgs = ([mk(data=data_config(p=p), seed=s) for p in (0.1, 0.5) for s in range(3)]  # one shape, 6 runs
            + [mk(data=data_config(K=20, N=101, p=0.5))]  # another K, N
            + [mk(precision="float32"), mk(optim=Gd(steps=20)), mk(model=ModelConfig(M=500))]
            # same shape as the first 6 (normalize=auto would make it whole: set to the zero-init runs' none)
            + [mk(init=GaussianInit("gaussian", 0.01), optim=Gd(lr=0.3), model=ModelConfig(normalize="none"))])
    runs = [Spec(i, [], {}, {}, {"job": {}}, output_dir=str(tmp_path / str(i)), cfg=c) for i, c in enumerate(cfgs)]
    runs[1].base_hydra["job"]["env_set"] = {"OMP_NUM_THREADS": "1"}  # env_set is process-wide: its own chunk
    groups = packing.chunks(runs, memory_gb=100)
    assert sorted(sorted(r.num for r in g) for g in groups) == [[0, 2, 3, 4, 5, 10], [1], [6], [7], [8], [9]]
    # memory caps a chunk; chunks of a group are balanced
    runs[1].base_hydra["job"]["env_set"] = {}
    small = packing.chunks(runs[:6], memory_gb=3 * resources.bytes_per_run(cfgs[0]) / 2**30)
    assert [len(g) for g in small] == [3, 3]
    assert [len(g) for g in packing.chunks(runs[:6], memory_gb=100, max_runs=4)] == [3, 3]
    # the launch's first runs are a chunk of their own (the first training line of a large grid comes as soon as
    # a small grid's); the rest of their group, and every other group, is cut as before
    cut = [[r.num for r in g] for g in packing.chunks(runs, memory_gb=100, first=2)]
    assert cut == [[0, 1], [2, 3, 4, 5, 10], [6], [7], [8], [9]]
    assert [len(g) for g in packing.chunks(runs[:6], memory_gb=100, max_runs=3, first=2)] == [2, 2, 2]
    assert [len(g) for g in packing.chunks(runs[:6], memory_gb=100, first=6)] == [6]
    monkeypatch.setattr(packing, "FIRST_RUNS", 2)  # what the CPU's plan cuts first
    assert [[r.num for r in g] for g in packing.plan_in_process(runs, {"memory_gb": None}, True).jobs] == cut


def test_a_diverging_run_does_not_disturb_its_chunk(tmp_path):
    good = [mk(data=data_config(p=p, n_test=200), optim=Gd(steps=10)) for p in (0.3, 0.5)]
    bad = mk(data=data_config(p=0.5, n_test=200), optim=Gd(steps=10), init=GaussianInit("gaussian", 1.0),
             model=ModelConfig(normalize="none"))  # un-normalised, as the zero-init runs it shares a batch with
    bad_and_good = run.run_batch([good[0], bad, good[1]], [tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    alone = run.run_batch(good, [tmp_path / "x", tmp_path / "y"])
    assert [s["status"] for s in bad_and_good] == ["done", "diverged", "done"]
    for s, t in zip([bad_and_good[0], bad_and_good[2]], alone):
        assert abs(s["test_acc"] - t["test_acc"]) < 1e-12 and abs(s["train_loss"] - t["train_loss"]) < 1e-12
    hist = (tmp_path / "b" / "history.jsonl").read_text().splitlines()
    assert len(hist) == 1 and json.loads(hist[0])["train_loss"] is None  # kept, up to the divergence


@pytest.mark.e2e
def test_packed_sweep_equals_unpacked_sweep_run_by_run(tmp_path):
    """Hydra's basic launcher (one run_job per run) and the packed launcher give the same results and the
    same Hydra job folders: .hydra/config.yaml and overrides.yaml byte for byte, hydra.yaml but for the
    launcher's own node, a job log with the run's line. The packed side writes each chunk's results behind
    (on the writer thread, while the next chunk trains)."""
    args = ["-m", "data.p=0,0.3,0.5,1", "init=zero,gaussian", *SMALL, "wandb.mode=disabled"]
    a = launch(*args, "hydra/launcher=packed", "hydra.launcher.write_behind=true", "hydra.launcher.max_runs_per_job=2",
               f"hydra.sweep.dir={tmp_path / 'packed'}", cwd=tmp_path)
    b = launch(*args, "hydra/launcher=local", f"hydra.sweep.dir={tmp_path / 'local'}", cwd=tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    pa, pb = summaries(tmp_path / "packed"), summaries(tmp_path / "local")
    assert sorted(pa) == sorted(pb) == [str(i) for i in range(8)]
    for k in pa:
        ca, cb = (yaml.safe_load((tmp_path / d / k / "config.yaml").read_text()) for d in ("packed", "local"))
        assert ca["wandb"].pop("group").endswith("packed") and cb["wandb"].pop("group").endswith("local")
        assert ca == cb
        for key in ("test_acc", "train_loss", "test_kl", "parent_attention", "attention_spread", "pred_dist"):
            assert abs(pa[k][key] - pb[k][key]) < 1e-8, (k, key)
        ha = [json.loads(x) for x in (tmp_path / "packed" / k / "history.jsonl").read_text().splitlines()]
        hb = [json.loads(x) for x in (tmp_path / "local" / k / "history.jsonl").read_text().splitlines()]
        assert len(ha) == len(hb) == 11
        assert [h["step"] for h in ha] == list(range(11))
        for x, y in zip(ha, hb):
            for key, v in x.items():
                assert v == y[key] if v is None else abs(v - y[key]) <= 1e-8, (k, x["step"], key)
        packed, local = tmp_path / "packed" / k, tmp_path / "local" / k
        for name in ("config.yaml", "overrides.yaml"):
            assert (packed / ".hydra" / name).read_text() == (local / ".hydra" / name).read_text().replace(
                "/local", "/packed")
        ha_, hb_ = (yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())["hydra"] for d in (packed, local))
        for h in (ha_, hb_):
            h.pop("launcher"), h["runtime"].pop("output_dir"), h["runtime"]["choices"].pop("hydra/launcher")
            h["overrides"]["hydra"] = [o for o in h["overrides"]["hydra"] if "sweep.dir" not in o and "launcher" not in o]
            h["sweep"].pop("dir"), h["job"].pop("id")
        assert ha_ == hb_
        for d in (packed, local):
            log = (d / "rw.log").read_text()
            assert log.count("done: p=") == 1 and "[rw_sweeps.sweeps.app][INFO]" in log


MEASURE = """
import dataclasses, sys, tempfile
from rw_sweeps.sweeps import run
from rw_sweeps.core.config import RunConfig, validate
R = int(sys.argv[1])
base = validate(RunConfig(wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"), eval_every=10))
d = tempfile.mkdtemp()
run.run_batch([dataclasses.replace(base, seed=i) for i in range(R)], [f"{d}/{i}" for i in range(R)], progress=False)
# this image's peak RSS in bytes: VmHWM, since getrusage's ru_maxrss carries the test runner's peak over the exec
print(1024 * next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")))
"""


def _peak(R: int) -> int:
    return int(subprocess.run([sys.executable, "-c", MEASURE, str(R)], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_memory_per_run_is_bounded():
    # §5 shape (K=6, N=97, M=1000, 1000 + 1000 sequences): the dense formulation needs X̃ of
    # n·(K+M)·N·8 B ≈ 0.78 GB per 1000 sequences; the compact engine needs a few MB per run. What one more run
    # in a batch costs is the peaks' difference between two batch sizes: the interpreter, torch and the kernel
    # are in both.
    small, large = 8, 40
    per_run = (_peak(large) - _peak(small)) / (large - small)
    c = RunConfig()
    dense = c.data.n_train * (c.data.K + c.model.M) * c.data.N * 8
    assert 0 < per_run <= resources.bytes_per_run(c), (per_run, resources.bytes_per_run(c))
    assert per_run < dense / 100


@pytest.mark.e2e
def test_packed_jobs_log_one_wandb_run_with_a_runs_table(tmp_path):
    import pandas as pd

    from .wandb_files import read_run

    sweep = tmp_path / "s"
    r = launch("-m", "data.p=0.2,0.5,0.8", "seed=0,1", *SMALL, "wandb.mode=offline", "wandb.granularity=job",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    jobs = sorted((sweep / "wandb_jobs").iterdir())
    assert len(jobs) == 1  # one shape, one chunk, one wandb run
    wb = read_run(jobs[0])
    assert wb["job_type"] == "packed" and wb["group"] == "/".join(sweep.parts[-2:])
    assert wb["config"]["runs"] == 6 and wb["config"]["swept"] == ["data.p", "seed"]
    assert wb["config"]["data"]["K"] == 6  # keys shared by every run are the job's config, nested as in config.yaml
    hist = pd.read_parquet(jobs[0] / "history.parquet")
    assert len(hist) == 6 * 11 and set(hist["data.p"]) == {0.2, 0.5, 0.8}
    assert set(hist["name"]) == {f"data.p={p} seed={s}" for p in (0.2, 0.5, 0.8) for s in (0, 1)}
    s = summaries(sweep)
    ours = hist[hist["step"] == 10].set_index("run_id")["test_acc"].to_dict()
    assert ours == {v["run_id"]: v["test_acc"] for v in s.values()}
    assert not [d for d in sweep.glob("*/wandb")
                if (d.parent / "summary.json").exists()]  # no per-run wandb runs at this granularity
