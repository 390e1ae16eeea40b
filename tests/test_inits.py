"""Inits own their behaviour: every registered init composes (Hydra, and the front door), validates, refuses
bad values by its fields' rules, draws the state each engine it serves trains from (the oracle's dense θ the
eq. 2.1 engine's compact one), trains differently from zero init there, and is refused in one line for an
engine it does not serve; its scale is what a run's summary records as `sigma`; an init missing a part fails
when it registers. Tests run over the registry: a new init is covered by adding it."""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from rw_sweeps.core import config, model, oracle, registry, training
from rw_sweeps.core.config import ConfigError, InitConfig, RunConfig, data_config, option_config, validate
from rw_sweeps.sweeps import run

from .conftest import ROOT, launch, summaries
from .test_config import composed

INITS = dict(config.OPTIONS["init"])
BASE = {f.name for f in dataclasses.fields(InitConfig)}
# each engine, the model option that trains on it, and that model's keys for a small run
MODELS = {"eq21": ("transformer", {"M": 64}), "gpt": ("gpt", {})}
ENGINES = ("eq21", "gpt", "oracle")
T = 6


def variants(name: str) -> list[InitConfig]:
    """The init at its defaults and at every value of each of its keys that take a choice (init.draw)."""
    cls = INITS[name]
    choices = {f.name: f.metadata["rule"].choices for f in dataclasses.fields(cls)
               if f.metadata.get("rule") is not None and f.metadata["rule"].choices is not None}
    return [cls(**dict(zip(choices, values))) for values in itertools.product(*choices.values())]


def cfg(init: InitConfig, engine: str, **kw) -> RunConfig:
    """A small run of the engine's model (oracle: eq. 2.1's dense one, model=transformer) from this init."""
    name, keys = MODELS["eq21" if engine == "oracle" else engine]
    base = dict(data=data_config(K=5, N=13, p=0.7, n_train=40, n_test=30), model=option_config("model", name, **keys),
                init=init, optim=option_config("optim", "gd", lr=0.5, steps=T), snapshot_steps=[0, T],
                wandb=dataclasses.replace(RunConfig().wandb, mode="disabled"))
    base.update(kw)
    return RunConfig(**base)


def refusal(name: str, engine: str) -> str:
    model_name = MODELS["eq21" if engine == "oracle" else engine][0]
    serve = ", ".join(n for n, c in INITS.items() if engine in c.ENGINES)
    return (f"invalid config: init='{name}': init={name} has no implementation for model={model_name}'s engine "
            f"({engine}); init options that serve it: {serve}")


def test_the_registry_is_the_inits_with_their_keys_and_defaults():
    """The inits this repository ships, as the README's table states them (another init may be added)."""
    assert list(INITS)[0] == "zero" and type(RunConfig().init) is INITS["zero"]  # the default, listed first
    assert InitConfig.__dataclass_fields__["name"].default == "???"
    shipped = {"zero": {"name": "zero"}, "gaussian": {"name": "gaussian", "sigma": 0.01, "draw": "compact"},
               "gpt2": {"name": "gpt2", "std": 0.02}}
    assert {n: {f.name: f.default for f in dataclasses.fields(INITS[n])} for n in shipped} == shipped
    assert {n: sorted(INITS[n].ENGINES) for n in shipped} == {"zero": ["eq21", "gpt", "oracle"],
                                                              "gaussian": ["eq21", "gpt", "oracle"], "gpt2": ["gpt"]}


@pytest.mark.parametrize("name", sorted(INITS))
def test_every_init_composes_and_validates_with_a_model_it_serves(name):
    cls = INITS[name]
    extra = [] if "eq21" in cls.ENGINES else ["model=gpt"]
    c = composed(f"init={name}", *extra)
    assert type(c.init) is cls and c.init == cls()
    assert c.model.ENGINE in cls.ENGINES


@pytest.mark.e2e
def test_every_init_launches_through_the_front_door(tmp_path):
    sweep = tmp_path / "s"
    serve = [n for n, c in INITS.items() if "gpt" in c.ENGINES]  # every init that model=gpt's engine has
    r = launch("-m", f"init={','.join(serve)}", "model=gpt", "data.N=9", "data.n_train=16", "data.n_test=16", "optim.steps=2",
               "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {s["init"]: s["sigma"] for s in summaries(sweep).values()}
    assert got == {n: INITS[n]().scale() for n in serve}
    assert {n: got[n] for n in ("zero", "gaussian", "gpt2")} == {"zero": 0.0, "gaussian": 0.01, "gpt2": 0.02}


@pytest.mark.e2e
def test_an_engine_an_init_does_not_serve_is_refused_by_the_front_door_in_one_line(tmp_path):
    out = tmp_path / "out"
    for args in (["init=gpt2"], ["-m", "init=zero,gpt2"]):
        r = launch(*args, "wandb.mode=disabled", f"hydra.run.dir={out}", f"hydra.sweep.dir={out}", cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and lines == ["error: " + refusal("gpt2", "eq21")], r.stdout + r.stderr
        assert not out.exists() and not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.parametrize("name", sorted(INITS))
def test_every_key_rule_refuses_a_value_outside_it_in_one_line(name):
    cls = INITS[name]
    engine = "eq21" if "eq21" in cls.ENGINES else "gpt"
    ruled = [f for f in dataclasses.fields(cls) if f.metadata.get("rule") is not None]
    assert {f.name for f in ruled} == {f.name for f in dataclasses.fields(cls)} - BASE  # every key has its rule
    for f in ruled:
        r = f.metadata["rule"]
        bad = "nope" if r.choices is not None else (r.lo - 1 if r.lo is not None else r.hi + 1)
        with pytest.raises(ConfigError) as e:
            validate(cfg(cls(**{f.name: bad}), engine))
        text = str(e.value)
        assert text.startswith(f"invalid config: init.{f.name}=") and text.endswith(": " + r.text()), text
        assert "\n" not in text and str(bad) in text
        if isinstance(f.default, float):
            for value in (float("nan"), float("inf")):
                with pytest.raises(ConfigError) as e:
                    validate(cfg(cls(**{f.name: value}), engine))
                text = str(e.value)
                assert text.startswith(f"invalid config: init.{f.name}=") and "must be a finite number" in text


@pytest.mark.parametrize("name,engine", [(n, e) for n in sorted(INITS) for e in ENGINES])
def test_every_init_draws_the_state_each_engine_trains_from_or_is_refused(name, engine):
    cls = INITS[name]
    for init in variants(name):
        c = cfg(init, engine)
        if engine not in cls.ENGINES:
            with pytest.raises(ConfigError) as e:
                oracle.initial(c, torch.float64) if engine == "oracle" else validate(c)
            assert str(e.value) == refusal(name, engine)
            assert "\n" not in str(e.value)
            continue
        c = validate(c)
        if engine == "oracle":  # the literal θ(0) is the compact engine's state, W through u = W x̂_N
            theta = oracle.initial(c, torch.float64)
            geo = model.geometry(c.model, c.data.N)
            st = training.initial_state([c], geo, torch.float64)
            a, cc = model.compact(theta.pop("W"), c.model, c.data.K, c.data.N, geo)
            assert torch.allclose(a, st.a[0], rtol=0, atol=1e-14) and torch.allclose(cc, st.c[0], rtol=0, atol=1e-12)
            assert theta.keys() == st.params.keys()
            assert all(torch.equal(theta[k], st.params[k][0]) for k in theta)
        # the same seed draws the same θ(0), and another seed another one (unless the init draws nothing)
        again = training.initial_state([c, c, dataclasses.replace(c, seed=1)], model.geometry(c.model, c.data.N),
                                       torch.float64) if engine != "gpt" else None
        if again is not None:
            assert torch.equal(again.a[0], again.a[1]) and torch.equal(again.c[0], again.c[1])
            assert torch.equal(again.a[0], again.a[2]) == (c.init.scale() == 0)


def _losses(d) -> list:
    return [json.loads(x)["train_loss"] for x in (d / "history.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name,engine", [(n, e) for n in sorted(INITS) for e in MODELS])
def test_every_init_trains_differently_from_zero_init_on_each_engine_it_serves(name, engine, tmp_path):
    cls = INITS[name]
    if engine not in cls.ENGINES:
        with pytest.raises(ConfigError) as e:
            validate(cfg(cls(), engine))
        assert str(e.value) == refusal(name, engine)
        return
    zero = validate(cfg(INITS["zero"](), engine))
    base = run.run_batch([zero], [tmp_path / "zero"])[0]
    assert base["status"] == "done" and base["sigma"] == 0.0
    for i, init in enumerate(variants(name)):
        c = validate(cfg(init, engine))
        s = run.run_batch([c], [tmp_path / str(i)])[0]
        assert s["status"] == "done" and s["steps"] == T and s["init"] == name
        assert s["sigma"] == init.scale()  # the summary's sigma is the init's scale
        if name != "zero":
            assert _losses(tmp_path / str(i)) != _losses(tmp_path / "zero"), init


@pytest.mark.parametrize("name", sorted(INITS))
def test_every_init_is_its_scale_times_its_unit_draw(name):
    """`unit()` is the draw of which the init is `scale()` times: what the escape theory's δ_0 is."""
    init = INITS[name]()
    unit = init.unit()
    assert unit.scale() == 1.0
    engine = "eq21" if "eq21" in type(unit).ENGINES else "gpt"
    c = validate(cfg(init, engine))
    u = validate(cfg(unit, engine, model=c.model))
    if engine == "eq21":
        geo = model.geometry(c.model, c.data.N)
        x, y = (training.initial_state([r], geo, torch.float64) for r in (c, u))
        pairs = [(x.a, y.a), (x.c, y.c), *((x.params[k], y.params[k]) for k in x.params)]
    else:
        from rw_sweeps.core.gpt.model import init_params

        x, y = (init_params([r], c.data.K, c.data.N, torch.float64) for r in (c, u))
        pairs = [(x[k], y[k]) for k in x if not k.endswith((".w", ".b"))]  # LayerNorm gains and biases: the model's
    assert pairs and any(bool(b.any()) for _, b in pairs)
    for a, b in pairs:
        assert torch.allclose(a, init.scale() * b, rtol=1e-12, atol=1e-300)


def test_no_init_is_dispatched_by_its_name_or_class_outside_its_module():
    """The trainers, the oracle, the memory check and the escape theory ask the init (its implementation for
    their engine, its scale); none names an init or reads a key the init may not have."""
    pattern = re.compile(r"\binit\.name\s*(==|!=|in\b|not in\b)|isinstance\([^)]*Init\b|type\([^)]*init\)\s*(not )?in\b"
                         r"|\.init\.(sigma|draw|std)\b|\b(Zero|Gaussian|Gpt2)Init\b")
    found = []
    for path in sorted((ROOT / "rw_sweeps").rglob("*.py")):
        if path.parent.name == "inits":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_an_init_missing_a_part_fails_when_it_registers():
    class Half:
        @staticmethod
        def initial(cfg, geo, dtype):
            pass  # no `draw_bytes`

    with pytest.raises(TypeError, match="eq21 implementation Half lacks draw_bytes"):
        @registry.option("init")
        @dataclass
        class Broken(InitConfig):
            name: str = "broken_half"
            ENGINES: ClassVar[dict] = {"eq21": Half}

            def scale(self) -> float:
                return 0.0

            def unit(self):
                return self

    with pytest.raises(TypeError, match="declares no scale"):
        @registry.option("init")
        @dataclass
        class Unscaled(InitConfig):
            name: str = "broken_unscaled"
            ENGINES: ClassVar[dict] = {"gpt": INITS["zero"].ENGINES["gpt"]}

    with pytest.raises(TypeError, match="Nothing declares no ENGINES of its own"):
        @registry.option("init")
        @dataclass
        class Nothing(InitConfig):
            name: str = "broken_nothing"

            def scale(self) -> float:
                return 0.0

            def unit(self):
                return self

    with pytest.raises(TypeError, match="ENGINES names the engine 'gtp'; engines: eq21, gpt, oracle"):
        @registry.option("init")
        @dataclass
        class Misspelt(InitConfig):
            name: str = "broken_misspelt"
            ENGINES: ClassVar[dict] = {"gtp": Half}

            def scale(self) -> float:
                return 0.0

            def unit(self):
                return self
    assert not any(n.startswith("broken_") for n in config.OPTIONS["init"])


def test_an_engine_an_init_does_not_serve_is_refused_naming_what_serves(monkeypatch):
    @dataclass
    class GptOnly(InitConfig):
        name: str = "gpt_only"
        ENGINES: ClassVar[dict] = {"gpt": INITS["zero"].ENGINES["gpt"]}

        def scale(self) -> float:
            return 0.0

    monkeypatch.setitem(config.OPTIONS["init"], "gpt_only", GptOnly)
    with pytest.raises(ConfigError) as e:
        validate(cfg(GptOnly(), "eq21"))
    assert str(e.value) == refusal("gpt_only", "eq21") and refusal("gpt_only", "eq21").endswith(
        ": " + ", ".join(n for n, c in INITS.items() if "eq21" in c.ENGINES))
    validate(cfg(GptOnly(), "gpt"))  # its own engine: served
