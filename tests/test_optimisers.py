"""Optimisers own their behaviour: every registered optimiser, on every engine it serves, is its torch.optim
rule (the eq. 2.1 engine against the literal dense model trained by the option's own torch.optim optimizer,
to float64 precision), trains differently from GD, refuses bad values by its fields' rules, and an engine it
does not serve is refused in one line. Tests run over the registry: a new optimiser is covered by adding it."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from rw_sweeps.core import config, oracle, registry
from rw_sweeps.core.config import ConfigError, OptimConfig, RunConfig, data_config, option_config, validate
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.inits.gaussian import GaussianInit
from rw_sweeps.sweeps import run

from .test_adam import _oracle_probe

T = 20
OPTIMISERS = dict(config.OPTIONS["optim"])
EQ21 = sorted(n for n, c in OPTIMISERS.items() if "eq21" in c.ENGINES)
BASE = {f.name for f in dataclasses.fields(OptimConfig)}


def exercised(name: str, **keys) -> OptimConfig:
    """The option with each key of its own (beyond every optimiser's) moved off its default to a value its
    rule allows and the eq. 2.1 engine takes, so that the key is exercised (momentum 0.5, λ > 0, …)."""
    cls = OPTIMISERS[name]
    out = {}
    for f in dataclasses.fields(cls):
        r = f.metadata.get("rule")
        if f.name in BASE or r is None or r.choices is not None or not isinstance(f.default, float):
            continue
        if r.lo is not None and r.hi is not None:
            value = (r.lo + r.hi) / 2
        else:
            value = f.default * 2 if f.default else 0.1
        try:
            r.check(f.name, value)
            check = getattr(cls.ENGINES.get("eq21"), "check", None)
            if check is not None:
                check(cls(**{**out, f.name: value}))
        except ConfigError:
            continue
        out[f.name] = value
    return cls(**{**out, **keys})


def cfg(optim: OptimConfig, **kw) -> RunConfig:
    base = dict(data=data_config(K=5, N=21, p=0.7, n_train=100, n_test=50), model=ModelConfig(M=64), optim=optim,
                snapshot_steps=[0, 10, T], wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    base.update(kw)
    return validate(RunConfig(**base))


DENSE = GaussianInit("gaussian", 0.05, draw="dense")  # the oracle starts from the very same W
CASES = {"zero-mean": {}, "gaussian-sum": dict(init=DENSE, reduction="sum"), "gaussian-whole": dict(init=DENSE)}


@pytest.mark.parametrize("name", EQ21)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_eq21_engine_is_the_options_own_torch_optim_rule_on_the_dense_model(name, case, tmp_path):
    kw = dict(CASES[case])
    reduction = kw.pop("reduction", "mean")
    lr = 0.5 if name in ("gd", "sgd") else 0.02
    c = cfg(exercised(name, lr=lr, steps=T, reduction=reduction), **kw)
    s = run.run_batch([c], [tmp_path])[0]
    assert s["status"] == "done" and s["steps"] == T
    snaps = {x["step"]: x for x in map(json.loads, (tmp_path / "snapshots.jsonl").read_text().splitlines())}
    hist = {x["step"]: x for x in map(json.loads, (tmp_path / "history.jsonl").read_text().splitlines())}
    ref = oracle.train(c, T)
    for t in (10, T):
        want, acc, loss = _oracle_probe(c, {k: v.double() for k, v in ref[t - 1][3].items()})
        for k, v in want.items():
            if v is not None:
                diff = (torch.tensor(snaps[t][k], dtype=torch.float64) - v).abs().max().item()
                assert diff < 1e-8, (name, t, k, diff)
        assert hist[t]["test_acc"] == acc and abs(hist[t]["test_loss"] - loss) < 1e-8, (t, hist[t], acc, loss)
    assert (torch.tensor(snaps[T]["V"]) - torch.tensor(snaps[0]["V"])).abs().max() > 1e-3  # it moved


@pytest.mark.parametrize("name", sorted(n for n in OPTIMISERS if n != "gd"))
@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_every_optimiser_trains_differently_from_gd_or_is_refused_for_the_engine(name, model, tmp_path):
    model_cfg = option_config("model", model, **({"M": 64} if model == "transformer" else {}))
    init = option_config("init", "gaussian" if model == "transformer" else "gpt2")  # zero init: gpt never moves
    gd = option_config("optim", "gd", lr=0.02, steps=8)
    try:
        c = cfg(exercised(name, lr=0.02, steps=8), model=model_cfg, init=init, eval_every=1)
    except ConfigError as e:
        assert OPTIMISERS[name].ENGINES.get(model_cfg.ENGINE) is None or "engine" in str(e), str(e)
        return
    ref = cfg(gd, model=model_cfg, init=init, eval_every=1)
    mine, base = run.run_batch([c], [tmp_path / "a"])[0], run.run_batch([ref], [tmp_path / "b"])[0]
    assert mine["status"] == base["status"] == "done"
    rows = lambda d: [json.loads(x)["train_loss"] for x in (d / "history.jsonl").read_text().splitlines()]  # noqa: E731
    assert rows(tmp_path / "a") != rows(tmp_path / "b"), name


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_every_key_rule_refuses_a_value_outside_it_in_one_line(name):
    cls = OPTIMISERS[name]
    for f in dataclasses.fields(cls):
        r = f.metadata.get("rule")
        if r is None:
            continue
        bad = "nope" if r.choices is not None else (r.lo - 1 if r.lo is not None else r.hi + 1)
        with pytest.raises(ConfigError) as e:
            validate(RunConfig(optim=cls(**{f.name: bad}), model=option_config("model", "gpt")))
        assert str(e.value).startswith(f"invalid config: optim.{f.name}=") and "\n" not in str(e.value)
        if isinstance(f.default, float):
            with pytest.raises(ConfigError, match="must be a finite number"):
                validate(RunConfig(optim=cls(**{f.name: float("nan")}), model=option_config("model", "gpt")))


def test_an_engine_an_optimiser_does_not_serve_is_refused_in_one_line_naming_what_serves(monkeypatch):
    @dataclass
    class GptOnly(OptimConfig):
        name: str = "gpt_only"
        ENGINES: ClassVar[dict] = {"gpt": OPTIMISERS["gd"].ENGINES["gpt"]}

    monkeypatch.setitem(config.OPTIONS["optim"], "gpt_only", GptOnly)
    with pytest.raises(ConfigError) as e:
        validate(RunConfig(optim=GptOnly(), data=data_config(K=5, N=21), model=ModelConfig(M=64)))
    serve = ", ".join(n for n, c in config.OPTIONS["optim"].items() if "eq21" in c.ENGINES)
    assert str(e.value) == ("invalid config: optim='gpt_only': optim=gpt_only has no implementation for "
                            f"model=transformer's engine (eq21); optim options that serve it: {serve}")
    assert serve.startswith("gd, adam")
    validate(RunConfig(optim=GptOnly(), model=option_config("model", "gpt")))  # its own engine: served


def test_an_optimiser_missing_a_part_fails_when_it_registers():
    class Half:
        def start(self, state):
            pass  # no `steps`

    with pytest.raises(TypeError, match="eq21 implementation Half lacks steps"):
        @registry.option("optim")
        @dataclass
        class Broken(OptimConfig):
            name: str = "broken_half"
            ENGINES: ClassVar[dict] = {"eq21": Half}

    with pytest.raises(TypeError, match="Nothing declares no ENGINES of its own"):
        @registry.option("optim")
        @dataclass
        class Nothing(OptimConfig):
            name: str = "broken_nothing"

    # a subclass of another optimiser that forgets ENGINES would train as its parent: refused
    parent = next(iter(OPTIMISERS.values()))
    with pytest.raises(TypeError, match="Inherits declares no ENGINES of its own"):
        @registry.option("optim")
        @dataclass
        class Inherits(parent):
            name: str = "broken_inherits"

    with pytest.raises(TypeError, match="ENGINES names the engine 'gtp'; engines: eq21, gpt, oracle"):
        @registry.option("optim")
        @dataclass
        class Misspelt(OptimConfig):
            name: str = "broken_misspelt"
            ENGINES: ClassVar[dict] = {"gtp": Half}

    with pytest.raises(TypeError, match=r"ENGINES\['gpt'\] is None, not a class"):
        @registry.option("optim")
        @dataclass
        class NoClass(OptimConfig):
            name: str = "broken_noclass"
            ENGINES: ClassVar[dict] = {"gpt": None}
    assert not any(n.startswith("broken_") for n in config.OPTIONS["optim"])
