"""model=gpt's optimisers, run by run in one batched update: every hyperparameter is a (R,) tensor.

The update rule per parameter is the optimiser option's own (its `gpt` implementation in
`rw_sweeps.core.optimisers`: GD, SGD with momentum, Adam, AdamW, each torch.optim's rule). What is common is
here: the learning rate of step t is lr·lr_factor(t) (the option's schedule), clipping scales a run's whole
gradient to norm ≤ optim.clip as torch.nn.utils.clip_grad_norm_ does, and a run that is not live (diverged)
is not updated.
"""
from __future__ import annotations

import torch


class Optimiser:
    """The update of R runs of one optimiser option; its state (`state`) is what a checkpoint saves."""

    def __init__(self, cfgs: list, params: dict, decayed: dict, dtype, device):
        o = cfgs[0].optim
        col = lambda key: torch.tensor([getattr(c.optim, key) for c in cfgs], dtype=dtype, device=device)  # noqa: E731
        self.optim, self.decayed = o, decayed
        self.rule = o.implementation("gpt", cfgs[0].model.name)(col)
        self.lr = col("lr")
        clips = [getattr(c.optim, "clip", 0.0) for c in cfgs]  # an optimiser without the key never clips
        self.clipping = any(c > 0 for c in clips)  # known once: no read of the device
        self.clip = torch.tensor(clips, dtype=dtype, device=device)
        self.state: dict = {"t": torch.zeros((), dtype=torch.int64), **self.rule.state(params)}

    def step(self, params: dict, grads: dict, live: torch.Tensor, t: int) -> None:
        """One update of every live run from its gradients (in place)."""
        shape = lambda v, x: x.view(-1, *([1] * (v.dim() - 1)))  # noqa: E731 - (R,) against (R, …)
        lr = self.lr * self.optim.lr_factor(t)
        if self.clipping:
            norm = torch.sqrt(sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in grads.values()))
            coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0)
            coef = torch.where(self.clip > 0, coef, torch.ones_like(coef))
            grads = {k: g * shape(g, coef) for k, g in grads.items()}
        n = int(self.state["t"]) + 1
        for k, p in params.items():
            keep = shape(p, live)
            new, moved = self.rule.update(k, p, grads[k], self.state, lr, n, shape, self.decayed[k])
            for name, value in moved.items():
                self.state[name] = torch.where(keep, value, self.state[name])
            params[k] = torch.where(keep, new, params[k])
        self.state["t"] = torch.tensor(n)
