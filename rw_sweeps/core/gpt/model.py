"""The batched forward pass of model=gpt and its initial parameters: R runs of one shape at once.

Every parameter carries a leading run dimension (`params[name]`: (R, …)), and every operation is batched
over it (einsum, bmm), so run r's outputs are a function of run r's parameters and data only: a packed run
is the same run alone (to rounding: the batched kernels may order their sums differently), and a
non-finite run never touches another. Matrices act on row vectors, x ↦ x·M (M: (d_in, d_out)), but for the
merged attention, which keeps eq. 2.1's orientation (logit x̂_jᵀ W x̂_i, value V x_j).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import init_generator
from .attention import causal as causal_attention
from .layernorm import layer_norm as gpt_layer_norm
from .rows import Rows, causal
from .schema import GptConfig


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its shape (without the run dimension) and its role, which decides its
    initialisation and whether a weight decay applies to it (the optimiser's `decays(role)`)."""
    name: str
    shape: tuple
    role: str  # matrix | residual (a projection into the stream: GPT-2 scales its init) | embed | gain | bias


def length(cfg: GptConfig, N: int) -> int:
    """Positions the model reads: the N − 1 observed tokens, and the blank query with query=blank."""
    return N if cfg.query == "blank" else N - 1


def params_of(cfg: GptConfig, K: int, N: int) -> list[Param]:
    """The parameters in the order a Gaussian init draws them (`init_params`): for eq. 2.1's one layer, V
    then W, as `rw_sweeps.core.model.init_dense` draws them."""
    D, H, T = cfg.width(K), cfg.n_head, length(cfg, N)
    out = []
    if cfg.embed == "learned":
        out.append(Param("wte", (K, D), "embed"))
        if cfg.pos == "learned":
            out.append(Param("wpe", (T, D), "embed"))
    for l in range(cfg.n_layer):
        h = f"h{l}."
        if cfg.norm == "layer":
            out += [Param(h + "ln1.w", (D,), "gain")] + ([Param(h + "ln1.b", (D,), "bias")] if cfg.bias else [])
        if cfg.attention == "merged":
            out += [Param(h + "V", (H, K, K), "matrix"), Param(h + "W", (H, D, D), "matrix")]
        else:
            for m in ("q", "k", "v"):
                out.append(Param(h + m, (D, D), "matrix"))
            out.append(Param(h + "o", (D, D), "residual"))
            if cfg.bias:
                out += [Param(h + m + ".b", (D,), "bias") for m in ("q", "k", "v", "o")]
        if cfg.mlp:
            if cfg.norm == "layer":
                out += [Param(h + "ln2.w", (D,), "gain")] + ([Param(h + "ln2.b", (D,), "bias")] if cfg.bias else [])
            out += [Param(h + "fc", (D, cfg.mlp * D), "matrix"), Param(h + "proj", (cfg.mlp * D, D), "residual")]
            if cfg.bias:
                out += [Param(h + "fc.b", (cfg.mlp * D,), "bias"), Param(h + "proj.b", (D,), "bias")]
    if cfg.norm == "layer":
        out += [Param("lnf.w", (D,), "gain")] + ([Param("lnf.b", (D,), "bias")] if cfg.bias else [])
    if cfg.readout == "softmax" and not (cfg.tie and cfg.embed == "learned"):
        out.append(Param("lm_head", (K, D), "matrix"))
    if cfg.readout_bias:
        out.append(Param("lm_head.b", (K,), "bias"))
    return out


def init_params(cfgs: list, K: int, N: int, dtype) -> dict:
    """Every run's initial parameters, stacked (R, …): LayerNorm gains 1 and biases 0, and every weight matrix
    and embedding as the run's init draws it on this engine (its `gpt` implementation, `rw_sweeps.core.inits`,
    in `params_of`'s order from the run's init stream: zero 0, gaussian N(0, σ²) as eq. 2.1's dense draw, gpt2
    N(0, std²) with the residual projections N(0, std²/(2·n_layer)))."""
    spec = params_of(cfgs[0].model, K, N)
    per_run = []
    for cfg in cfgs:
        init = cfg.init.implementation(cfg.model.ENGINE, cfg.model.name)
        gen = init_generator(cfg.seed)
        theta = {}
        for p in spec:
            if p.role == "gain":
                theta[p.name] = torch.ones(p.shape, dtype=torch.float64)
            elif p.role == "bias":
                theta[p.name] = torch.zeros(p.shape, dtype=torch.float64)
            else:
                theta[p.name] = init.weight(cfg, p, gen)
        per_run.append(theta)
    out = {p.name: torch.stack([t[p.name] for t in per_run]) for p in spec}
    m = cfgs[0].model
    if m.embed == "fixed" and m.gram == "exact":
        Q = _exact_basis(m, K, N)
        for l in range(m.n_layer):
            W = out[f"h{l}.W"]
            if bool(W.any()):
                out[f"h{l}.W"] = Q @ W @ Q.T
    return {k: v.to(dtype) for k, v in out.items()}


def nanogpt_state(params: dict, r: int, n_layer: int) -> dict:
    """Run r's learned-embedding parameters under a plain torch.nn nanoGPT's names (`wte`, `wpe`,
    `blocks.<l>.{ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj}`, `ln_f`, `lm_head`) and layout (nn.Linear holds
    Wᵀ of our x·M; c_attn stacks q, k, v), for `load_state_dict` into such a model: the tests' references and the
    benchmarks' baselines start from the packed runs' own draw. Keys this run lacks (biases, an untied head) are
    left out."""
    out = {"wte.weight": params["wte"][r], "wpe.weight": params["wpe"][r], "ln_f.weight": params["lnf.w"][r]}
    for l in range(n_layer):
        h, b = f"h{l}.", f"blocks.{l}."
        out |= {b + "ln_1.weight": params[h + "ln1.w"][r], b + "ln_2.weight": params[h + "ln2.w"][r],
                b + "c_attn.weight": torch.cat([params[h + m][r].T for m in "qkv"]),
                b + "c_proj.weight": params[h + "o"][r].T, b + "c_fc.weight": params[h + "fc"][r].T,
                b + "mlp_proj.weight": params[h + "proj"][r].T}
    if "lm_head" in params:
        out["lm_head.weight"] = params["lm_head"][r]
    if "lm_head.b" in params:
        out["lm_head.bias"] = params["lm_head.b"][r]
    return out


def _exact_basis(cfg: GptConfig, K: int, N: int) -> torch.Tensor:
    """Q = diag(I_K, B), B orthogonal with B p_i = ‖p‖·e_i for the sine p_1 … p_N (to rounding): Q x̃_i is
    x̃_i in the basis of `positions`, and W ↦ Q W Qᵀ keeps every logit x̃_jᵀ W x̃_i."""
    P = sine_positions(cfg, N, torch.float64)
    Phat = P / P.norm(dim=1, keepdim=True)
    full, _ = torch.linalg.qr(Phat.T, mode="complete")  # (M, M): its last M − N columns complete the rows of P̂
    B = torch.cat([Phat, full[:, N:].T])
    Q = torch.eye(K + cfg.M, dtype=torch.float64)
    Q[K:, K:] = B
    return Q


def positions(cfg: GptConfig, T: int, dtype) -> torch.Tensor:
    """The positional part of x̃_i (T, M): the sine p_i (gram=numeric), or ‖p‖·e_i (gram=exact)."""
    if cfg.gram == "numeric":
        return sine_positions(cfg, T, dtype)
    pp = cfg.pos_scale ** 2 * cfg.M / 2  # ‖p_i‖² = pos_scale²·Σ_j sin²(π i j / M) = pos_scale²·M/2
    return (math.sqrt(pp) * torch.eye(T, cfg.M, dtype=torch.float64)).to(dtype)


def sine_positions(cfg: GptConfig, T: int, dtype) -> torch.Tensor:
    """The paper's p_i (T, M): [p_i]_j = pos_scale·sin(π i j / M), i = 1..T, j = 1..M."""
    i = torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    j = torch.arange(1, cfg.M + 1, dtype=torch.float64)[None, :]
    return (cfg.pos_scale * torch.sin(math.pi * i * j / cfg.M)).to(dtype)


def vaswani_positions(T: int, D: int, dtype) -> torch.Tensor:
    """Vaswani et al.'s sinusoidal table (T, D): sin and cos of position / 10000^(2k/D) in alternate columns."""
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    k = torch.arange(0, D, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, k / D)
    out = torch.zeros(T, D, dtype=torch.float64)
    out[:, 0::2] = torch.sin(angle)
    out[:, 1::2] = torch.cos(angle)[:, : D // 2]
    return out.to(dtype)


def embed(params: dict, tokens: torch.Tensor, cfg: GptConfig, K: int) -> torch.Tensor:
    """The stream at the input (R, B, T, D). tokens (R, B, T) with the blank query as K (query=blank)."""
    R, B, T = tokens.shape
    dtype = next(iter(params.values())).dtype if params else torch.float64
    onehot = F.one_hot(tokens.long(), K + 1)[..., :K].to(dtype)  # the blank's token part is 0
    if cfg.embed == "fixed":
        P = positions(cfg, T, dtype).to(tokens.device)
        return torch.cat([onehot, P.expand(R, B, T, cfg.M)], -1)
    h = torch.einsum("rbtk,rkd->rbtd", onehot, params["wte"])
    if cfg.pos == "learned":
        h = h + params["wpe"][:, None, :T]
    elif cfg.pos == "sinusoidal":
        h = h + vaswani_positions(T, cfg.d_model, dtype).to(tokens.device)
    return h


def layer_norm(x: torch.Tensor, params: dict, name: str) -> torch.Tensor:
    """LayerNorm over the last dimension with run r's gain (and bias), torch.nn.LayerNorm's arithmetic (the CPU
    kernel where it runs, `layernorm.layer_norm`)."""
    return gpt_layer_norm(x, params[name + ".w"], params.get(name + ".b"))


def _linear(x: torch.Tensor, params: dict, name: str) -> torch.Tensor:
    y = torch.einsum("rbtd,rde->rbte", x, params[name])
    b = params.get(name + ".b")
    return y + b[:, None, None, :] if b is not None else y


def _linear_many(x: torch.Tensor, params: dict, names: list[str]) -> torch.Tensor:
    """The linear maps `names` of the same input, side by side in the last dimension, in one product."""
    y = torch.einsum("rbtd,rde->rbte", x, torch.cat([params[n] for n in names], -1))
    if params.get(names[0] + ".b") is None:
        return y
    return y + torch.cat([params[n + ".b"] for n in names], -1)[:, None, None, :]


def attention(a: torch.Tensor, params: dict, cfg: GptConfig, K: int, l: int, start: int, maps: bool = True):
    """One block's attention for the queries start … T − 1 over every key: (output to add to the stream, its
    weights S as `Rows`, or None without `maps`). The query/key/value attention runs fused, with no T×T map
    held (causal: `attention.causal`, this package's CPU kernel or torch's scaled_dot_product_attention; the
    same softmax to rounding), its `Rows` computed from the queries and keys when read; the merged attention
    computes S whole."""
    h = f"h{l}."
    R, B, T, D = a.shape
    Hn = cfg.n_head
    if cfg.attention == "merged":
        an = a / a.norm(dim=-1, keepdim=True) if cfg.normalize == "whole" else a
        u = torch.einsum("rbid,rhed->rbhie", an[:, :, start:], params[h + "W"])  # W x̂_i
        S = causal(torch.einsum("rbjd,rbhid->rbhij", an, u), start)
        value = torch.einsum("rbjk,rhlk->rbhjl", a[..., :K], params[h + "V"])  # V x_j on the token part
        out = torch.einsum("rbhij,rbhjl->rbil", S, value)
        return F.pad(out, (0, D - K)), Rows(start, S=S) if maps else None
    dh = D // Hn
    if start == 0:  # q, k and v of every position: one pass over the stream, as nanoGPT's c_attn (~2× faster)
        qkv = _linear_many(a, params, [h + m for m in "qkv"])
        y = causal_attention(qkv, Hn) if T > 1 else qkv[..., 2 * D:]  # one position sees itself: its value
        out = _linear(y, params, h + "o")
        if not maps:
            return out, None
        q, k, _ = (z.view(R, B, T, Hn, dh) for z in qkv.split(D, -1))
        return out, Rows(start, q=q, k=k)
    if start != T - 1:  # what `forward` asks: causal from the first query, or the last over every key
        raise ValueError(f"queries from position {start} of {T}: only 0 and the last are served")
    q = _linear(a[:, :, start:], params, h + "q").view(R, B, 1, Hn, dh)
    k = _linear(a, params, h + "k").view(R, B, T, Hn, dh)
    v = _linear(a, params, h + "v").view(R, B, T, Hn, dh)
    heads = lambda z: z.transpose(2, 3).reshape(R * B, Hn, z.shape[2], dh)  # noqa: E731 - (R·B, H, T, dh), contiguous
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))  # the last query over every key: no mask
    out = _linear(y.view(R, B, Hn, 1, dh).transpose(2, 3).reshape(R, B, 1, D), params, h + "o")
    return out, Rows(start, q=q, k=k) if maps else None


def forward(params: dict, tokens: torch.Tensor, cfg: GptConfig, K: int, read: str,
            attention_maps: bool = False):
    """The model's output at the positions read (`read`: last → (R, B, 1, K), all → (R, B, T, K)): logits
    (readout=softmax) or f (readout=linear); and, with `attention_maps`, every block's S (`Rows`). The last block
    computes only the positions read (its other positions reach no output)."""
    x = embed(params, tokens, cfg, K)
    T = x.shape[2]
    maps = []
    for l in range(cfg.n_layer):
        start = T - 1 if read == "last" and l == cfg.n_layer - 1 else 0
        a = layer_norm(x, params, f"h{l}.ln1") if cfg.norm == "layer" else x
        out, S = attention(a, params, cfg, K, l, start, maps=attention_maps)
        x = x[:, :, start:] + out if cfg.residual else out
        if cfg.mlp:
            b = layer_norm(x, params, f"h{l}.ln2") if cfg.norm == "layer" else x
            x = x + _linear(F.gelu(_linear(b, params, f"h{l}.fc")), params, f"h{l}.proj")
        if attention_maps:
            maps.append(S)
    if read == "last":
        x = x[:, :, -1:]
    if cfg.norm == "layer":
        x = layer_norm(x, params, "lnf")
    if cfg.readout == "linear":
        return x[..., :K], maps
    U = params["wte"] if cfg.tie and cfg.embed == "learned" else params["lm_head"]
    logits = torch.einsum("rbtd,rkd->rbtk", x, U)
    if cfg.readout_bias:
        logits = logits + params["lm_head.b"][:, None, None, :]
    return logits, maps
