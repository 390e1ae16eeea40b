"""init=gaussian: V_ij(0), W_ij(0) (and A for the FFN) i.i.d. N(0, σ²) (§5b), drawn from the run's init stream
(`model.init_generator`); σ = 0 is zero init's state (with the Gaussian protocol's model.normalize=auto)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from ..registry import option, rule
from .base import InitConfig


class Eq21:
    """A (FFN) and V as drawn, W as its compact (a, c): drawn directly (draw=compact, `model.init_compact`)
    or as the literal (K+M)² W reduced to (a, c) (draw=dense, `model.init_dense`)."""
    @staticmethod
    def initial(cfg, geo, dtype):
        from .. import (
            model,  # torch only where a run trains: analysis reads the schemas without it
        )

        K, N, o = cfg.data.K, cfg.data.N, cfg.init
        gen = model.init_generator(cfg.seed)
        if o.draw == "compact":
            return model.init_compact(cfg.model, K, N, o.sigma, gen, geo, dtype)
        theta = model.init_dense(cfg.model, K, o.sigma, gen, dtype)
        W = theta.pop("W")
        return theta, model.compact(W, cfg.model, K, N, geo)

    @staticmethod
    def draw_bytes(cfg) -> int:
        """The dense (K+M)² float64 W with draw=dense, and the N×M positions it is reduced with (or that the
        compact draw multiplies with gram=numeric)."""
        d, m, o = cfg.data, cfg.model, cfg.init
        dense_W = (d.K + m.M) ** 2 * 8 if o.draw == "dense" else 0
        positions = d.N * m.M * 8 if o.draw == "dense" or m.gram == "numeric" else 0
        return dense_W + positions


class Gpt:
    """Every weight matrix and embedding N(0, σ²), drawn in `gpt.model.params_of`'s order (under either
    draw: model=gpt draws every parameter literally)."""
    @staticmethod
    def weight(cfg, p, gen):
        import torch  # torch: only where a run trains

        return cfg.init.sigma * torch.randn(p.shape, generator=gen, dtype=torch.float64)


class Oracle:
    """The engine's own draws (same generator, same order): the literal W (draw=dense), or the compact draw
    lifted to a dense W with exactly that (a, c) (`model.dense_W`)."""
    @staticmethod
    def dense(cfg, dtype) -> dict:
        import torch  # torch: only where a run trains

        from .. import model  # torch: only where a run trains

        K, N, o = cfg.data.K, cfg.data.N, cfg.init
        gen = model.init_generator(cfg.seed)
        if o.draw == "dense":
            return model.init_dense(cfg.model, K, o.sigma, gen, dtype)
        geo = model.geometry(cfg.model, N)
        theta, (a, c) = model.init_compact(cfg.model, K, N, o.sigma, gen, geo, torch.float64)
        theta["W"] = model.dense_W(a, c, cfg.model, K, N, geo)
        return {k: v.to(dtype) for k, v in theta.items()}


@option("init")
@dataclass
class GaussianInit(InitConfig):
    """V_ij(0), W_ij(0) (and A for the FFN) i.i.d. N(0, sigma²) (§5b); sigma = 0 is zero init."""
    name: str = "gaussian"
    sigma: float = field(default=0.01, metadata=rule(lo=0, note="σ = 0 is zero init"))
    # how W is drawn (A and V are drawn the same either way): compact (default) draws a = (W x̂_N)[:K] and
    # c_j = p_jᵀ(W x̂_N)[K:] directly, the same distribution as the dense draw, not the same sample |
    # dense: the literal (K+M)² W, so the oracle tests and any dense implementation compare run for run.
    # model=gpt draws every parameter literally under either
    draw: str = field(default="compact", metadata=rule(choices=("compact", "dense")))
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}
    AUTO_NORMALIZE: ClassVar[str] = "whole"  # the paper's protocol normalises x̃ with a Gaussian init

    def scale(self) -> float:
        return self.sigma

    def unit(self) -> InitConfig:
        return dataclasses.replace(self, sigma=1.0)
