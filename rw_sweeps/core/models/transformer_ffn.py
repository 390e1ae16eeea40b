"""model=transformer_ffn: App. F.1, f(X) = A ReLU(V X S(X̃ᵀ W x̃_N)), A ∈ R^{K×m}, V ∈ R^{m×K}: the
transformer plus an FFN, after the attention or before it (per token)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ..registry import option
from .transformer import ModelConfig


@option("model")
@dataclass
class FfnModelConfig(ModelConfig):
    """App. F.1: f(X) = A ReLU(V X S(X̃ᵀ W x̃_N)), A ∈ R^{K×m}, V ∈ R^{m×K}: the transformer plus an FFN."""
    name: str = "transformer_ffn"
    m: int = 19  # FFN width
    # where the FFN sits: after the attention, f = A·ReLU(V·X·S) | before it, per token,
    # f = Σ_i S_i·A·ReLU(V x_i) = A·ReLU(V)·X·S (x_N's token part is 0, so the query adds nothing)
    ffn: str = "after"
    IMPLEMENTATIONS: ClassVar[tuple] = ("engine",)  # the kernel is eq. 2.1's; the engine has both placements
    HELD: ClassVar[tuple] = (*ModelConfig.HELD, {"ffn": "before"}, {"ffn": "before", "normalize": "whole"})
    ESCAPE_THEORY: ClassVar[Optional[str]] = (
        "zero init is a fixed point where ReLU'(0) = 0, so the linearised step is the identity and the escape is "
        "second order in sigma, which this theory does not see")

    def readout(self, params: dict, X, S):
        """f = A ReLU(V X S) (ffn=after), or Σ_i S_i A ReLU(V x_i) (ffn=before: the FFN on every column x_i
        of X, the query's zero token part included, then the attention's average)."""
        import torch  # torch: only where a run trains (the schemas are read without it)

        V, A = params["V"][..., None, :, :], params["A"][..., None, :, :]  # one (V, A) for every sequence
        if self.ffn == "before":
            return (A @ torch.relu(V @ X) @ S[..., None])[..., 0]
        return (A @ torch.relu(V @ (X @ S[..., None])))[..., 0]

    @property
    def is_ffn(self) -> bool:
        return True
