"""Registering an option checks what a contributor can get wrong without a word: a key declared again (the
loss's ε replaced by an optimiser's own `eps`), a method that does not take its base's or its engine's calls,
and an option's YAML whose schema no imported module declares. Each is refused in one line naming the option
and what to fix. The options here are throwaway ones defined inside the tests; none stays registered."""
from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore

from rw_sweeps.core import registry
from rw_sweeps.core.config import ConfigError, DataConfig, InitConfig, OptimConfig
from rw_sweeps.core.optimisers.scheduled import Scheduled
from rw_sweeps.core.registry import OPTIONS, option, rule
from rw_sweeps.sweeps.hydra_errors import one_line_errors

from .conftest import ROOT, declared_in

GD = OPTIONS["optim"]["gd"]
ZERO = OPTIONS["init"]["zero"]


@pytest.fixture(autouse=True)
def nothing_stays_registered():
    """Every option a test declares is named probe_…: taken out of the registry and Hydra's ConfigStore after."""
    yield
    store = ConfigStore.instance().repo["schema"]
    for group in registry.GROUPS:
        for name in [n for n in OPTIONS[group] if n.startswith("probe_")]:
            OPTIONS[group].pop(name)
            store[group].pop(f"{name}.yaml", None)


def refusal(build) -> str:
    """The one line a registration is refused with; the option it declared is in no registry."""
    before = {g: set(OPTIONS[g]) for g in registry.GROUPS}
    with pytest.raises(TypeError) as e:
        build()
    assert {g: set(OPTIONS[g]) for g in registry.GROUPS} == before
    text = str(e.value)
    assert "\n" not in text, text
    assert isinstance(e.value, registry.Unregistrable), text
    return declared_in(text, __file__)  # it names the file that declares the option


# ------------------------------------------------------------------------------------------ a key declared once
def test_an_optimiser_whose_own_eps_would_replace_the_loss_eps_is_refused_naming_option_and_key():
    def build():
        @option("optim")
        @dataclass
        class ProbeRmsprop(OptimConfig):
            name: str = "probe_rmsprop"
            alpha: float = field(default=0.99, metadata=rule(lo=0, hi=1, hi_open=True))
            eps: float = 1e-8  # meant as RMSprop's own ε: it is the loss's, ℓ = −log([f]_y + eps)
            ENGINES: ClassVar[dict] = dict(GD.ENGINES)

    assert refusal(build) == ("optim=probe_rmsprop: ProbeRmsprop declares the key 'eps', which OptimConfig has "
                              "(default 0.1); give the option's own key another name (optim=adam's own ε is adam_eps)")
    assert "probe_rmsprop.yaml" not in ConfigStore.instance().repo["schema"]["optim"]


def test_a_key_of_a_schema_the_option_is_composed_with_is_declared_once_too():
    def build():
        @option("optim")
        @dataclass
        class ProbeClipped(Scheduled, OptimConfig):
            name: str = "probe_clipped"
            clip: float = 1.0
            ENGINES: ClassVar[dict] = dict(GD.ENGINES)

    assert refusal(build).startswith("optim=probe_clipped: ProbeClipped declares the key 'clip', which Scheduled "
                                     "has (default 0.0)")


def test_a_family_key_that_is_no_option_default_is_refused():
    def build():
        @option("data")
        @dataclass
        class ProbeSized(DataConfig):
            name: str = "probe_sized"
            n_train: int = 64

            def transition(self, seed: int = 0):
                return np.eye(self.K)

    assert refusal(build).startswith("data=probe_sized: ProbeSized declares the key 'n_train', which DataConfig "
                                     "has (default 1000)")


def test_a_step_size_is_re_defaulted_with_its_rule_and_refused_without_it():
    @option("optim")
    @dataclass
    class ProbeSlow(OptimConfig):
        name: str = "probe_slow"
        lr: float = field(default=0.01, metadata=rule(lo=0, lo_open=True))
        ENGINES: ClassVar[dict] = dict(GD.ENGINES)

    assert OPTIONS["optim"]["probe_slow"] is ProbeSlow and ProbeSlow().lr == 0.01

    def build():
        @option("optim")
        @dataclass
        class ProbeRuleless(OptimConfig):
            name: str = "probe_ruleless"
            lr: float = 0.01  # lr ≤ 0 would no longer be refused
            ENGINES: ClassVar[dict] = dict(GD.ENGINES)

    assert refusal(build) == ("optim=probe_ruleless: ProbeRuleless re-defaults the key 'lr' of OptimConfig with "
                              "another type or rule; keep lr: float and its rule, or name a key of its own")


# ------------------------------------------------------------------------------------------ signatures
class _ShortSteps(GD.ENGINES["eq21"]):
    def steps(self, state, data, eps, w, geo):
        return super().steps(state, data, eps, w, geo, 1)


class _NarrowBuild(GD.ENGINES["eq21"]):
    def __init__(self, cfgs):
        super().__init__(cfgs, None, None, None)


class _BoundMake:
    def make(self, params, o):
        return GD.ENGINES["oracle"].make(params, o)


@pytest.mark.parametrize("engine,impl,says", [
    ("eq21", _ShortSteps, "its eq21 implementation _ShortSteps.steps(state, data, eps, w, geo) does not take the "
                          "engine's call; expected steps(state, data, eps, w, geo, n)"),
    ("eq21", _NarrowBuild, "its eq21 implementation _NarrowBuild(cfgs) does not take the engine's call; expected "
                           "_NarrowBuild(cfgs, geo, dtype, device)"),
    ("oracle", _BoundMake, "its oracle implementation's make is called on the class; expected @staticmethod "
                           "make(params, o)"),
], ids=["steps", "constructor", "binding"])
def test_an_optimiser_implementation_that_does_not_take_its_engine_s_call_is_refused(engine, impl, says):
    def build():
        @option("optim")
        @dataclass
        class ProbeMisfit(OptimConfig):
            name: str = "probe_misfit"
            ENGINES: ClassVar[dict] = {**GD.ENGINES, engine: impl}

    assert refusal(build) == f"optim=probe_misfit: {says}"


def test_an_init_implementation_with_a_parameter_missing_is_refused_naming_the_expected_signature():
    class Weightless:
        @staticmethod
        def weight(cfg, p):
            return ZERO.ENGINES["gpt"].weight(cfg, p, None)

    def build():
        @option("init")
        @dataclass
        class ProbeWeightless(InitConfig):
            name: str = "probe_weightless"
            ENGINES: ClassVar[dict] = {"gpt": Weightless}

            def scale(self) -> float:
                return 0.0

            def unit(self):
                return self

    assert refusal(build) == ("init=probe_weightless: its gpt implementation Weightless.weight(cfg, p) does not "
                              "take the engine's call; expected weight(cfg, p, gen)")


def test_a_schema_method_that_does_not_take_its_base_s_calls_is_refused():
    def sampler():
        @option("data")
        @dataclass
        class ProbeSeedless(DataConfig):
            name: str = "probe_seedless"

            def draw(self, n, gen):  # the callers pass the run's seed
                raise AssertionError("never drawn")

    def scale():
        @option("init")
        @dataclass
        class ProbeScaled(InitConfig):
            name: str = "probe_scaled"
            ENGINES: ClassVar[dict] = dict(ZERO.ENGINES)

            def scale(self, t) -> float:
                return 0.0

            def unit(self):
                return self

    assert refusal(sampler) == ("data=probe_seedless: ProbeSeedless.draw(n, gen) does not take the calls of "
                                "DataConfig.draw; expected draw(n, gen, seed)")
    assert refusal(scale) == ("init=probe_scaled: ProbeScaled.scale(t) does not take the calls of InitConfig.scale; "
                              "expected scale()")


def _sig(f) -> inspect.Signature:
    return inspect.signature(f)


@pytest.mark.parametrize("got,want,ok", [
    (lambda n, gen, seed: 0, lambda n, gen, seed: 0, True),
    (lambda n, gen, seed, extra=1: 0, lambda n, gen, seed: 0, True),   # more, with a default
    (lambda n, gen, seed, *rest, **kw: 0, lambda n, gen, seed: 0, True),
    (lambda n, gen, seed=0: 0, lambda n, gen, seed: 0, True),         # a default the base does not have
    (lambda n, gen: 0, lambda n, gen, seed: 0, False),                # one missing
    (lambda n, gen, seed, extra: 0, lambda n, gen, seed: 0, False),   # one more, required
    (lambda n, seed, gen: 0, lambda n, gen, seed: 0, False),          # reordered: a positional call swaps them
    (lambda n, gen, rng: 0, lambda n, gen, seed: 0, False),           # renamed: a keyword call fails
    (lambda seed: 0, lambda seed=0: 0, False),                        # the base's callers may leave it out
    (lambda n, *, gen, seed: 0, lambda n, gen, seed: 0, False),       # keyword-only where positional is called
])
def test_a_signature_takes_the_calls_of_another_only_where_every_call_still_binds(got, want, ok):
    assert registry.takes(_sig(got), _sig(want)) is ok


# ------------------------------------------------------------------------------------------ a missing import
def test_a_schema_no_module_declares_names_the_module_to_write_and_the_import():
    assert registry.unregistered("optim", "no_such_optim") == (
        "conf/optim/no_such_optim.yaml extends schema/optim/no_such_optim, which no option declares: write "
        "rw_sweeps/core/optimisers/no_such_optim.py (@option('optim') on a schema whose name is 'no_such_optim'), "
        "which rw_sweeps/core/optimisers/__init__.py imports")


def test_a_module_never_imported_names_the_package_init_to_import_it_in(monkeypatch):
    # scheduled.py is a module of the optimisers' package that declares no option: as a module holding an
    # option would be, were its import forgotten, and once imported
    assert registry.unregistered("optim", "scheduled").endswith(
        "rw_sweeps/core/optimisers/scheduled.py is imported but has no @option('optim') on a schema whose name "
        "is 'scheduled'")
    monkeypatch.delitem(sys.modules, "rw_sweeps.core.optimisers.scheduled")
    assert registry.unregistered("optim", "scheduled") == (
        "conf/optim/scheduled.yaml extends schema/optim/scheduled, which no option declares: "
        "rw_sweeps/core/optimisers/scheduled.py is never imported; import it in rw_sweeps/core/optimisers/__init__.py")


def test_hydra_s_could_not_load_the_schema_becomes_one_line_naming_the_file(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "init" / "probe_unimported.yaml").write_text("defaults:\n  - /schema/init/probe_unimported@_here_\n")
    with pytest.raises(ConfigError) as e, one_line_errors():
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            compose("config", overrides=["init=probe_unimported"])
    assert str(e.value) == (
        "invalid config: init='probe_unimported': conf/init/probe_unimported.yaml extends schema/init/probe_unimported, "
        "which no option declares: write rw_sweeps/core/inits/probe_unimported.py (@option('init') on a schema whose "
        "name is 'probe_unimported'), which rw_sweeps/core/inits/__init__.py imports")


@pytest.mark.e2e  # it starts a Python process
def test_a_refused_registration_ends_a_command_in_one_line_naming_the_file(tmp_path):
    """Not a traceback: every command imports the options, `--help` included."""
    (tmp_path / "bad_option.py").write_text(
        "from dataclasses import dataclass\n"
        "from rw_sweeps.core.optimisers.base import OptimConfig\n"
        "from rw_sweeps.core.registry import option\n"
        "@option('optim')\n@dataclass\nclass Bad(OptimConfig):\n    name: str = 'probe_bad'\n    eps: float = 1e-8\n")
    r = subprocess.run([sys.executable, "-c", "import bad_option"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: optim=probe_bad: ") and line.endswith("(bad_option.py)"), line  # as seen from its folder
