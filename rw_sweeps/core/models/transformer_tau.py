"""model=transformer_tau: eq. 2.1 with a softmax temperature, f(X) = V X S(X̃ᵀ W x̃_N / τ)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ..registry import option, rule
from .transformer import ModelConfig


@option("model")
@dataclass
class TauModelConfig(ModelConfig):
    """eq. 2.1 with the attention's logits divided by a temperature τ: S(z/τ)."""
    name: str = "transformer_tau"
    tau: float = field(default=1.0, metadata=rule(lo=0, lo_open=True))  # τ: < 1 sharpens the attention
    IMPLEMENTATIONS: ClassVar[tuple] = ()  # neither the engine nor the kernel knows τ: the reference forward
    ESCAPE_THEORY: ClassVar[Optional[str]] = "the escape theory linearises eq. 2.1's GD step at τ = 1"

    def attention(self, z):
        return super().attention(z / self.tau)
