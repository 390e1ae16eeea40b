"""optim=adamw: torch.optim.AdamW's rule: θ ← θ·(1 − lr·λ), then the Adam step (decoupled weight decay).

On the eq. 2.1 engine the decay of W scales u = W x̂_N, hence a and c (c = P u[K:]), by the same factor, and
V (and A) as they are; the Adam step is then Adam's own (`adam.Eq21`), whose moments do not depend on θ.
On model=gpt the decay applies to the weight matrices and embeddings, not to biases or gains (nanoGPT)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..registry import option, rule
from . import adam
from .scheduled import Scheduled, refuse_schedule


class Eq21(adam.Eq21):
    @staticmethod
    def check(o) -> None:
        refuse_schedule(o, "eq21")

    def __init__(self, cfgs: list, geo, dtype, device):
        super().__init__(cfgs, geo, dtype, device)
        import torch  # torch and the engine only where a run trains: analysis reads the schemas without them

        from .. import engine

        self.engine = engine
        self.shrink = 1 - torch.tensor([c.optim.lr * c.optim.weight_decay for c in cfgs], dtype=dtype, device=device)

    def steps(self, state, data, eps, w, geo, n: int):
        e, f = self.engine, self.shrink

        def one():
            loss, grads = e.gradients(state, data, eps, w, geo)
            for k, v in state.params.items():
                state.params[k] = v * f.view(-1, *([1] * (v.dim() - 1)))
            state.a.mul_(f[:, None])
            state.c.mul_(f[:, None])
            self.compact.step(state, grads, self.hp)
            return loss

        return e.run_steps(state, n, one)


class Gpt(adam.Gpt):
    def __init__(self, col):
        super().__init__(col)
        self.decay = col("weight_decay")


class Oracle:
    @staticmethod
    def make(params: list, o):
        import torch  # torch: only where a run trains

        return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.adam_eps,
                                 weight_decay=o.weight_decay)


@option("optim")
@dataclass
class AdamW(Scheduled, adam.Adam):
    """AdamW: torch.optim.AdamW's rule, decoupled weight decay (on model=gpt, on the weight matrices and
    embeddings, not on biases or LayerNorm gains, as nanoGPT groups them)."""
    name: str = "adamw"
    lr: float = field(default=2e-3, metadata=rule(lo=0, lo_open=True))
    weight_decay: float = field(default=0.01, metadata=rule(lo=0))  # λ: θ ← θ − lr·λ·θ before the Adam step
    # model=gpt: decay the embeddings too (wte, wpe, and with model.tie the tied readout) | false: the weight
    # matrices only, as Makkuva et al.'s code (the older nanoGPT's groups: Linear weights decayed, Embedding not)
    decay_embeddings: bool = True
    PER_RUN: ClassVar[tuple] = ("lr", "eps", "reduction", "beta1", "beta2", "adam_eps", "weight_decay")
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}

    def decays(self, role: str) -> bool:
        return super().decays(role) and (role != "embed" or self.decay_embeddings)
