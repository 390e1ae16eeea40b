"""Every model option of eq. 2.1's engine, over the registry: its reference forward (`ModelConfig.forward`) is
the literal model (the dense oracle trains by it), and each implementation it declares (`IMPLEMENTATIONS`: the
engine's hand-written backward, the C kernel) equals the reference on held shapes and settings, in float64
and float32, its runs packed in one batch and alone. A new model option is covered here as it registers.

Tolerances: float64 1e-10 of each tensor's scale (max |x|, at least 1), float32 1e-4 (test_fused.py's); the
reference path against the dense oracle as tests/test_engine.py holds the engine to it (1e-8 of V's scale).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from rw_sweeps.core import data as data_mod
from rw_sweeps.core import fused, model, oracle, training
from rw_sweeps.core.config import RunConfig, data_config, option_config, validate
from rw_sweeps.core.errors import ConfigError
from rw_sweeps.core.models.base import check_implementations
from rw_sweeps.core.models.transformer_tau import TauModelConfig
from rw_sweeps.core.registry import OPTIONS

EQ21 = {name: cls for name, cls in OPTIONS["model"].items() if cls.ENGINE == "eq21"}
STEPS = 6
RTOL = {"float64": 1e-10, "float32": 1e-4}
PROBE_FIELDS = ("loss", "acc", "kl", "pred_dist", "attention", "spread", "h_example", "h_var")


def held(cls) -> list[dict]:
    """The settings of its keys an option is checked at: its defaults, its `HELD`, and each float key halved
    (so a key the fast paths ignore, a temperature, is held away from its default)."""
    name = cls.__dataclass_fields__["name"].default
    moved = []
    for f in dataclasses.fields(cls):
        if type(f.default) is float:  # halved, or doubled where its rule refuses half (a key of minimum 1)
            moved += [next(({f.name: v} for v in (f.default / 2, f.default * 2) if _accepted(name, f.name, v)), {})]
    return [{}, *cls.HELD, *[m for m in moved if m]]


def _accepted(name: str, key: str, value: float) -> bool:
    try:
        validate(RunConfig(model=option_config("model", name, **{key: value})))
    except ConfigError:
        return False
    return True


CASES = [(name, impl, i) for name, cls in EQ21.items() for impl in cls.IMPLEMENTATIONS
         for i in range(len(held(cls)))]


def runs(option, precision: str, K: int = 5, N: int = 13) -> list[RunConfig]:
    """Three runs of one shape with their own seeds, p and Gaussian θ(0): attention far from uniform."""
    out = [validate(RunConfig(seed=s, precision=precision, model=option,
                              data=data_config(K=K, N=N, p=p, n_train=40, n_test=24),
                              init=option_config("init", "gaussian", sigma=0.05)))
           for s, p in enumerate((0.3, 0.6, 0.8))]
    for c in out:
        c.optim.lr, c.optim.steps = 1.0, STEPS
    return out


def batch(cfgs: list[RunConfig], paths: tuple):
    """(train, test, state, lr, eps, w, geo) as training.train builds them, on the implementations `paths`."""
    dtype = getattr(torch, cfgs[0].precision)
    geo = dataclasses.replace(model.geometry(cfgs[0].model, cfgs[0].data.N), paths=paths)
    splits = [data_mod.make(c.data, c.seed) for c in cfgs]
    train, test = (training.stack_data([s[i] for s in splits], dtype, "cpu") for i in (0, 1))
    vec = lambda xs: torch.tensor(xs, dtype=dtype)  # noqa: E731
    return (train, test, training.initial_state(cfgs, geo, dtype), vec([c.optim.lr for c in cfgs]),
            vec([c.optim.eps for c in cfgs]), vec([1 / c.data.n_train for c in cfgs]), geo)


def trained(cfgs: list[RunConfig], paths: tuple) -> dict:
    """The losses of STEPS GD steps, the final state and its test evaluation, on the implementations `paths`."""
    train, test, state, lr, eps, w, geo = batch(cfgs, paths)
    loss, _ = fused.train_steps(state, train, lr, eps, w, geo, STEPS)
    probe = fused.evaluate(state, test, eps, geo)
    return {"loss": loss, "a": state.a, "c": state.c, **{f"param {k}": v for k, v in state.params.items()},
            **{f"probe {k}": getattr(probe, k) for k in PROBE_FIELDS}}


def alone(cfgs: list[RunConfig], paths: tuple) -> dict:
    """`trained`, each run in a batch of its own, stacked."""
    parts = [trained([c], paths) for c in cfgs]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def mismatches(want: dict, got: dict, rtol: float) -> list[str]:
    """The tensors of `got` further than rtol·max(1, max |want|) from `want`'s, with how far."""
    out = []
    for k, ref in want.items():
        err = (ref - got[k]).abs().nan_to_num(float("inf")).max().item()
        if err > rtol * max(1.0, ref.abs().max().item()):
            out.append(f"{k}: {err:.2e}")
    return out


def declared(impl: str) -> tuple:
    """The paths that run implementation `impl` and hand nothing on to another: the kernel forced."""
    return ("engine", "kernel") if impl == "kernel" else ("engine",)


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "alone"])
@pytest.mark.parametrize("name,impl,setting", CASES)
def test_every_declared_implementation_equals_the_reference(name, impl, setting, packed, precision, monkeypatch):
    keys = held(EQ21[name])[setting]
    option = option_config("model", name, **keys)
    cfgs = runs(option, precision)
    if impl == "kernel" and (option.gram != "exact" or not fused.available(K=5, precision=precision)):
        pytest.skip(f"the kernel does not run model={name} {keys} here: {fused.last_error() or 'its gate'}")
    want = trained(cfgs, ())
    assert all(torch.isfinite(v).all() for v in want.values())
    if impl == "kernel":
        monkeypatch.setenv("RW_SWEEPS_BACKEND", "fused")  # the kernel itself, or an error: never a fallback
    got = (trained if packed else alone)(cfgs, declared(impl))
    off = mismatches(want, got, RTOL[precision])
    assert off == [], (f"model={name} declares {impl} (IMPLEMENTATIONS), which at {keys or 'its defaults'} "
                       f"({precision}, {'packed' if packed else 'alone'}) is not its reference forward: "
                       f"{'; '.join(off)}")
    assert (want["probe attention"] - want["probe attention"][:, :1]).abs().max() > 1e-3  # it is not uniform


@pytest.mark.parametrize("name,setting", [(n, i) for n, cls in EQ21.items() for i in range(len(held(cls)))])
def test_the_reference_path_trains_the_literal_model(name, setting):
    """The compact reference path (its own forward on the logits of a, c) against the dense oracle, W itself,
    in float64 (in float32 an FFN's ReLU gate near 0 may flip in one and not the other, and the two part)."""
    keys = held(EQ21[name])[setting]
    option = option_config("model", name, M=32, **keys)
    for precision, tol in (("float64", 1e-8),):
        c = validate(RunConfig(seed=3, precision=precision, model=option,
                               data=data_config(K=4, N=11, p=0.7, n_train=30, n_test=10),
                               init=option_config("init", "gaussian", sigma=0.3, draw="dense")))
        c.optim.lr = 0.5
        ref = oracle.train(c, STEPS, trajectory=False)[-1]
        train, _, state, lr, eps, w, geo = batch([c], ())
        fused.train_steps(state, train, lr, eps, w, geo, STEPS)
        attention = fused.evaluate(state, train, eps, geo).attention[0]
        assert (state.params["V"][0] - ref[1]).abs().max() < tol * max(1.0, ref[1].abs().max().item())
        assert (attention - ref[2]).abs().max() < tol
        assert (ref[2] - ref[2][:1]).abs().max() > 1e-3  # the oracle's attention moved away from uniform


class TauOnEq21sPaths(TauModelConfig):
    """A contributor's mistake: the temperature model declaring eq. 2.1's engine and kernel, neither of which
    knows τ (not registered: `check_implementations` is what registration runs)."""
    IMPLEMENTATIONS = ("engine", "kernel")
    ESCAPE_THEORY = TauModelConfig.ESCAPE_THEORY


def test_the_check_catches_a_fast_path_that_ignores_the_temperature():
    """At τ = 1 the wrong fast path equals the reference; at the held τ = 0.5 the check above sees it."""
    check_implementations(TauOnEq21sPaths)  # registration alone accepts it
    for tau, caught in ((1.0, False), (0.5, True)):
        cfgs = runs(TauOnEq21sPaths(name="transformer_tau", tau=tau), "float64")
        found = mismatches(trained(cfgs, ()), trained(cfgs, ("engine",)), RTOL["float64"])
        assert bool(found) == caught, found
    assert {"tau": 0.5} in held(TauModelConfig)


def test_an_option_that_inherits_its_parents_fast_paths_is_refused():
    inherits = dataclasses.make_dataclass("Inherits", [("name", str, "inherits")], bases=(TauModelConfig,))
    with pytest.raises(TypeError, match="model=inherits: Inherits declares no IMPLEMENTATIONS of its own"):
        check_implementations(inherits)
    kernel_alone = type("KernelAlone", (inherits,), {"IMPLEMENTATIONS": ("kernel",)})
    with pytest.raises(TypeError, match="declares the kernel without the engine"):
        check_implementations(kernel_alone)
    unknown = type("Unknown", (inherits,), {"IMPLEMENTATIONS": ("cuda",)})
    with pytest.raises(TypeError, match=r"IMPLEMENTATIONS = \('cuda',\); a tuple of engine, kernel"):
        check_implementations(unknown)


def test_an_option_that_inherits_whether_the_escape_theory_describes_it_is_refused():
    """The escape theory linearises one forward's GD step: a new forward says whether it is described."""
    declared = type("Declared", (TauModelConfig,), {"IMPLEMENTATIONS": ()})
    with pytest.raises(TypeError, match="Declared declares no ESCAPE_THEORY of its own"):
        check_implementations(declared)


@pytest.mark.parametrize("name", sorted(EQ21))
def test_the_kernel_runs_exactly_the_options_that_declare_it(name):
    c = runs(option_config("model", name), "float64")[0]
    assert fused.available(c) == ("kernel" in EQ21[name].IMPLEMENTATIONS and fused.available(K=5))
    why = fused.why_not(EQ21[name].IMPLEMENTATIONS, 5, "exact", "float64")
    assert (why == "the model option does not declare the kernel") == ("kernel" not in EQ21[name].IMPLEMENTATIONS)


def test_an_option_without_a_fast_path_trains_on_its_reference_and_says_so_once(tmp_path, capsys):
    name = next(n for n, cls in EQ21.items() if not cls.IMPLEMENTATIONS)
    cfgs = runs(option_config("model", name, **held(EQ21[name])[-1]), "float64")  # away from its defaults
    training.SAID.discard(name)
    recs = [training.train([c], [tmp_path / str(i)], progress=False)[0] for i, c in enumerate(cfgs[:2])]
    said = [ln for ln in capsys.readouterr().out.splitlines() if "declares no fast implementation" in ln]
    assert said == [f"model={name} declares no fast implementation of its forward (IMPLEMENTATIONS): its runs "
                    "train on the reference forward by autograd, exact and slower"]
    want = trained(cfgs[:1], ())
    assert abs(recs[0].history[-1]["test_loss"] - want["probe loss"][0].item()) < 1e-12
