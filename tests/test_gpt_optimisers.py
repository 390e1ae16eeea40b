"""model=gpt's optimiser step, batched over runs (`rw_sweeps.core.gpt.optim.Optimiser` with each option's `gpt`
implementation), equals torch.optim run by run (each option's `oracle`: the torch.optim optimizer the exactness
tests train with) to float64 rounding: every registered optimiser serving both, with its defaults, with two
learning rates in one batch, and, where it has them, with a warm-up and cosine schedule and gradient clipping
(`torch.nn.utils.clip_grad_norm_` over a run's parameters, the lr set per step as the schedule says). Weight
decay applies to weight matrices and embeddings, not to biases (nanoGPT's groups): a bias is its own group
with no decay in the reference."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from rw_sweeps.core.config import OPTIONS, RunConfig, option_config
from rw_sweeps.core.gpt.optim import Optimiser

SERVED = sorted(n for n, c in OPTIONS["optim"].items() if {"gpt", "oracle"} <= set(c.ENGINES))
STEPS = 6


def _variants(name: str) -> list[dict]:
    """The option's keys for each case: defaults, and a schedule with clipping where it has those keys."""
    keys = {f.name for f in dataclasses.fields(OPTIONS["optim"][name])}
    out = [{"steps": STEPS}]
    if {"schedule", "warmup", "clip"} <= keys:
        out.append({"steps": STEPS, "schedule": "cosine", "warmup": 0.34, "clip": 0.3})
    return out


def _reference(o, w: torch.Tensor, b: torch.Tensor, grads: list, oracle) -> list[tuple]:
    """One run under torch.optim: w decayed, b its own group without decay (where the option decays)."""
    w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
    no_decay = dataclasses.replace(o, weight_decay=0.0) if hasattr(o, "weight_decay") else o
    opts = [oracle.make([w], o), oracle.make([b], no_decay)]
    out = []
    for t, (gw, gb) in enumerate(grads):
        w.grad, b.grad = gw.clone(), gb.clone()
        if getattr(o, "clip", 0.0) > 0:
            torch.nn.utils.clip_grad_norm_([w, b], o.clip)
        for opt in opts:
            for group in opt.param_groups:
                group["lr"] = o.lr * o.lr_factor(t)
            opt.step()
        out.append((w.detach().clone(), b.detach().clone()))
    return out


@pytest.mark.parametrize("name", SERVED)
def test_the_batched_gpt_step_equals_torch_optim_run_by_run(name):
    assert SERVED, "no optimiser serves model=gpt and the oracle"
    gen = torch.Generator().manual_seed(0)
    for keys in _variants(name):
        base = option_config("optim", name, **keys)
        optims = [base, dataclasses.replace(base, lr=base.lr * 0.37)]  # two runs, two learning rates
        cfgs = [RunConfig(model=option_config("model", "gpt"), optim=o) for o in optims]
        w0 = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
        b0 = torch.randn(2, 4, generator=gen, dtype=torch.float64)
        grads = [(torch.randn(2, 3, 4, generator=gen, dtype=torch.float64),
                  torch.randn(2, 4, generator=gen, dtype=torch.float64)) for _ in range(STEPS)]
        params = {"w": w0.clone(), "b": b0.clone()}
        opt = Optimiser(cfgs, params, {"w": True, "b": False}, torch.float64, "cpu")
        live = torch.ones(2, dtype=torch.bool)
        got = []
        for t, (gw, gb) in enumerate(grads):
            opt.step(params, {"w": gw, "b": gb}, live, t)
            got.append((params["w"].clone(), params["b"].clone()))
        oracle = type(base).ENGINES["oracle"]
        for r, o in enumerate(optims):
            want = _reference(o, w0[r], b0[r], [(gw[r], gb[r]) for gw, gb in grads], oracle)
            for t, ((w, b), (rw, rb)) in enumerate(zip(got, want)):
                assert torch.allclose(w[r], rw, rtol=1e-12, atol=1e-14), (name, keys, r, t)
                assert torch.allclose(b[r], rb, rtol=1e-12, atol=1e-14), (name, keys, r, t)
            moved = (got[-1][0][r] - w0[r]).abs().max()
            assert moved > 1e-3, (name, keys, r)  # it trained


def test_a_run_that_is_not_live_is_not_updated():
    name = SERVED[0]
    o = option_config("optim", name, steps=STEPS)
    cfgs = [RunConfig(model=option_config("model", "gpt"), optim=o)] * 2
    params = {"w": torch.ones(2, 3), "b": torch.ones(2, 3)}
    before = {k: v.clone() for k, v in params.items()}
    opt = Optimiser(cfgs, params, {"w": True, "b": False}, torch.float32, "cpu")
    opt.step(params, {"w": torch.ones(2, 3), "b": torch.ones(2, 3)}, torch.tensor([True, False]), 0)
    assert not torch.equal(params["w"][0], before["w"][0]) and torch.equal(params["w"][1], before["w"][1])
