"""The data families, over the registry (`config.OPTIONS["data"]`): each composes, validates, draws data of
the right shape, offers target=all only with the laws for it, and its summary echoes its own keys; a family
that lacks a hook its group needs is refused when it registers, in one line; and a family defined here, with
only its schema and its sampler (a circle walk whose drift changes halfway), trains end to end."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rw_sweeps.core import config, contract, training
from rw_sweeps.core import data as data_mod
from rw_sweeps.core.config import ConfigError, DataConfig, from_dict
from rw_sweeps.core.registry import option

from .conftest import ROOT, declared_in

FAMILIES = sorted(config.OPTIONS["data"])
SMALL = dict(n_train=7, n_test=5)  # every family's own K and N (QA's are fixed by the task)


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def one_line_type_error(build) -> str:
    with pytest.raises(TypeError) as e:
        build()
    text = str(e.value)
    assert "\n" not in text, text
    return declared_in(text, __file__)  # it names the file that declares the option


# ------------------------------------------------------------------------------------------ the registry
def test_the_registry_holds_every_family_with_a_yaml_file():
    assert FAMILIES == sorted(p.stem for p in (ROOT / "conf" / "data").glob("*.yaml"))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_composes_and_validates(name):
    c = from_dict(composed(f"data={name}"), complete=True)
    assert type(c.data) is config.OPTIONS["data"][name] and c.data.name == name


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_draws_data_of_the_right_shape(name):
    d = config.data_config(name, **SMALL)
    d.validate(0)
    train, test = data_mod.make(d, 0)
    for split, n in ((train, d.n_train), (test, d.n_test)):
        assert split.tokens.shape == (n, d.N - 1) and split.y.shape == (n,) and split.P_true.shape == (n, d.K)
        for t in (split.tokens, split.y):
            assert t.dtype == torch.int64 and int(t.min()) >= 0 and int(t.max()) < d.K
        P = split.P_true.double()
        assert torch.isfinite(P).all() and (P >= 0).all() and torch.allclose(P.sum(1), torch.ones(n, dtype=P.dtype))
    c = config.validate(config.RunConfig(data=d))
    stacked, _ = data_mod.make_batches([c], workers=1)  # the stacked path draws the same (draw_into)
    assert torch.equal(stacked.tokens[0], train.tokens) and torch.equal(stacked.P_true[0], train.P_true)


@pytest.mark.parametrize("name", FAMILIES)
def test_target_all_is_offered_only_with_laws_at_every_position(name):
    cls = config.OPTIONS["data"][name]
    assert "last" in cls.TARGETS and set(cls.TARGETS) <= {"last", "all"}
    d = config.data_config(name, **SMALL)
    train, _ = data_mod.make(d, 3)
    if "all" in cls.TARGETS:
        assert cls.has_laws()
        seq = torch.cat([train.tokens, train.y[:, None]], 1).numpy()
        law = d.laws(seq, 3)
        assert isinstance(law, np.ndarray) and law.shape == (d.n_train, d.N - 1, d.K), name
        assert np.isfinite(law).all() and (law >= 0).all() and np.allclose(law.sum(-1), 1, rtol=0, atol=1e-12)
        # its last row is the law of y that the sampler gave
        np.testing.assert_allclose(law[:, -1], train.P_true.numpy(), rtol=0, atol=1e-12)
    else:  # refused by validation in one line: the key, the value, what is allowed
        with pytest.raises(ConfigError) as e:
            from_dict({"data": {"name": name, "target": "all"}, "model": {"name": "gpt"}})
        assert e.value.key == "data.target" and e.value.value == "all" and "allowed: last" in e.value.allowed
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_summary_echoes_the_familys_own_keys_and_keeps_p(name, tmp_path):
    cls = config.OPTIONS["data"][name]
    assert set(cls.ECHO) <= set(cls.own_keys())
    c = from_dict({"data": {"name": name}})
    s = training.summary(training.Record(c, tmp_path, status="failed", error="x"), 0.0)
    assert s["p"] == getattr(c.data, "p", None)  # as it always was, null for a family without p
    assert {k: s[k] for k in cls.ECHO} == {k: getattr(c.data, k) for k in cls.ECHO}
    json.dumps(s, allow_nan=False)
    assert contract.check_summary(s, tmp_path) is s


def test_the_echoed_keys_of_the_families_with_more_than_p():
    echo = {n: c.ECHO for n, c in config.OPTIONS["data"].items()}
    assert echo["random_walk"] == echo["birth_death"] == ("p",)
    assert echo["binary_chain"] == ("p", "q") and echo["lazy_walk"] == ("p", "stay")
    assert echo["jump_walk"] == ("jumps",) and echo["kth_order"] == ("order", "alpha")
    assert echo["markov_matrix"] == () == echo["qa_majority"]  # Π is the config's to record


def test_the_trap_of_the_escape_theory_is_the_circles():
    from rw_sweeps.core import theory

    on = config.RunConfig(data=config.data_config("random_walk", K=4, N=9, p=1.0))
    assert on.data.is_trap() and theory.is_trap(on)
    for d in (config.data_config("random_walk", K=4, N=10, p=1.0), config.data_config("random_walk", K=4, N=9, p=0.5),
              config.data_config("lazy_walk", K=4, N=9, p=1.0, stay=0.0)):
        assert not theory.is_trap(config.RunConfig(data=d))


# ------------------------------------------------------------------------------------------ registration
def test_a_family_without_a_sampler_is_refused_when_it_registers():
    def build():
        @option("data")
        @dataclass
        class NoSampler(DataConfig):
            name: str = "no_sampler"
            p: float = 0.5

    text = one_line_type_error(build)
    assert text.startswith("data=no_sampler: NoSampler has no sampler") and "draw(n, gen, seed)" in text
    assert "transition(seed)" in text and "no_sampler" not in config.OPTIONS["data"]
    assert "no_sampler.yaml" not in ConfigStore.instance().repo["schema"]["data"]


def test_a_family_offering_all_without_laws_is_refused_when_it_registers():
    def build():
        @option("data")
        @dataclass
        class Promises(DataConfig):
            name: str = "promises"
            TARGETS: ClassVar[tuple] = ("last", "all")

            def draw(self, n, gen, seed):
                raise NotImplementedError

    text = one_line_type_error(build)
    assert text.startswith("data=promises: TARGETS offers all but Promises has no laws(seq, seed)")
    assert "promises" not in config.OPTIONS["data"]


@pytest.mark.parametrize("body,says", [
    (dict(TARGETS=("all",)), "TARGETS=('all',) must be a tuple of last"),
    (dict(TARGETS=("last", "every")), "TARGETS=('last', 'every') must be a tuple of last"),
    (dict(ECHO=("K",)), "ECHO names 'K', which is not one of its own keys (p)"),
    (dict(ECHO=["p"]), "ECHO=['p'] must be a tuple"),
])
def test_a_family_declaring_what_it_cannot_serve_is_refused(body, says):
    def build():
        ns = {"__annotations__": {"name": str, "p": float}, "name": "declares", "p": 0.5,
              "transition": lambda self, seed=0: np.eye(self.K), **body}
        option("data")(dataclass(type("Declares", (DataConfig,), ns)))

    text = one_line_type_error(build)
    assert text.startswith("data=declares: ") and says in text, text
    assert "declares" not in config.OPTIONS["data"]


def test_a_family_key_that_is_a_summary_field_is_not_echoed_over_it():
    def build():
        @option("data")
        @dataclass
        class Clash(DataConfig):
            name: str = "clash"
            lr: float = 0.5  # the summary's lr is optim.lr

            def transition(self, seed=0):
                return np.eye(self.K)

    assert one_line_type_error(build) == "data=clash: ECHO names 'lr', a summary field of its own; leave it out of ECHO"


def test_a_draw_of_the_wrong_shape_fails_in_one_line_naming_the_family():
    @dataclass
    class Short(DataConfig):  # not registered: only its sampler is judged
        name: str = "short"
        K: int = 3

        def draw(self, n, gen, seed):
            return data_mod.Split(torch.zeros(n, self.N - 2, dtype=torch.int64), torch.zeros(n, dtype=torch.int64),
                                  torch.full((n, self.K), 1 / self.K, dtype=torch.float64))

    with pytest.raises(ValueError) as e:
        data_mod.make(Short(N=5, n_train=2, n_test=2), 0)
    assert str(e.value) == ("data=short: draw(n=2, …) gave tokens (2, 3), y (2,), P_true (2, 3); it must give a "
                            "Split of tokens (2, 4), y (2,), P_true (2, 3) (n, N − 1, K)")


# ------------------------------------------------------------------------------------------ a new family
def _drift_walk():
    """The issue's example: a circle walk whose drift changes halfway, written as a new family would be, with
    only its schema and its sampler (no Π: it is not a time-homogeneous chain; no laws: target=last only)."""

    @dataclass
    class DriftWalk(DataConfig):
        """Walks on a circle of K nodes, clockwise with probability p for the first half of the steps, then
        with probability p_after."""
        name: str = "drift_walk"
        K: int = 5
        N: int = 13
        p: float = 0.9  # P(clockwise) for the steps s_1 → s_2 … up to the halfway step
        p_after: float = 0.2  # P(clockwise) from the halfway step on (the step to y among them)
        PER_RUN: ClassVar[tuple] = ("p", "p_after")

        def validate(self, seed: int) -> None:
            self.in_unit("p", self.p)
            self.in_unit("p_after", self.p_after)
            if self.K < 3:
                raise ConfigError("data.K", self.K, "must be >= 3 (a circle of K nodes)")

        def draw(self, n: int, gen, seed: int):
            K, N, half = self.K, self.N, (self.N - 1) // 2
            s1 = torch.randint(K, (n, 1), generator=gen)
            u = torch.rand(n, N - 1, generator=gen, dtype=torch.float64)
            p = torch.tensor([self.p] * half + [self.p_after] * (N - 1 - half), dtype=torch.float64)
            step = torch.where(u < p, 1, -1)
            s = (s1 + torch.cat([torch.zeros(n, 1, dtype=torch.int64), step.cumsum(1)], 1)) % K
            P = torch.zeros(n, K, dtype=torch.float64)
            last = s[:, -2]
            P[torch.arange(n), (last + 1) % K] = self.p_after
            P[torch.arange(n), (last - 1) % K] = 1 - self.p_after
            return data_mod.Split(s[:, :-1].contiguous(), s[:, -1].contiguous(), P)

    return DriftWalk


@pytest.fixture
def drift_walk():
    """The family registered (a choice of data=, and data/drift_walk in Hydra's ConfigStore, as a YAML file
    would make it), and taken out again afterwards."""
    cls = option("data")(_drift_walk())
    store = ConfigStore.instance()
    store.store(group="data", name="drift_walk", node={"defaults": ["/schema/data/drift_walk@_here_"]})
    try:
        yield cls
    finally:
        config.OPTIONS["data"].pop("drift_walk", None)
        store.repo["schema"]["data"].pop("drift_walk.yaml", None)
        store.repo["data"].pop("drift_walk.yaml", None)


def test_a_new_family_with_its_schema_and_draw_alone_trains_end_to_end(drift_walk, tmp_path):
    from rw_sweeps.sweeps import run

    assert drift_walk.TARGETS == ("last",) and drift_walk.ECHO == ("p", "p_after")
    c = from_dict(composed("data=drift_walk", "data.n_train=64", "data.n_test=64", "model.M=40", "optim.steps=5",
                           "init=gaussian", "wandb.mode=disabled"), complete=True)
    assert type(c.data) is drift_walk and c.model.name == "transformer"
    (s,) = run.execute([c], [tmp_path])
    assert s["status"] == "done" and s["data"] == "drift_walk", s
    assert (s["p"], s["p_after"]) == (0.9, 0.2)  # both of its keys, under their names
    assert s["opt_acc"] == 0.8  # measured: max(p_after, 1 − p_after) for every sequence
    assert s["trap"] is False and s["v_pi_cosine"] is None  # no single Π: the histogram test, no V–Π cosine
    assert math.isfinite(s["test_loss"]) and 0 <= s["test_acc"] <= 1
    verdict = contract.judge(tmp_path)
    assert verdict.done, verdict.why
    train, _ = data_mod.make(c.data, c.seed)
    steps = (torch.cat([train.tokens, train.y[:, None]], 1).diff(1) % c.data.K)
    half = (c.data.N - 1) // 2
    assert set(steps.unique().tolist()) == {1, c.data.K - 1}
    cw = (steps == 1).double()
    assert cw[:, :half].mean() > 0.8 and cw[:, half:].mean() < 0.3  # the drift changes halfway


def test_a_new_family_without_laws_is_refused_target_all_in_one_line(drift_walk):
    with pytest.raises(ConfigError) as e:
        from_dict(composed("data=drift_walk", "data.target=all", "model=gpt"), complete=True)
    assert str(e.value) == ("invalid config: data.target='all': data=drift_walk has no law at every position; "
                            "allowed: last")
    c = from_dict(composed("data=drift_walk", "model=gpt"), complete=True)  # target=last it serves
    assert c.data.target == "last" and dataclasses.asdict(c.data)["p_after"] == 0.2
