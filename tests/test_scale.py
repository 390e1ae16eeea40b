"""The contracts for scale: the step loop never waits on the device, multi-step kernel calls
between evaluations change nothing, and a run's results do not depend on the chunk it trains in."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from rw_sweeps.core import training
from rw_sweeps.core.config import RunConfig, validate


def cfgs(n: int = 3, **top) -> list[RunConfig]:
    base = RunConfig(**top)
    return [validate(dataclasses.replace(base, seed=s, data=dataclasses.replace(base.data, p=p, n_train=96, n_test=80)))
            for s, p in zip(range(n), (0.5, 0.2, 0.9, 1.0, 0.35))]


# Every way a CPU tensor can be read back to Python: each one is a device-to-host copy (and a sync) on a GPU.
READS = ["tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero"]


def reads_during_training(monkeypatch, steps: int) -> Counter:
    """How many device reads one training call makes, on the PyTorch path (the one GPUs run)."""
    monkeypatch.setenv("RW_SWEEPS_BACKEND", "torch")
    runs = [dataclasses.replace(c, optim=dataclasses.replace(c.optim, steps=steps)) for c in cfgs(snapshot_steps=[0])]
    counts: Counter = Counter()
    on = []  # counting starts when the step loop's log is made: data and initial state come before it
    log_init = training._Log.__init__
    monkeypatch.setattr(training._Log, "__init__", lambda self, *a: (on.append(1), log_init(self, *a))[1])
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            counts[_name] += bool(on)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    original_getitem = torch.Tensor.__getitem__

    def getitem(self, idx):  # boolean-mask indexing has a data-dependent size: a sync on a GPU
        if isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
            counts["mask-index"] += bool(on)
        return original_getitem(self, idx)

    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    # the discipline of a device, where a read waits for it (on a CPU the prediction check may read its flags)
    monkeypatch.setattr(training._Log, "HOST_READS", False)
    training.train(runs, [None] * len(runs), progress=False)
    monkeypatch.undo()
    return counts


def test_the_step_loop_never_reads_a_tensor_back(monkeypatch):
    """5 or 40 steps, evaluated at every step: the same few reads, all of them in the final flush (one copy
    per buffer per chunk), none per step or per evaluation."""
    few, many = reads_during_training(monkeypatch, 5), reads_during_training(monkeypatch, 40)
    assert few == many, (few, many)
    # history rows, losses, divergence steps and their causes, prediction-break steps, 2 snapshots
    assert sum(many.values()) <= 2 * (5 + 2), many


def test_multi_step_calls_between_evaluations_change_nothing():
    """eval_every=4 trains 4 steps per kernel call; its rows equal the eval_every=1 rows at those steps."""
    one = training.train(cfgs(eval_every=1), [None] * 3, progress=False)
    four = training.train(cfgs(eval_every=4), [None] * 3, progress=False)
    for a, b in zip(one, four):
        by_step = {row["step"]: row for row in a.history}
        assert [row["step"] for row in b.history] == list(range(0, 50, 4)) + [50]
        for row in b.history:
            assert row == by_step[row["step"]]
        snaps = {snap["step"]: snap for snap in a.snapshots}
        assert [snap["step"] for snap in b.snapshots] == [0, 20, 50]  # the snapshot steps evaluated
        assert all(snap == snaps[snap["step"]] for snap in b.snapshots)
        assert (a.status, a.steps) == (b.status, b.steps)


def test_a_run_is_the_same_in_any_chunk():
    """Seeds trained five at a time, or two and three, or alone: the same records, bit for bit."""
    five = training.train(cfgs(5), [None] * 5, progress=False)
    parts = (training.train(cfgs(5)[:2], [None] * 2, progress=False)
             + training.train(cfgs(5)[2:], [None] * 3, progress=False))
    alone = training.train(cfgs(5)[3:4], [None], progress=False)
    for a, b in zip(five, parts):
        assert (a.history, a.snapshots, a.break_step) == (b.history, b.snapshots, b.break_step)
    assert alone[0].history == five[3].history


@pytest.mark.parametrize("steps,expect", [(1, 1), (7, 7)])
def test_a_block_stops_at_the_next_checkpoint(steps, expect):
    block = training._Block()
    assert block.steps(to_eval=steps, checkpoint_every=0, step=3) == expect
    assert block.steps(to_eval=50, checkpoint_every=8, step=3) == 5  # the checkpoint after step 7
    block.per_step = block.BLOCK_S / 4  # a long call is cut to about BLOCK_S
    assert block.steps(to_eval=50, checkpoint_every=0, step=0) == 4


def test_yaml_templates_write_what_yaml_writes():
    """The per-shape templates behind config.yaml and .hydra/*.yaml: byte for byte yaml.dump, for values
    that need quoting, change type, change a list's length, or are long enough to be folded."""
    import copy

    import yaml

    from rw_sweeps.core.yamltext import Templates

    dump = lambda d: yaml.dump(d, Dumper=yaml.CSafeDumper, sort_keys=False)  # noqa: E731
    base = {"seed": 0, "data": {"p": 0.5, "name": "random_walk", "tags": ["a", "b"]}, "x": None, "flag": True,
            "snapshot_steps": [0, 1, 2], "nested": {"deep": {"s": "plain"}}}
    values = [("seed", 7), ("seed", True), ("seed", None), ("seed", 1.0e-5), ("seed", float("inf")),
              ("data.p", "yes"), ("data.p", "1e3"), ("data.p", "a: b"), ("data.p", ""), ("data.p", "0.5"),
              ("data.p", "word " * 30), ("data.tags", []), ("data.tags", ["a", "b", "c"]), ("x", {"k": 1}),
              ("x", [{"k": 1}]), ("flag", 0), ("nested.deep.s", "ünïcode"), ("nested.deep.s", "#comment"),
              ("snapshot_steps", [5, 6, 7]), ("data.name", "null")]
    tpl = Templates(dump)
    docs = [base]
    for i, (key, value) in enumerate(values * 2):
        d = copy.deepcopy(base)
        node = d
        *path, last = key.split(".")
        for k in path:
            node = node[k]
        node[last] = value
        d["seed"] = d["seed"] if key == "seed" else i
        docs.append(d)
    for d in docs:
        assert tpl.text(d) == dump(d), d
    assert any(t is not None for t in tpl.templates.values())  # the fast path was taken
    assert tpl.text_list(["data.p=0.5", "seed=3", "x=a: b"]) == dump(["data.p=0.5", "seed=3", "x=a: b"])
