"""model=gpt's schema: a decoder-only transformer, and the switches under which it is eq. 2.1.

nanoGPT's block is the default (learned token and position embeddings, pre-LayerNorm, causal multi-head
attention with query/key/value/output maps, a 4× GELU MLP, a final LayerNorm, a softmax readout trained on
cross-entropy). `conf/model/gpt_eq21.yaml` sets the switches that make it the paper's model: the fixed
embedding x̃_i = [one-hot x_i; p_i] with the blank query x̃_N = [0; p_N], one head whose logits are
x̂_jᵀ W x̂_i with the merged key-query matrix W, a value V acting on the token part, no residual, norm or
MLP, and the linear readout f = the token part with ℓ = −log(f_y + ε).

Depth in the paper's parametrisation (`model.residual=true`, n_layer ≥ 2): every layer l has its own W_l and
V_l; the stream starts at x̃_i and each layer adds V_l·Σ_j S^l_ij x_j^{(l−1)} to the token part of position i,
x_j^{(l−1)} the token part of position j after layer l − 1 and S^l_i = softmax_j≤i(x̂_jᵀ W_l x̂_i) causal; f is the
token part of the query after the last layer. One layer is eq. 2.1 exactly (the query's token part is 0, so
the residual adds nothing to f).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from ..errors import ConfigError
from ..models import ModelBase, resolve_normalize
from ..registry import choice, option

SNAPSHOT_MAP_MAX_T = 64  # snapshots keep whole mean attention maps up to this many positions (else the read row)


@option("model")
@dataclass
class GptConfig(ModelBase):
    """A decoder-only transformer (nanoGPT), R runs batched; `gpt_eq21` is eq. 2.1 as a special case."""
    name: str = "gpt"
    n_layer: int = 1  # transformer blocks
    n_head: int = 1  # attention heads per block (d_model must be a multiple for attention=qkv)
    d_model: Optional[int] = 8  # the residual stream's width; null with embed=fixed, where it is K + M
    mlp: int = 4  # the MLP's hidden width as a multiple of d_model (GELU); 0: attention-only
    norm: str = "layer"  # layer: pre-LayerNorm before attention and MLP, and a final one | none
    bias: bool = False  # biases in the linear maps and LayerNorms
    tie: bool = True  # the unembedding is the token embedding (readout=softmax, embed=learned)
    pos: str = "learned"  # learned (added) | sinusoidal (added, Vaswani's; with embed=fixed the paper's p_i) | none
    embed: str = "learned"  # learned: a K×d_model table | fixed: x̃_i = [one-hot x_i; p_i], p_i the paper's sine of length M
    # qkv: query, key, value and output maps per head (nanoGPT) | merged: logits x̂_jᵀ W x̂_i with one W per
    # head and a value V on the token part, written back to the token part (eq. 2.1; embed=fixed)
    attention: str = "qkv"
    residual: bool = True  # each block adds its output to the stream (false: replaces it, eq. 2.1's one layer)
    # softmax: logits = stream·Uᵀ, cross-entropy | linear: f = the token part of the stream, ℓ = −log(f_y + ε)
    # with ε = optim.eps (eq. 2.1; embed=fixed)
    readout: str = "softmax"
    # a bias b on the softmax readout, logits = x·Uᵀ + b (nn.Linear(d, K, bias=True) as lm_head: Makkuva et al.'s
    # code); with tie=true U is the token embedding and b its own
    readout_bias: bool = False
    query: str = "none"  # none: read at the last token | blank: append x̃_N = [0; p_N] and read there (eq. 2.1)
    M: int = 100  # the paper's positional dimension (embed=fixed)
    pos_scale: float = 1.0  # [p_i]_j = pos_scale·sin(π i j / M) (embed=fixed)
    # embed=fixed: exact: the p_i in the orthogonal basis where p_i = ‖p‖·e_i, so p_iᵀp_j = ‖p‖²·1[i=j] exactly
    # (Lemma E.5), a Gaussian W carried into it (the same logits, the same run as model=transformer's exact
    # Gram) | numeric: the sine p_i as rounded, whose Gram's rounding breaks Theorem 4.1's symmetric point
    gram: str = "exact"
    # inside the attention logits only (merged attention): none | whole: x̂ = x/‖x‖ per position | auto: whole
    # with init=gaussian and merged attention, none otherwise (the paper's protocol, as for model=transformer)
    normalize: str = "auto"
    PER_RUN: ClassVar[tuple] = ()
    # precision=auto: float32, what GPT codebases (nanoGPT, Makkuva et al.'s) train in, and ~2× faster here
    # than float64 (docs/deeper-models.md); `precision=float64` for exactness, as gpt_eq21 and the tests set it
    PRECISION: ClassVar[str] = "float32"
    TRAINER: ClassVar[str] = "rw_sweeps.core.gpt.training"
    ENGINE: ClassVar[str] = "gpt"

    def resolved(self, init) -> "GptConfig":
        if self.attention != "merged" and self.normalize == "auto":
            return dataclasses.replace(self, normalize="none")
        return resolve_normalize(self, init)

    def recorded(self, c) -> tuple[int, int]:
        """Numbers in one history row (`attn_parent` and `induction` per layer and head, beside its scalars)
        and one snapshot row (the mean attention per layer, head and position read; the whole maps up to
        SNAPSHOT_MAP_MAX_T positions), as `rw_sweeps.core.gpt.training` records them."""
        heads, T = self.n_layer * self.n_head, c.data.N if self.query == "blank" else c.data.N - 1
        maps = heads * T * T if T <= SNAPSHOT_MAP_MAX_T else 0
        return 16 + 2 * heads, heads * T + maps + 8  # and the step, and room for a scalar or two

    def width(self, K: int) -> int:
        """The residual stream's width."""
        return K + self.M if self.embed == "fixed" else self.d_model

    def validate(self, c) -> None:
        d, K = c.data, c.data.K
        choice("model.norm", self.norm, ("layer", "none"))
        choice("model.pos", self.pos, ("learned", "sinusoidal", "none"))
        choice("model.embed", self.embed, ("learned", "fixed"))
        choice("model.attention", self.attention, ("qkv", "merged"))
        choice("model.readout", self.readout, ("softmax", "linear"))
        choice("model.query", self.query, ("none", "blank"))
        choice("model.normalize", self.normalize, ("none", "whole"))
        choice("model.gram", self.gram, ("exact", "numeric"))
        for key in ("n_layer", "n_head"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}", getattr(self, key), "must be an integer >= 1")
        if self.mlp < 0:
            raise ConfigError("model.mlp", self.mlp, "must be >= 0 (0: attention-only)")
        if self.embed == "fixed":
            if self.d_model is not None:
                raise ConfigError("model.d_model", self.d_model, f"must be null with model.embed=fixed (the width is K + M = {K + self.M})")
            if self.tie:
                raise ConfigError("model.tie", self.tie, "must be false with model.embed=fixed (no embedding table to tie)")
            if self.pos != "sinusoidal":
                raise ConfigError("model.pos", self.pos, "must be sinusoidal with model.embed=fixed (x̃_i = [x_i; p_i])")
            if self.M < d.N + 1:
                raise ConfigError("model.M", self.M, f"must be > data.N ({d.N}): the N sine positions are orthogonal for M > N")
            if not (math.isfinite(self.pos_scale) and self.pos_scale > 0):
                raise ConfigError("model.pos_scale", self.pos_scale, "must be a finite number > 0")
        else:
            if self.d_model is None or self.d_model < 1:
                raise ConfigError("model.d_model", self.d_model, "must be an integer >= 1 with model.embed=learned")
            for key, why in (("attention", "merged"), ("readout", "linear"), ("query", "blank")):
                if getattr(self, key) == why:
                    raise ConfigError(f"model.{key}", why, "needs model.embed=fixed (it reads the token part x_i)")
        if self.attention == "qkv" and self.width(K) % self.n_head:
            raise ConfigError("model.n_head", self.n_head, f"must divide the width ({self.width(K)}) with model.attention=qkv")
        if self.embed == "fixed" and self.gram == "exact" and self.attention != "merged":
            raise ConfigError("model.gram", self.gram, "exact applies to model.attention=merged; allowed: numeric")
        if self.normalize == "whole" and self.attention != "merged":
            raise ConfigError("model.normalize", self.normalize, "applies to model.attention=merged only; allowed: none")
        if self.readout_bias and self.readout != "softmax":
            raise ConfigError("model.readout_bias", self.readout_bias, "applies to model.readout=softmax only "
                              "(eq. 2.1's f is the token part itself)")
        if self.query == "blank" and d.target == "all":
            raise ConfigError("data.target", d.target, "model.query=blank reads one prediction (x_N); allowed: last")
        if d.target not in d.TARGETS:
            raise ConfigError("data.target", d.target, f"data={d.name} has no law at every position; allowed: "
                              f"{', '.join(d.TARGETS)}")


@option("model")
@dataclass
class GptEq21Config(GptConfig):
    """model=gpt under the switches of eq. 2.1 (`conf/model/gpt_eq21.yaml` holds them): the paper's model
    through the generic path, named so that a run's summary says which it was."""
    name: str = "gpt_eq21"
    PRECISION: ClassVar[str] = "float64"  # eq. 2.1 through the generic path: agrees with model=transformer to 1e-8
