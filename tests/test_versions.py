"""Configs of older versions are the same run: a key missing from a stored config reads at its schema default,
for every key of every option, and that default is the behaviour from before the key existed.

`tests/fixtures/runs_043d3ad/` holds five run folders written by commit 043d3ad~1 (before `data.target`,
`data.online`, `data.batch` and `data.start` existed): the circle and the binary chain, zero and Gaussian
init, GD and Adam, at the README's shrunk sizes. They must be found done by today's launcher, read as done by
today's analysis, and trained again by today's code to the same numbers.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from rw_sweeps.core import contract
from rw_sweeps.core.config import GROUPS, OPTIONS, RunConfig, WandbConfig, canonical, from_dict
from rw_sweeps.core.results import identity

from .conftest import launch

OLD = Path(__file__).parent / "fixtures" / "runs_043d3ad"
SHRUNK = ("data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled")
# what each old folder was launched with (its config.yaml says the same)
OVERRIDES = {"0": ("data=random_walk", "init=zero"), "1": ("data=random_walk", "init=gaussian"),
             "2": ("data=binary_chain", "init=zero"), "3": ("data=binary_chain", "init=gaussian"),
             "4": ("optim=adam", "optim.lr=0.01")}


def _schemas():
    yield RunConfig
    yield WandbConfig
    for group in GROUPS:
        yield from OPTIONS[group].values()


@pytest.mark.parametrize("cls", list(_schemas()), ids=lambda c: c.__name__)
def test_every_key_of_every_schema_has_a_default_so_a_config_without_it_reads_at_it(cls):
    """The rule that makes old folders readable: a new key must come with a default (the old behaviour)."""
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert missing == [], f"{cls.__name__}: keys without a default: {missing}"


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_a_key_left_out_of_a_stored_config_is_the_same_run_whatever_the_key(name):
    """Every key of an old config, removed in turn (as a version before it existed wrote the file), leaves the
    run's identity unchanged when its value was the default; a key at another value is another run."""
    cfg = contract.read_config(OLD / name)
    full = identity(cfg)
    rc = from_dict(canonical(cfg))
    for group in ("data", "model", "init", "optim"):
        defaults = {f.name: getattr(type(getattr(rc, group))(), f.name) for f in dataclasses.fields(getattr(rc, group))}
        for key, value in cfg.get(group, {}).items():
            if key == "name" or defaults.get(key, object()) != value:
                continue
            less = {**cfg, group: {k: v for k, v in cfg[group].items() if k != key}}
            assert identity(less) == full, f"{group}.{key}"


@pytest.mark.e2e
def test_old_run_folders_are_done_for_the_launcher_and_analysis_and_train_to_the_same_numbers(tmp_path):
    from analysis import load_runs

    sweep = tmp_path / "old"
    shutil.copytree(OLD, sweep)
    verdicts = {n: contract.judge(sweep / n).state for n in OVERRIDES}
    assert verdicts == dict.fromkeys(OVERRIDES, "done")
    runs = load_runs(sweep, progress=False, cache=False)
    assert sorted(runs["run"]) == sorted(OVERRIDES) and set(runs["status"]) == {"done"}
    assert set(runs["data.target"]) == {"last"} and set(runs["data.online"]) == {False}

    # today's code trains the same five runs: the first four as one grid (Hydra numbers its jobs in the order of
    # OVERRIDES' "0" … "3"), the fifth on its own
    fresh = tmp_path / "new"
    r = launch("-m", *SHRUNK, "data=random_walk,binary_chain", "init=zero,gaussian", f"hydra.sweep.dir={fresh}")
    assert r.returncode == 0, r.stderr[-2000:]
    r = launch(*SHRUNK, *OVERRIDES["4"], f"hydra.run.dir={fresh / '4'}")
    assert r.returncode == 0, r.stderr[-2000:]
    for name, extra in OVERRIDES.items():
        old_cfg, new_cfg = contract.read_config(sweep / name), contract.read_config(fresh / name)
        assert [new_cfg[g]["name"] for g in ("data", "init", "optim")] == [
            old_cfg[g]["name"] for g in ("data", "init", "optim")] and new_cfg["optim"]["lr"] == old_cfg["optim"]["lr"]
        r = launch(*SHRUNK, *extra, f"hydra.run.dir={sweep / name}")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "skipped (done)" in r.stdout, r.stdout[-2000:]  # found done: not trained again
        old_rows = [json.loads(x) for x in (sweep / name / contract.HISTORY).read_text().splitlines()]
        new_rows = [json.loads(x) for x in (fresh / name / contract.HISTORY).read_text().splitlines()]
        assert len(new_rows) == len(old_rows) == 6
        for a, b in zip(old_rows, new_rows):
            assert a.keys() <= b.keys()
            for k, v in a.items():
                assert b[k] == pytest.approx(v, rel=1e-12, abs=1e-15), (name, a["step"], k)
