"""`packed_gpus` without GPUs: the per-GPU plan against fake per-GPU free memory (torch.cuda mocked), one
process per GPU (submitit's executor faked), a chunk that raises failing only its own runs, and the real
preset on this CPU-only box (one process for every chunk)."""
from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from hydra_plugins.rw_sweeps_plugins import launcher as L
from rw_sweeps.sweeps import packing
from rw_sweeps.core.config import RunConfig
from rw_sweeps.core.resources import bytes_per_run
from rw_sweeps.sweeps.packing import chunk_sizes

from .conftest import SMALL, launch, summaries

GB = 2**30


def _specs(n: int, **data) -> list:
    """Planned jobs as plan_devices sees them: a config (its shape) and the job's hydra node (env_set)."""
    out = []
    for i in range(n):
        cfg = RunConfig(seed=i)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **data))
        out.append(SimpleNamespace(cfg=cfg, base_hydra={"job": {}}, num=i))
    return out


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four visible GPUs with the given free bytes each (torch.cuda.mem_get_info(i) → (free[i], total))."""
    free: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(free))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (free[i], 141 * GB))
    return free


def test_each_gpu_gets_chunks_sized_to_its_own_free_memory_and_memory_gb(fake_gpus):
    fake_gpus[:] = [int(0.5 * GB), int(0.125 * GB), int(0.05 * GB), int(0.005 * GB)]  # the last: < one run
    per = bytes_per_run(_specs(1)[0].cfg)  # ~7.5 MB at the §5 shape
    assert packing.gpu_budgets_gb(None) == pytest.approx([0.8 * f / GB for f in fake_gpus])
    budgets = packing.gpu_budgets_gb(0.08)  # memory_gb caps the two large GPUs only
    assert budgets == pytest.approx([0.08, 0.08, 0.04, 0.004])

    specs = _specs(300) + _specs(50, n_train=200)  # two shapes: two groups, each spread over the GPUs
    plan = packing.plan_devices(specs, budgets)
    assert len(plan) == 4
    for g, chunks in enumerate(plan):
        for chunk in chunks:
            assert len({(c.cfg.data.n_train) for c in chunk}) == 1  # one shape per chunk
            assert len(chunk) * bytes_per_run(chunk[0].cfg) <= budgets[g] * GB <= 0.08 * GB
    assert plan[3] == []  # too small for one run: nothing planned there
    assert all(plan[g] for g in range(3))  # every GPU that fits a run is used
    seen = Counter(id(s) for chunks in plan for chunk in chunks for s in chunk)
    assert sorted(seen) == sorted(id(s) for s in specs) and set(seen.values()) == {1}  # each run exactly once
    big = [sum(len(c) for c in plan[g] if c[0].cfg.data.n_train == 1000) for g in range(3)]
    assert max(big) - min(big) <= 1  # a group's runs are balanced over the GPUs, whatever their memory
    assert max(len(c) for c in plan[2] if c[0].cfg.data.n_train == 1000) == int(0.04 * GB // per)  # more, smaller
    assert packing.plan_devices(specs, budgets, max_runs=3) and all(
        len(c) <= 3 for chunks in packing.plan_devices(specs, budgets, max_runs=3) for c in chunks)


def test_equal_gpus_share_a_grid_evenly_and_a_tiny_grid_leaves_gpus_idle(fake_gpus):
    fake_gpus[:] = [int(100 * GB)] * 8
    plan = packing.plan_devices(_specs(1000), packing.gpu_budgets_gb(None))
    assert [sum(map(len, chunks)) for chunks in plan] == [125] * 8 and all(len(chunks) == 1 for chunks in plan)
    plan = packing.plan_devices(_specs(3) + _specs(3, n_test=200), packing.gpu_budgets_gb(None))
    assert sorted(sum(map(len, chunks)) for chunks in plan) == [0, 0, 1, 1, 1, 1, 1, 1]  # 2 groups of 3: 6 GPUs
    assert chunk_sizes(10, 4, 16) == [4, 3, 3] and chunk_sizes(5, 10, 1) == [1] * 5  # at least one run a chunk


def test_a_gpu_worker_keeps_its_cached_memory_as_free(fake_gpus, monkeypatch):
    """Chunk after chunk in one process: what the caching allocator holds but does not use counts as free."""
    from rw_sweeps.core.resources import gpu_free_bytes

    fake_gpus[:] = [int(10 * GB)]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 6 * GB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 1 * GB)
    assert gpu_free_bytes() == [15 * GB]


class _Executor:
    """submitit.LocalExecutor, in this process: records its setup and what it was given."""
    made: list = []

    def __init__(self, folder):
        self.setup, self.submitted = [], []
        _Executor.made.append(self)

    def update_parameters(self, **kw):
        self.setup = kw.get("setup", [])

    def submit(self, payload):
        self.submitted.append(payload)
        try:
            value, error = payload(), None
        except Exception as exc:  # noqa: BLE001
            value, error = None, exc

        def result():
            if error is not None:
                raise error
            return value
        return SimpleNamespace(done=lambda: True, result=result)


def test_packed_gpus_starts_one_process_per_gpu(monkeypatch):
    import submitit

    monkeypatch.setattr(submitit, "LocalExecutor", _Executor)
    _Executor.made = []
    monkeypatch.setattr(packing, "visible_gpus", lambda: ["0", "1", "GPU-ab12"])
    launcher = L.RwLauncher(**{f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                               for f in dataclasses.fields(L.RwLauncherConf)})
    jobs = [lambda g=g: [f"chunk {g}.0", f"chunk {g}.1"] for g in ("0", "GPU-ab12")]
    out = launcher._local_gpus([jobs[0], None, jobs[1]], pinned=True)  # GPU 1 has nothing to do
    assert out == [["chunk 0.0", "chunk 0.1"], [], ["chunk GPU-ab12.0", "chunk GPU-ab12.1"]]
    assert [len(ex.submitted) for ex in _Executor.made] == [1, 0, 1]  # one process per GPU, none when idle
    assert [ex.setup for ex in _Executor.made] == [[f"export CUDA_VISIBLE_DEVICES={g}"] for g in ("0", "1", "GPU-ab12")]
    with pytest.raises(ValueError):
        launcher._local_gpus([jobs[0]] * 4, pinned=True)


class _FakeChunkJob:
    def __init__(self, n: int, fail: bool = False):
        self.chunk, self.fail, self.n = SimpleNamespace(specs=[object()] * n, job_id=None), fail, n

    def _train(self):
        if self.fail:
            raise RuntimeError("CUDA error: out of memory\n(the chunk's own)")
        return [f"return {i}" for i in range(self.n)]


def test_a_chunk_that_raises_fails_its_runs_only_and_the_gpu_s_next_chunks_run(capsys):
    out = L.GpuJob([_FakeChunkJob(2), _FakeChunkJob(3, fail=True), _FakeChunkJob(1)])()
    assert out[0] == ["return 0", "return 1"] and out[2] == ["return 0"]
    assert isinstance(out[1], RuntimeError)  # the launcher reads that chunk's runs from their folders
    assert "a chunk of 3 run(s) failed: RuntimeError: CUDA error: out of memory\n" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CPU fallback is not exercised")
def test_packed_gpus_without_a_gpu_trains_every_chunk_in_one_process(tmp_path):
    sweep = tmp_path / "sweep"
    r = launch("-m", "hydra/launcher=packed_gpus", "hydra.launcher.max_runs_per_job=1", "data.p=0.3,0.5,0.7",
               *SMALL, "wandb.mode=disabled", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    assert "packed: 3 runs in 3 job(s) on cpu;" in r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 3 runs: 3 done, 0 skipped, 0 failed, 0 diverged"
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 1 and logs[0].read_text().count("done: p=") == 3  # one process, its three chunks
    for n in ("0", "1", "2"):  # each run still its own Hydra job
        assert {p.name for p in (sweep / n / ".hydra").iterdir()} == {"config.yaml", "hydra.yaml", "overrides.yaml"}
        assert (sweep / n / "rw.log").read_text().count("done: p=") == 1
    assert all(s["status"] == "done" for s in summaries(sweep).values())
