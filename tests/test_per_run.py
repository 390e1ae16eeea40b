"""A key an option declares `PER_RUN` varies within one batch: runs that differ only in it train together, so
each must train exactly as it would alone. Over the registry: every data family and optimiser, every PER_RUN
key that takes a number or a choice, on each engine the option serves (eq. 2.1's and model=gpt's), two runs
differing only in that key, packed and alone, equal to 1e-10 at every evaluated step. A key declared per run
that an engine reads from the batch's first run fails here."""
from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest

from rw_sweeps.core import trainer
from rw_sweeps.core.config import OPTIONS, RunConfig, data_config, option_config, validate
from rw_sweeps.core.errors import ConfigError

MODELS = {"eq21": ("transformer", {"M": 32}), "gpt": ("gpt", {})}
SMALL = dict(K=4, N=9, n_train=24, n_test=16)
STEPS = 4


def _other(cls, name: str):
    """Another valid-looking value for a key: another choice, a number scaled by 0.6 (0.3 for 0), or None
    where the key takes neither (a list, a matrix, a file)."""
    f = cls.__dataclass_fields__[name]
    rule = f.metadata.get("rule")
    default = f.default
    if rule is not None and rule.choices is not None:
        return next((c for c in rule.choices if c != default), None)
    if type(default) is float and math.isfinite(default):
        return default * 0.6 if default else 0.3
    return None


def _cases():
    for group in ("data", "optim"):
        for name, cls in OPTIONS[group].items():
            for key in cls.PER_RUN:
                if key in ("lr", "eps") and group == "optim" and name != "gd":
                    continue  # every optimiser's lr and eps are GD's keys: tried once, on gd
                other = _other(cls, key)
                if other is not None:
                    yield pytest.param(group, name, key, other, id=f"{group}={name}-{key}")


def _configs(group: str, name: str, key: str, other, engine: str, shape: dict):
    model, mkeys = MODELS[engine]
    base = dict(model=option_config("model", model, **mkeys), optim=option_config("optim", "gd", lr=0.5, steps=STEPS),
                data=data_config(**shape), snapshot_steps=[0, STEPS],
                wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    out = []
    for value in (None, other):
        if group == "data":
            keys = {**shape, **({} if value is None else {key: value})}
            opt = option_config("data", name, **{k: v for k, v in keys.items()
                                                  if k in OPTIONS["data"][name].__dataclass_fields__})
        else:
            keys = {"lr": 0.5 if name in ("gd", "sgd") else 0.01, "steps": STEPS}
            opt = option_config("optim", name, **{**keys, **({} if value is None else {key: value})})
        out.append(validate(RunConfig(**{**base, group: opt})))
    return out


def _train(cfgs):
    return trainer.of(cfgs[0]).train(cfgs, [Path(tempfile.mkdtemp()) for _ in cfgs], progress=False)


def _rel(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


@pytest.mark.parametrize("group,name,key,other", list(_cases()))
def test_runs_differing_in_a_per_run_key_train_together_as_alone(group, name, key, other):
    tried = 0
    for engine in MODELS:
        cfgs = None
        for shape in (SMALL, {k: v for k, v in SMALL.items() if k != "K"}):  # a family may fix K (binary_chain)
            try:
                cfgs = _configs(group, name, key, other, engine, shape)
                break
            except ConfigError:  # the option does not serve this engine, or this shape
                continue
        if cfgs is None:
            continue
        tried += 1
        packed = _train(cfgs)
        for cfg, rec in zip(cfgs, packed):
            alone = _train([cfg])[0]
            assert len(alone.history) == len(rec.history) and alone.status == rec.status
            for a, b in zip(alone.history, rec.history):
                for k in ("train_loss", "test_loss", "test_acc"):
                    assert _rel(a.get(k), b.get(k)) < 1e-10, (engine, k, a.get(k), b.get(k))
    assert tried, f"{group}={name}: no engine took {key}={other!r} at the small shape"
