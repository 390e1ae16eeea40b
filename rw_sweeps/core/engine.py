"""Batched full-batch gradient descent (eq. 2.2–2.3) for R runs of one shape, as one tensor program.

Every run has its own data, initial state, lr and ε; nothing couples the runs. A single run is R = 1.
The state per run is the compact model of `model.py`: V (and A), a = u[:K], c = (p_jᵀ u[K:])_j.

Gradients are written out (they are short) rather than taken by autograd: it avoids storing (R, n, N)
intermediates. With g_b = w / (F_b + ε) (w = 1/n for the mean loss), F_b = [f(X_b)]_{y_b} and
ω_b = ∂F_b/∂h_b (= V[y_b, :] for eq. 2.1, (A·ReLU(V))[y_b, :] for F.1 with the FFN before the attention):

    ∂L/∂z_bj = −g_b S_bj (ω_b[s_bj] − ω_b·h_b)   (j < N),      ∂L/∂z_bN = g_b S_bN ω_b·h_b,

and u = W x̂_N moves by −lr·κ·Σ_bj ∂L/∂z_bj x̂_bj (Lemma B.1: the W-gradient is (·)·x̂_Nᵀ).
`rw_sweeps.core.oracle` is the literal dense autograd version that the tests hold this to.

The hand-written backward (and `model.attend` / `model.output`, its forward) is one implementation of a model
option's forward (`ModelConfig.forward`), the one it declares as "engine" (`IMPLEMENTATIONS`, which
`Geometry.paths` carries). A model that does not declare it trains here all the same, on its reference:
the same compact state, the logits z of eq. 2.1 (`logits`), its own forward and autograd (`reference_gradients`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import model
from .model import Geometry


@dataclass
class Batch:
    """Token data of R runs stacked: tokens (R, n, N−1) int64, y (R, n) int64, P_true (R, n, K)."""

    tokens: torch.Tensor
    y: torch.Tensor
    P_true: torch.Tensor


@dataclass
class State:
    params: dict  # "V" (R, K, K) or (R, m, K); "A" (R, K, m) for the FFN
    a: torch.Tensor  # (R, K)
    c: torch.Tensor  # (R, N)
    step: int = 0
    opt: Optional[dict] = None  # the optimizer's own state per run, stacked (optim=adam: `adam.moments`)


@dataclass
class Grads:
    """∂L/∂θ of every run, in the compact coordinates: V (and A) as they are; for W, the two halves of
    ∂L/∂u, u = W x̂_N (∂L/∂W = (∂L/∂u)·x̂_Nᵀ, Lemma B.1): `a` is ∂L/∂u[:K] and `c` is ∂L/∂(p_jᵀ u[K:]) per
    column j, so that ∂L/∂u[K:] = Σ_j c_j p_j = Pᵀ c."""

    V: torch.Tensor
    a: torch.Tensor
    c: torch.Tensor
    A: Optional[torch.Tensor] = None


def gradients(state: State, data: Batch, eps: torch.Tensor, w: torch.Tensor, geo: Geometry) -> tuple[torch.Tensor, Grads]:
    """Every run's mean training loss at `state` and its loss gradient (what GD and Adam both step on): the
    hand-written backward where the model declares the engine, else autograd of its reference forward."""
    if "engine" not in geo.paths:
        return reference_gradients(state, data, eps, w, geo)
    R, n, L = data.tokens.shape
    tokens = _index(data.tokens)
    at = model.attend(state.a, state.c, tokens, geo)
    f, r = model.output(state.params, at.h, geo.ffn)
    y = data.y[..., None]
    F = f.gather(2, y)[..., 0]
    loss = -torch.log(F + eps[:, None]).mean(1)
    g = w[:, None] / (F + eps[:, None])

    V = state.params["V"]
    dA = None
    if "A" not in state.params:  # eq. 2.1: ω_b = V[y_b, :]
        omega = V.gather(1, y.expand(R, n, V.shape[2]))
        dV = _rows_sum(g[..., None] * at.h, data.y, V.shape[1])  # Σ_b g_b e_{y_b} h_bᵀ (= −∇V)
    elif geo.ffn == "before":  # F.1 with the FFN per token: F = B[y]·h, B = A·ReLU(V), so ω_b = B[y_b, :]
        A, relu_V = state.params["A"], torch.relu(V)
        B = torch.bmm(A, relu_V)
        omega = B.gather(1, y.expand(R, n, B.shape[2]))
        dB = _rows_sum(g[..., None] * at.h, data.y, B.shape[1])  # −∂L/∂B, as −∇V of eq. 2.1
        dA = -torch.bmm(dB, relu_V.transpose(1, 2))  # ∂L/∂A = ∂L/∂B · ReLU(V)ᵀ
        dV = (V > 0).to(V.dtype) * torch.bmm(A.transpose(1, 2), dB)  # −∂L/∂V = relu'(V) ⊙ (Aᵀ·(−∂L/∂B))
    else:  # F.1: F = A[y]·ReLU(V h)
        A = state.params["A"]
        gate = (r > 0).to(r.dtype) * A.gather(1, y.expand(R, n, A.shape[2]))  # relu'(r) ⊙ A[y_b, :]
        omega = torch.bmm(gate, V)
        dA = -_rows_sum(g[..., None] * torch.relu(r), data.y, A.shape[1])
        dV = torch.bmm((g[..., None] * gate).transpose(1, 2), at.h)
    wh = (omega * at.h).sum(2)  # ω_b·h_b
    # Ψ_bk = g_b α_k (ω_bk − ω_b·h_b) / Z_b, so that Σ_b δ_bj = −β_j Σ_b Ψ_{b, s_bj} (the gather-sum pass).
    psi = (g / at.Z)[..., None] * at.alpha[:, None, :] * (omega - wh[..., None])
    Gc = torch.empty_like(state.c)  # ∂L/∂z_j summed over sequences (before the 1/ν of each column)
    Gc[:, :L] = -at.beta * psi.gather(2, tokens).sum(1)
    Gc[:, L] = (g * at.S_q * wh).sum(1)
    # Summed along a contiguous last axis so that every token k is reduced by the same operations: at
    # Thm 4.1's symmetric point the entries of a then stay bit-identical in float32 too.
    Ga = -((g[..., None] * (omega - wh[..., None]) * at.h).transpose(1, 2).contiguous().sum(2)) / geo.nu_tok
    nu = torch.full_like(state.c[:1], geo.nu_pos)
    nu[:, L] = geo.nu_q
    return loss, Grads(-dV, Ga, Gc / nu, dA)


def logits(a: torch.Tensor, c: torch.Tensor, tokens: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """z = X̃ᵀ W x̂_N (R, n, N) in the compact coordinates: z_bj = a[s_bj]/ν_tok + c_j/ν_pos (j < N), z_bN = c_N/ν_q."""
    R, n, L = tokens.shape
    za = (a / geo.nu_tok).gather(1, tokens.reshape(R, n * L)).reshape(R, n, L)
    return torch.cat([za + c[:, None, :L] / geo.nu_pos, (c[:, None, L:] / geo.nu_q).expand(R, n, 1)], 2)


def one_hot(tokens: torch.Tensor, K: int, dtype) -> torch.Tensor:
    """X (R, n, K, N): the one-hot tokens as columns, x_N's token part 0 (what the value path reads)."""
    X = torch.nn.functional.one_hot(tokens, K).transpose(2, 3).to(dtype)
    return torch.nn.functional.pad(X, (0, 1))


def reference(state: State, tokens: torch.Tensor, geo: Geometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f (R, n, K), S (R, n, N) and X·S (R, n, K) by the model option's own forward (`ModelConfig.forward`)."""
    X = one_hot(tokens, state.a.shape[1], state.a.dtype)
    f, S = geo.model.forward(state.params, X, logits(state.a, state.c, tokens, geo))
    return f, S, (X @ S[..., None])[..., 0]


def reference_gradients(state: State, data: Batch, eps: torch.Tensor, w: torch.Tensor,
                        geo: Geometry) -> tuple[torch.Tensor, Grads]:
    """`gradients` by autograd of the model option's forward in the compact coordinates: ∂L/∂a and ∂L/∂c of
    L = Σ_b w·ℓ(F_b) are `Grads.a` and `Grads.c` (z is linear in a and c, as it is in u = W x̂_N)."""
    leaf = lambda t: t.detach().requires_grad_()  # noqa: E731
    at = State({k: leaf(v) for k, v in state.params.items()}, leaf(state.a), leaf(state.c))
    with torch.enable_grad():
        f, _, _ = reference(at, _index(data.tokens), geo)
        nll = -torch.log(f.gather(2, data.y[..., None])[..., 0] + eps[:, None])
        grads = dict(zip(["a", "c", *at.params], torch.autograd.grad((w[:, None] * nll).sum(),
                                                                      [at.a, at.c, *at.params.values()])))
    return nll.detach().mean(1), Grads(grads["V"], grads["a"], grads["c"], grads.get("A"))


def gd_update(state: State, grads: Grads, lr: torch.Tensor, geo: Geometry) -> None:
    """θ ← θ − η ∇L (eq. 2.3), in place. u moves by −η·κ·∂L/∂u (κ = ‖x̂_N‖²) and c_i = p_iᵀ u[K:] by
    −η·κ·Σ_j (p_iᵀp_j)·grads.c_j: ‖p‖² times its own gradient with the exact Gram."""
    step = (lr * geo.kappa)[:, None]
    state.a -= step * grads.a
    if geo.gram is None:
        state.c -= step * geo.pp * grads.c
    else:
        state.c -= step * grads.c @ geo.gram.to(grads.c).T
    state.params["V"] = state.params["V"] - lr[:, None, None] * grads.V
    if grads.A is not None:
        state.params["A"] = state.params["A"] - lr[:, None, None] * grads.A
    state.step += 1


def train_step(state: State, data: Batch, lr: torch.Tensor, eps: torch.Tensor, w: torch.Tensor,
               geo: Geometry) -> torch.Tensor:
    """One GD step on every run, in place. Returns each run's mean training loss before the step."""
    loss, grads = gradients(state, data, eps, w, geo)
    gd_update(state, grads, lr, geo)
    return loss


def run_steps(state: State, steps: int, step) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` calls of `step()` (one update of every run in place, returning each run's loss before it):
    (loss (R, steps), bad (R,) the first step whose loss or updated parameters are not finite, or −1), as
    the fused kernel's multi-step call returns them."""
    R = state.a.shape[0]
    losses, bad = [], torch.full((R,), -1, dtype=torch.int64, device=state.a.device)
    for t in range(steps):
        loss = step()
        bad = torch.where((bad < 0) & ~finite_runs(loss, state), torch.full_like(bad, t), bad)
        losses.append(loss)
    return (torch.stack(losses, 1) if losses else torch.empty(R, 0, dtype=state.a.dtype)), bad


def finite_runs(loss: torch.Tensor, state: State) -> torch.Tensor:
    """(R,) bool: each run's loss and every one of its parameters are finite (divergence is the opposite)."""
    finite = torch.isfinite(loss) & torch.isfinite(state.a).all(1) & torch.isfinite(state.c).all(1)
    for v in state.params.values():
        finite &= torch.isfinite(v).flatten(1).all(1)
    return finite


def _index(tokens: torch.Tensor) -> torch.Tensor:
    """Token ids as gather/scatter indices (int64); a Batch made for the fused kernel holds bytes."""
    return tokens if tokens.dtype == torch.int64 else tokens.long()


def _rows_sum(x: torch.Tensor, y: torch.Tensor, K: int) -> torch.Tensor:
    """out[r, k] = Σ_{b: y_rb = k} x[r, b]; index_add treats every column alike (keeps Thm 4.1's symmetry)."""
    R, n, d = x.shape
    idx = (y + K * torch.arange(R, device=y.device)[:, None]).reshape(-1)
    return torch.zeros(R * K, d, dtype=x.dtype, device=x.device).index_add_(0, idx, x.reshape(R * n, d)).reshape(R, K, d)


@dataclass
class Probe:
    """Test-set measurements of every run at one step (all tensors have a leading R)."""

    loss: torch.Tensor
    acc: torch.Tensor
    kl: torch.Tensor
    pred_dist: torch.Tensor
    attention: torch.Tensor  # (R, N): mean S_j over sequences; [:, N−2] is the parent, [:, N−1] the query
    spread: torch.Tensor  # max_b (max_{j<N} S_bj − min_{j<N} S_bj)
    h_example: torch.Tensor  # (R, K) X·S of sequence 0
    h_var: torch.Tensor  # (R, K) variance of X·S across sequences
    v_pi_cosine: Optional[torch.Tensor] = None  # cos(V, Πᵀ) (Thm 3.1's limit), for eq. 2.1 on random walks
    pred: Optional[torch.Tensor] = None  # (R, n) argmax f of each test sequence (ties → smallest label)
    # (R,) bool: runs whose `pred` may differ from this module's argmax (a compiled kernel's rounding near a
    # tie, `fused.evaluate`); None: `pred` is this module's own
    pred_unsure: Optional[torch.Tensor] = None

    @property
    def parent_attention(self) -> torch.Tensor:
        """Mean S_{N−1}: the attention on the direct parent x_{N−1} (Thm 3.1: → 1)."""
        return self.attention[:, -2]


def v_pi_cosine(V: torch.Tensor, PiT: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """cos(V, Πᵀ) per run, as flattened matrices; None where Πᵀ is not V's target (QA data, the FFN); NaN (null)
    for a run whose ‖V‖ overflows, where the quotient would read 0 whatever V's direction."""
    if PiT is None:
        return None
    norm = V.norm(dim=(1, 2))
    cos = (V * PiT).sum((1, 2)) / (norm * PiT.norm(dim=(1, 2))).clamp_min(1e-300)
    return torch.where(torch.isfinite(norm), cos, torch.nan)


def overflowed(params: dict) -> torch.Tensor:
    """(R,) bool: runs with a parameter whose squared norm overflows (a step of a huge learning rate). A
    scale-free metric of f (pred_dist, which divides f by ‖f‖) then reads ‖f‖ = ∞ and says nothing of f's
    direction: both evaluations make it NaN (null) for those runs."""
    bad = None
    for p in params.values():
        b = ~torch.isfinite(p.reshape(p.shape[0], -1).square().sum(1))
        bad = b if bad is None else bad | b
    return bad


def evaluate(state: State, data: Batch, eps: torch.Tensor, geo: Geometry, PiT: Optional[torch.Tensor] = None) -> Probe:
    """Forward pass on a fixed set and every metric of a history row. Accuracy uses argmax's first maximum,
    i.e. ties → smallest label (Def. 2.1). PiT: Πᵀ per run, for cos(V, Πᵀ)."""
    tokens = _index(data.tokens)
    f, S, S_q, h = forward(state, tokens, geo)
    F = f.gather(2, data.y[..., None])[..., 0]
    loss = -torch.log(F + eps[:, None]).mean(1)
    pred = f.argmax(2)
    acc = (pred == data.y).to(f.dtype).mean(1)
    # KL(true ‖ q), q = f / Σ f clipped to a tiny positive value (the paper's §5 KL, as it reads); finite since terms with
    # P_true = 0 drop out.
    tiny = torch.finfo(f.dtype).tiny
    q = f.clamp_min(tiny)
    q = q / q.sum(2, keepdim=True)
    P = data.P_true.to(f.dtype)
    kl = torch.where(P > 0, P * (torch.log(P.clamp_min(tiny)) - torch.log(q)), 0.0).sum(2).mean(1)
    fn = f / f.norm(dim=2, keepdim=True).clamp_min(tiny)
    pred_dist = (fn - P / P.norm(dim=2, keepdim=True)).norm(dim=2).mean(1)
    pred_dist = torch.where(overflowed(state.params), torch.nan, pred_dist)
    attention = torch.cat([S.mean(1), S_q.mean(1, keepdim=True)], 1)
    spread = (S.amax(2) - S.amin(2)).amax(1)
    return Probe(loss, acc, kl, pred_dist, attention, spread, h[:, 0].clone(), h.var(1, unbiased=False),
                 v_pi_cosine(state.params["V"], PiT), pred)


def forward(state: State, tokens: torch.Tensor, geo: Geometry) -> tuple[torch.Tensor, ...]:
    """f (R, n, K), the attention S on the N − 1 real tokens (R, n, N − 1) and on the query (R, n), and X·S
    (R, n, K): by the compact forward where the model declares the engine, else by its own forward."""
    if "engine" not in geo.paths:
        f, S, h = reference(state, tokens, geo)
        return f, S[..., :-1], S[..., -1], h
    R, n, L = tokens.shape
    at = model.attend(state.a, state.c, tokens, geo)
    f, _ = model.output(state.params, at.h, geo.ffn)
    # S_bj = α[s_bj] β_j / Z_b over the N − 1 real tokens, materialised only here, at evaluation.
    S = at.alpha[:, None, :].expand(R, n, at.alpha.shape[1]).gather(2, tokens) * at.beta[:, None, :]
    return f, S / at.Z[..., None], at.S_q, at.h


def symmetric_h(data: Batch, K: int, dtype) -> torch.Tensor:
    """X·S at Theorem 4.1's symmetric point: uniform attention over x_1 … x_{N−1}, i.e. each test sequence's
    token histogram / (N − 1) (R, n, K). Whatever weight the query holds there only scales X·S (its token
    part is 0), which changes no prediction: f is positively homogeneous in X·S for every model option."""
    R, n, L = data.tokens.shape
    rows = torch.arange(R * n, device=data.tokens.device)[:, None] * K  # one bincount for the whole batch
    counts = torch.bincount((data.tokens.reshape(R * n, L).long() + rows).reshape(-1), minlength=R * n * K)
    return counts.reshape(R, n, K).to(dtype) / L


def symmetric_pred(params: dict, h_sym: torch.Tensor, geo: Geometry, tokens: torch.Tensor) -> torch.Tensor:
    """(R, n) the prediction (argmax f, ties → smallest label) each test sequence (`tokens`) gets at the
    symmetric point (`symmetric_h`) from these parameters: the engine's readout of X·S = h_sym, or the model
    option's own readout at uniform attention on x_1 … x_{N−1}."""
    if "engine" in geo.paths:
        return model.output(params, h_sym, geo.ffn)[0].argmax(2)
    R, n, L = tokens.shape
    X = one_hot(_index(tokens), h_sym.shape[2], h_sym.dtype)
    S = torch.nn.functional.pad(torch.full((R, n, L), 1 / L, dtype=h_sym.dtype, device=h_sym.device), (0, 1))
    return geo.model.readout(params, X, S).argmax(2)


def off_symmetric(state: State, tokens: torch.Tensor, geo: Geometry, h_sym: torch.Tensor) -> torch.Tensor:
    """(R,) bool: does any test prediction (argmax f, ties → smallest label) differ from the prediction the
    same parameters make at the symmetric point (`symmetric_h`)? The attention's departure from uniform has
    then changed what the model predicts, however small its spread. One exact forward pass: what
    `Probe.pred` holds already at an evaluation, so training asks this only where a kernel's `pred` is unsure."""
    f = forward(state, _index(tokens), geo)[0]
    return (f.argmax(2) != symmetric_pred(state.params, h_sym, geo, tokens)).any(1)


def init_state(params: list[dict], ac: list[tuple[torch.Tensor, torch.Tensor]]) -> State:
    """Stack per-run initial parameters and compact attention states into one batched State."""
    stacked = {k: torch.stack([p[k] for p in params]) for k in params[0]}
    return State(stacked, torch.stack([a for a, _ in ac]), torch.stack([c for _, c in ac]))


def run_slice(state: State, r: int) -> dict:
    """Run r's state as plain tensors (for checkpoints and snapshots), the optimizer's state included."""
    host = lambda d: {k: v[r].detach().cpu().clone() for k, v in d.items()}  # noqa: E731
    out = {"params": host(state.params), "a": state.a[r].detach().cpu().clone(), "c": state.c[r].detach().cpu().clone(),
           "step": state.step}
    if state.opt is not None:
        out["opt"] = host(state.opt)
    return out


def to(state: State, device) -> State:
    opt = None if state.opt is None else {k: v.to(device) for k, v in state.opt.items()}
    return State({k: v.to(device) for k, v in state.params.items()}, state.a.to(device), state.c.to(device), state.step,
                 opt)


def stack_slices(slices: list[dict]) -> State:
    """The batched State of run slices (`run_slice`, as checkpoints hold them)."""
    stack = lambda key: {k: torch.stack([s[key][k] for s in slices]) for k in slices[0][key]}  # noqa: E731
    return State(stack("params"), torch.stack([s["a"] for s in slices]), torch.stack([s["c"] for s in slices]),
                 slices[0]["step"], stack("opt") if slices[0].get("opt") is not None else None)

