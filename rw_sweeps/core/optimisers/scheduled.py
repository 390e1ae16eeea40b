"""A learning-rate schedule and gradient clipping: keys shared by the optimisers that take them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..registry import rule

SCHEDULES = ("constant", "cosine")


@dataclass
class Scheduled:
    """The keys of a learning-rate schedule and of gradient clipping."""
    # constant: lr at every step | cosine: lr·(1 + cos(π·t'/T'))/2 after the warm-up (t' steps of the T' after it)
    schedule: str = field(default="constant", metadata=rule(choices=SCHEDULES))
    # fraction of optim.steps over which lr rises linearly from lr/warmup-steps to lr (0: none)
    warmup: float = field(default=0.0, metadata=rule(lo=0, hi=1, hi_open=True, note="a fraction of optim.steps"))
    # the largest gradient norm, all parameters of a run together (0: no clipping)
    clip: float = field(default=0.0, metadata=rule(lo=0, note="0: no clipping"))

    def lr_factor(self, t: int) -> float:
        """w(t) for the step from θ_t: (t + 1)/W for the W = round(warmup·T) warm-up steps, then 1 (constant)
        or (1 + cos(π·(t − W)/(T − W)))/2 (cosine)."""
        T = self.steps
        W = round(self.warmup * T)
        if t < W:
            return (t + 1) / W
        if self.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * (t - W) / max(T - W, 1)))
        return 1.0


def refuse_schedule(o, engine: str) -> None:
    """The eq. 2.1 engine steps with a constant lr and the raw gradient: a schedule or clipping is refused."""
    for key, plain in (("schedule", "constant"), ("warmup", 0.0), ("clip", 0.0)):
        if getattr(o, key) != plain:
            raise ConfigError(f"optim.{key}", getattr(o, key), f"the {engine} engine takes optim.{key}={plain} only "
                              "(model=gpt serves schedules and clipping)")
