"""init=zero: V(0) = 0, W(0) = 0 (and A(0) = 0), the theory's setting (Theorem 4.1), and σ = 0 of the σ axis.
On model=gpt every weight matrix and embedding is 0 (biases 0, LayerNorm gains 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..registry import OPTIONS, option
from .base import InitConfig


class Eq21:
    """The zero state: V (A) = 0 and (a, c) = 0, with no draw."""
    @staticmethod
    def initial(cfg, geo, dtype):
        import torch  # torch only where a run trains: analysis reads the schemas without it

        K, N, m = cfg.data.K, cfg.data.N, cfg.model.m
        params = ({"A": torch.zeros(K, m, dtype=dtype), "V": torch.zeros(m, K, dtype=dtype)}
                  if cfg.model.is_ffn else {"V": torch.zeros(K, K, dtype=dtype)})
        return params, (torch.zeros(K, dtype=dtype), torch.zeros(N, dtype=dtype))

    @staticmethod
    def draw_bytes(cfg) -> int:
        return 0


class Gpt:
    @staticmethod
    def weight(cfg, p, gen):
        import torch  # torch: only where a run trains

        return torch.zeros(p.shape, dtype=torch.float64)


class Oracle:
    @staticmethod
    def dense(cfg, dtype) -> dict:
        import torch  # torch: only where a run trains

        K, M = cfg.data.K, cfg.model.M
        theta = {"V": torch.zeros(K, K, dtype=dtype)}
        if cfg.model.is_ffn:
            theta = {"A": torch.zeros(K, cfg.model.m, dtype=dtype), "V": torch.zeros(cfg.model.m, K, dtype=dtype)}
        theta["W"] = torch.zeros(K + M, K + M, dtype=dtype)
        return theta


@option("init")
@dataclass
class ZeroInit(InitConfig):
    """V(0) = 0, W(0) = 0 (and A(0) = 0): the theory's setting, and σ = 0 of the σ axis."""
    name: str = "zero"
    ENGINES: ClassVar[dict] = {"eq21": Eq21, "gpt": Gpt, "oracle": Oracle}

    def scale(self) -> float:
        return 0.0

    def unit(self) -> InitConfig:
        """σ = 0 of init=gaussian's axis (its compact draw, the default): read from the registry when asked, so
        that zero init is registered first, the default option listed first."""
        return OPTIONS["init"]["gaussian"](sigma=1.0)
