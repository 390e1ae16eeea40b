"""Data of §1 (random walks on a circle), of the other first-order Markov chains (`chains`: lazy_walk,
binary_chain, markov_matrix, with Π from `rw_sweeps.core.markov`), of two that are not first order (`kth_order`,
`icl_markov`: P_true the exact conditional, T[last k states] and the posterior predictive) and §6 (the two question-answering tasks).

Labels are 0-based: node i of the paper is label i − 1. A sequence is the N − 1 observed tokens
s_1..s_{N−1} (the one-hot x_i = e_{s_i}) and the target y = s_N.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import env_vars, markov
from .markov import BALANCED
from .registry import frozen, names

if TYPE_CHECKING:
    from .families.base import DataConfig

VOCAB = ["apple", "orange", "Based", "on", "the", "which", "type", "of", "fruit", "list", "appears", "most",
         "frequently", "sentence", "I", "prefer", "an", "to", "do"]  # §6, in the paper's order
_W = {w: i for i, w in enumerate(VOCAB)}
_QUESTION_1 = "which type of fruit appears most frequently".split()
_QUESTION_2 = "which type of fruit do I prefer".split()


@dataclass
class Split:
    tokens: torch.Tensor  # (n, N−1) int64 node ids s_1..s_{N−1}
    y: torch.Tensor  # (n,) int64 target s_N
    P_true: torch.Tensor  # (n, K) float64: the true distribution of y given the sequence


def Pi(K: int, p: float, dtype=torch.float64) -> torch.Tensor:
    """Transition matrix Π (`rw_sweeps.core.markov.Pi`) as a tensor."""
    return torch.from_numpy(markov.Pi(K, p)).to(dtype)


@functools.lru_cache(maxsize=1024)
def _Pi_table(K: int, p: float, dtype: torch.dtype) -> np.ndarray:
    """Π as a read-only numpy table in `dtype` (cached: a sweep asks for the same few p's again and again)."""
    table = Pi(K, p, dtype).numpy()
    table.flags.writeable = False
    return table


_ONES = np.uint64(0x0101010101010101)
# The walk's positions come from one SWAR prefix sum: with the clockwise flags as bytes, a uint64 word times
# 0x0101…01 holds in byte k the sum of its bytes 0..k (little-endian); counts stay < 256 for N ≤ 256.
_SWAR = sys.byteorder == "little"
_SWAR_MAX_N = 256


class _Scratch:
    """Reusable buffers for walks of one (n, N), one set per thread: the draws and the bytes/int16 passes."""

    def __init__(self, n: int, N: int):
        L = N - 1
        words = (L + 7) // 8
        self.f = torch.empty(n, L, dtype=torch.float32)  # torch.rand's float32 draws, whatever the default dtype
        self.s1 = torch.empty(n, 1, dtype=torch.int64)
        self.flags = np.zeros((n, 8 * words), np.uint8)  # clockwise_1..clockwise_{N−1}, then pads that stay 0
        self.prefix = np.empty((n, words), np.uint64)
        self.total = torch.empty(n, words, dtype=torch.int64)
        self.carry = torch.empty(n, words, dtype=torch.int64)
        self.v = np.empty((n, L), np.int16)
        self.q = np.empty((n, L), np.int16)
        self.col = np.arange(2, N + 1, dtype=np.int16) - 1  # s_k = s_1 + 2·C_k − (k − 1), k = 2..N


_local = threading.local()


def _scratch(n: int, N: int) -> _Scratch:
    cache = _local.__dict__.setdefault("scratch", {})
    if (n, N) not in cache:
        if len(cache) > 8:
            cache.clear()
        cache[n, N] = _Scratch(n, N)
    return cache[n, N]


def balance(s1: np.ndarray, K: int) -> np.ndarray:
    """s_1 of a balanced start, written over the drawn one: sequence i starts at node i mod K, so with n a
    multiple of K every node starts n/K sequences (else the counts differ by at most one). The uniform draw is
    still made first, so the steps after s_1 are the uniform start's, draw for draw."""
    s1[...] = (np.arange(len(s1)) % K).reshape(s1.shape)
    return s1


def walks_into(K: int, N: int, p: float, gen: torch.Generator, tokens: np.ndarray, y: np.ndarray,
                P_true: np.ndarray, balanced: bool = False) -> None:
    """n walks written into the given arrays (tokens (n, N−1) int64, y (n,) int64, P_true (n, K)), from
    exactly the draws `random_walks` has always made: s_1 = randint(K, (n, 1)) (with `balanced`, then
    replaced by `balance`), then rand(n, N − 1) < p in float32. Everything after the draws is narrow integer
    arithmetic (bytes, int16) and one widening copy."""
    n, L = tokens.shape[0], N - 1
    table = _Pi_table(K, float(p), torch.from_numpy(P_true[:0]).dtype)
    if not (_SWAR and N <= _SWAR_MAX_N and K < 2**14):
        split = _walks_reference(K, N, p, n, gen, balanced)
        tokens[...], y[...] = split.tokens.numpy(), split.y.numpy()
        np.take(table, tokens[:, -1], axis=0, out=P_true)
        return
    b = _scratch(n, N)
    torch.randint(K, (n, 1), generator=gen, out=b.s1)
    if balanced:
        balance(b.s1.numpy(), K)
    torch.rand(n, L, generator=gen, out=b.f)
    # the float32 comparison torch's `rand < p` makes (a Python float compares in the tensor's dtype)
    np.less(b.f.numpy(), np.float32(p), out=b.flags.view(np.bool_)[:, :L])
    # C_k = #clockwise among steps 1..k−1, the inclusive prefix sum of the flags, in bytes: within each word
    # by the multiplication, then plus the words before it (their totals' exclusive prefix sum) in every byte
    np.multiply(b.flags.view(np.uint64), _ONES, out=b.prefix)
    total = b.total.numpy().view(np.uint64)
    np.right_shift(b.prefix, np.uint64(56), out=total)
    torch.cumsum(b.total, 1, out=b.carry)
    carry = b.carry.numpy().view(np.uint64)
    np.subtract(carry, total, out=carry)
    np.multiply(carry, _ONES, out=carry)
    np.add(b.prefix, carry, out=b.prefix)
    C = b.prefix.view(np.uint8)[:, :L]
    # s_k = s_1 + #clockwise − #counter-clockwise steps before k, mod K as v − K·⌊v/K⌋ (|v| < 2^15)
    v, q = b.v, b.q
    np.multiply(C, np.int16(2), out=v)
    np.subtract(v, b.col, out=v)
    s1 = b.s1.numpy()
    np.add(v, s1.astype(np.int16), out=v)
    np.floor_divide(v, np.int16(K), out=q)
    np.multiply(q, np.int16(K), out=q)
    np.subtract(v, q, out=v)
    tokens[:, :1] = s1
    np.copyto(tokens[:, 1:], v[:, :-1], casting="unsafe")  # 0 ≤ s < K: exact in any integer type
    np.copyto(y, v[:, -1])
    # P(y | x_{N−1}) = Πᵀ x_{N−1}: row s_{N−1} of Π (Markov property, §1).
    np.take(table, tokens[:, -1], axis=0, out=P_true)


def _walks_reference(K: int, N: int, p: float, n: int, gen: torch.Generator, balanced: bool = False) -> Split:
    """The original all-torch walk (shapes the fast path does not cover: N > 256, big-endian hosts)."""
    s1 = torch.randint(K, (n, 1), generator=gen)
    if balanced:
        balance(s1.numpy(), K)
    clockwise = torch.rand(n, N - 1, generator=gen) < p  # float32 draws, so data do not depend on precision
    # s_i = s_1 + (#clockwise − #counter-clockwise steps so far) mod K; the offset keeps it non-negative and
    # the lookup table replaces a slow integer remainder.
    steps = torch.zeros(n, N, dtype=torch.int64)
    steps[:, 1:] = clockwise
    walked = 2 * torch.cumsum(steps, 1) - torch.arange(N) + (s1 + K * N)
    s = (torch.arange(K * N + N + K) % K)[walked]
    tokens, y = s[:, :-1].contiguous(), s[:, -1].contiguous()
    return Split(tokens, y, Pi(K, p)[tokens[:, -1]])


def random_walks(K: int, N: int, p: float, n: int, gen: torch.Generator, balanced: bool = False) -> Split:
    """n walks of N nodes: s_1 ~ Unif([K]) (or `balance`d), then ±1 steps drawn at once and summed (no loop
    over positions)."""
    split = Split(torch.empty(n, N - 1, dtype=torch.int64), torch.empty(n, dtype=torch.int64),
                  torch.empty(n, K, dtype=torch.float64))
    walks_into(K, N, p, gen, split.tokens.numpy(), split.y.numpy(), split.P_true.numpy(), balanced)
    return split


@functools.lru_cache(maxsize=1024)
def _cumulative(Pi_bytes: bytes, K: int) -> np.ndarray:
    """Π's cumulative rows without the last column, for the search `#{j < K−1 : u ≥ F_j}`; entries from a
    row's last state of positive probability on are +∞, so a rounding gap below 1 never lands on a state of
    probability 0."""
    F = cumulative_rows(np.frombuffer(Pi_bytes, np.float64).reshape(K, K))
    F.flags.writeable = False
    return F


def cumulative_rows(P: np.ndarray) -> np.ndarray:
    """`_cumulative` of any stack of rows P (..., K): kth_order's K^k contexts, icl_markov's chain per sequence."""
    K = P.shape[-1]
    F = np.cumsum(P, -1)[..., :-1].copy()
    last = K - 1 - np.argmax(P[..., ::-1] > 0, -1)  # each row's last state with Π > 0
    F[np.arange(K - 1) >= last[..., None]] = np.inf
    return F


def _first(K: int, n: int, gen: torch.Generator, start) -> torch.Tensor:
    """s_1 (n, 1): Unif([K]) as the circle draws it (randint(K, (n, 1))), that draw `balance`d (start =
    BALANCED), or from the law `start` (K,) by one float64 uniform each."""
    if start is None or (isinstance(start, str) and start == BALANCED):
        s1 = torch.randint(K, (n, 1), generator=gen)
        return s1 if start is None else torch.from_numpy(balance(s1.numpy(), K))
    u0 = torch.rand(n, 1, generator=gen, dtype=torch.float64).numpy()
    law = np.ascontiguousarray(start, np.float64)
    F = _start_cumulative(law.tobytes(), law.shape[0])
    return torch.from_numpy((u0 >= F).sum(1, keepdims=True).astype(np.int64))


@functools.lru_cache(maxsize=1024)
def _start_cumulative(law_bytes: bytes, K: int) -> np.ndarray:
    """`cumulative_rows` of one law (K,), cached: an online run draws s_1 from the same law every step."""
    F = cumulative_rows(np.frombuffer(law_bytes, np.float64)[None, :])[0]
    F.flags.writeable = False
    return F


def chains(P: np.ndarray, N: int, n: int, gen: torch.Generator, dtype=torch.float64, start=None) -> Split:
    """n sequences of a first-order chain with transition matrix P (K×K, row-stochastic): s_1 ~ Unif([K])
    as the circle draws it (randint(K, (n, 1))) or from the law `start`, then one float64 uniform per step, s_{k+1} = the first j
    whose cumulative row F_{s_k, j} exceeds it; vectorised over the sequences, a loop over the N − 1 steps."""
    P = np.ascontiguousarray(P, np.float64)
    K = P.shape[0]
    s1 = _first(K, n, gen, start)
    u = torch.rand(n, N - 1, generator=gen, dtype=torch.float64).numpy()
    F = _cumulative(P.tobytes(), K)
    s = np.empty((n, N), np.int64)
    s[:, 0] = s1.numpy()[:, 0]
    for k in range(N - 1):
        s[:, k + 1] = (u[:, k, None] >= F[s[:, k]]).sum(1)
    tokens, y = torch.from_numpy(s[:, :-1].copy()), torch.from_numpy(s[:, -1].copy())
    # P(y | context) = Π[s_{N−1}]: the Markov property, as for the circle
    return Split(tokens, y, torch.from_numpy(P[s[:, -2]]).to(dtype))


def chains_many(Ps: list, N: int, n: int, gens: list, dtype=torch.float64, starts=None) -> list[Split]:
    """`chains(Ps[r], N, n, gens[r], start=starts[r])` for every run r, from the same draws in the same
    order (so the same sequences), with one loop over the N − 1 steps for all runs at once."""
    R = len(Ps)
    if R == 0:
        return []
    K = np.asarray(Ps[0]).shape[0]
    s = np.empty((R, n, N), np.int64)
    u = np.empty((R, n, N - 1))
    for r, gen in enumerate(gens):
        s[r, :, 0] = _first(K, n, gen, None if starts is None else starts[r]).numpy()[:, 0]
        u[r] = torch.rand(n, N - 1, generator=gen, dtype=torch.float64).numpy()
    Pc = [np.ascontiguousarray(P, np.float64) for P in Ps]
    F = np.stack([_cumulative(P.tobytes(), K) for P in Pc])  # (R, K, K − 1)
    runs = np.arange(R)[:, None]
    for k in range(N - 1):
        s[:, :, k + 1] = (u[:, :, k, None] >= F[runs, s[:, :, k]]).sum(-1)
    return [Split(torch.from_numpy(s[r, :, :-1].copy()), torch.from_numpy(s[r, :, -1].copy()),
                  torch.from_numpy(Pc[r][s[r, :, -2]]).to(dtype)) for r in range(R)]


@functools.lru_cache(maxsize=8)
def kth_law(K: int, order: int, alpha: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """kth_order's T as K^order rows (context index Σ_i s_{t−k+i}·K^{k−1−i}, the oldest state most
    significant) and their cumulative rows; cached, since a run's training and test sets share T."""
    T = markov.kth_tensor(K, order, alpha, seed).reshape(K**order, K)
    T.flags.writeable = False
    F = cumulative_rows(T)
    F.flags.writeable = False
    return T, F


def kth_order(K: int, N: int, order: int, alpha: float, seed: int, n: int, gen: torch.Generator,
              dtype=torch.float64) -> Split:
    """n sequences of the order-k chain of `markov.kth_tensor`: s_1..s_k ~ Unif([K]) i.i.d., then
    s_{t+1} = the first j whose cumulative T[s_{t−k+1..t}, j] exceeds a float64 uniform; P_true = T's row
    of the last k observed tokens (validate keeps k ≤ N − 1)."""
    T, F = kth_law(K, order, float(alpha), seed)
    C = K**order
    s = np.empty((n, N), np.int64)
    s[:, :order] = torch.randint(K, (n, order), generator=gen).numpy()
    u = torch.rand(n, N - order, generator=gen, dtype=torch.float64).numpy()
    ctx = np.zeros(n, np.int64)
    for t in range(order):
        ctx = ctx * K + s[:, t]
    for t in range(order, N):
        s[:, t] = (u[:, t - order, None] >= F[ctx]).sum(1)
        ctx = (ctx * K + s[:, t]) % C
    tokens, y = torch.from_numpy(s[:, :-1].copy()), torch.from_numpy(s[:, -1].copy())
    last = np.zeros(n, np.int64)
    for t in range(N - 1 - order, N - 1):  # the context of y = s_N: s_{N−k} … s_{N−1}
        last = last * K + s[:, t]
    return Split(tokens, y, torch.from_numpy(T[last]).to(dtype))


def icl_markov(K: int, N: int, alpha: float, n: int, gen: torch.Generator, dtype=torch.float64) -> Split:
    """Edelman et al.: sequence i has its own chain Π_i, rows ~ Dirichlet(alpha·1_K) i.i.d. (numpy, seeded by
    one draw of the data stream), s_1 ~ Unif([K]), then the chain; P_true is the posterior predictive given
    the in-context transition counts (`markov.posterior_predictive`), not Π_i: the Bayes optimum."""
    s1 = torch.randint(K, (n,), generator=gen).numpy()
    u = torch.rand(n, N - 1, generator=gen, dtype=torch.float64).numpy()
    rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=gen)))
    F = cumulative_rows(rng.dirichlet(np.full(K, float(alpha)), size=(n, K)))  # (n, K, K − 1)
    s = np.empty((n, N), np.int64)
    s[:, 0] = s1
    rows = np.arange(n)
    for t in range(N - 1):
        s[:, t + 1] = (u[:, t, None] >= F[rows, s[:, t]]).sum(1)
    tokens, y = s[:, :-1].copy(), s[:, -1].copy()
    P = markov.posterior_predictive(tokens, K, alpha)
    return Split(torch.from_numpy(tokens), torch.from_numpy(y), torch.from_numpy(P).to(dtype))


def qa_majority(n: int, gen: torch.Generator) -> Split:
    """Task 1: 'Based on the list <5 fruits> which type of fruit appears most frequently' → majority fruit."""
    fruits = torch.randint(2, (n, 5), generator=gen)  # 0 = apple, 1 = orange, each list w.p. 1/32
    head = torch.tensor([_W[w] for w in ["Based", "on", "the", "list"]]).expand(n, 4)
    tail = torch.tensor([_W[w] for w in _QUESTION_1]).expand(n, len(_QUESTION_1))
    tokens = torch.cat([head, fruits, tail], 1).contiguous()
    y = (fruits.sum(1) >= 3).long()  # majority of 5: no ties
    return Split(tokens, y, torch.nn.functional.one_hot(y, len(VOCAB)).double())


def qa_preference(n: int, gen: torch.Generator) -> Split:
    """Task 2: 'Based on the sentence I prefer an <a> to an <b> which type of fruit do I prefer' → a."""
    first = torch.randint(2, (n,), generator=gen)
    words = ["Based", "on", "the", "sentence", "I", "prefer", "an", None, "to", "an", None] + _QUESTION_2
    tokens = torch.tensor([[_W[w] if w else 0 for w in words]]).repeat(n, 1)
    tokens[:, 7], tokens[:, 10] = first, 1 - first
    return Split(tokens, first.clone(), torch.nn.functional.one_hot(first, len(VOCAB)).double())


def make(cfg: DataConfig, seed: int) -> tuple[Split, Split]:
    """The fixed training and test sets of one run: train first, then test, from one generator."""
    gen = torch.Generator().manual_seed(seed)
    return checked(cfg, cfg.draw(cfg.n_train, gen, seed), cfg.n_train), \
        checked(cfg, cfg.draw(cfg.n_test, gen, seed), cfg.n_test)


def checked(cfg: DataConfig, split, n: int) -> Split:
    """A family's `draw` as the engines read it, or a one-line ValueError naming the family: a Split of
    tokens (n, N − 1), y (n,) and P_true (n, K) (a sampler of another shape fails here, not in a broadcast)."""
    want = {"tokens": (n, cfg.N - 1), "y": (n,), "P_true": (n, cfg.K)}
    got = {k: tuple(getattr(getattr(split, k, None), "shape", ())) for k in want}
    if not isinstance(split, Split) or got != want:
        shown = ", ".join(f"{k} {got[k]}" for k in want) if isinstance(split, Split) else type(split).__name__
        raise ValueError(f"data={cfg.name}: draw(n={n}, …) gave {shown}; it must give a Split of tokens "
                         f"{want['tokens']}, y {want['y']}, P_true {want['P_true']} (n, N − 1, K)")
    return split


MAX_DATA_WORKERS = 16


def data_workers(workers: int | None = None) -> int:
    """Threads that prepare data: `workers`, else $RW_SWEEPS_DATA_WORKERS, else the box's cores (capped)."""
    if workers is None:
        workers = env_vars.data_workers() or min(os.cpu_count() or 1, MAX_DATA_WORKERS)
    return max(1, int(workers))


def make_batches(cfgs: list, workers: int | None = None, dtype: torch.dtype = torch.float64,
                 token_dtype: torch.dtype = torch.int64, _prefetched_ok: bool = True) -> tuple[Split, Split]:
    """The training and test sets of R runs (RunConfigs of one data shape), stacked: tokens (R, n, N−1) in
    `token_dtype` (int64 by default; uint8 for the fused kernel, which reads bytes: an eighth of the memory
    to allocate and touch), y (R, n) int64, P_true (R, n, K) in `dtype` (float64 by default). Run r's
    slices are exactly `make(cfgs[r].data, cfgs[r].seed)` (each run has its own generator), whatever the worker count or the
    mix of runs in the call; they are written straight into the stacked tensors by a pool of threads (the
    draws and the numpy passes release the GIL)."""
    d0 = cfgs[0].data
    shape = (d0.name, d0.K, d0.N, d0.n_train, d0.n_test)
    for cfg in cfgs:
        d = cfg.data
        if (d.name, d.K, d.N, d.n_train, d.n_test) != shape:
            raise ValueError(f"make_batches: every run must share data.name/K/N/n_train/n_test; {shape} != "
                             f"{(d.name, d.K, d.N, d.n_train, d.n_test)}")
    R, K, L = len(cfgs), d0.K, d0.N - 1
    if token_dtype == torch.uint8 and K > 255:
        raise ValueError(f"make_batches: K={K} tokens do not fit in uint8")
    out = tuple(Split(torch.empty(R, n, L, dtype=token_dtype), torch.empty(R, n, dtype=torch.int64),
                      torch.empty(R, n, K, dtype=dtype)) for n in (d0.n_train, d0.n_test))
    views = [(s.tokens.numpy(), s.y.numpy(), s.P_true.numpy()) for s in out]

    def fill(runs: list[int]) -> None:
        for r in runs:
            cfg = cfgs[r]
            gen = torch.Generator().manual_seed(cfg.seed)
            for tok, y, P in views:
                cfg.data.draw_into(gen, cfg.seed, tok[r], y[r], P[r])

    # runs a `prefetch` already drew (in the background, while the device trained the chunk before)
    todo = []
    for r, cfg in enumerate(cfgs):
        hit = _take_prefetched(_run_key(cfg, dtype, token_dtype)) if _prefetched_ok else None
        if hit is None:
            todo.append(r)
            continue
        for split, part in zip(out, hit):
            split.tokens[r], split.y[r], split.P_true[r] = part.tokens, part.y, part.P_true
    workers = min(data_workers(workers), len(todo))
    if workers <= 1:
        fill(todo)
    else:
        step = max(1, -(-len(todo) // (4 * workers)))  # a few chunks per thread, for balance
        with ThreadPoolExecutor(workers, thread_name_prefix="rw-data") as pool:
            list(pool.map(fill, [todo[i:i + step] for i in range(0, len(todo), step)]))
    return out


# ---------------------------------------------------------------------------------------------- prefetch
# A process that trains several chunks in turn (one per GPU: `packed_gpus`) draws the next chunk's data on
# the host while the device trains the current one. Runs are keyed one by one (seed, data keys, dtypes), so
# a chunk that is re-split to fit its GPU still finds its runs; the data are make_batches' own, bit for bit.
_prefetched: dict = {}  # run key → (future of the stacked splits, index of the run in them)
_prefetch_lock = threading.Lock()
_prefetch_pool: ThreadPoolExecutor | None = None
MAX_PREFETCHED = 200_000  # runs held at most (a stale prefetch must not grow without bound)


def data_key(cfg) -> tuple:
    """What a run's data are a function of: its seed and every key of its data family."""
    d = cfg.data
    return (cfg.seed, type(d).__name__, *(frozen(getattr(d, k)) for k in names(type(d))))


def _run_key(cfg, dtype, token_dtype) -> tuple:
    return (*data_key(cfg), dtype, token_dtype)


def prefetch(cfgs: list, dtype: torch.dtype = torch.float64, token_dtype: torch.dtype = torch.int64) -> None:
    """Start drawing these runs' data in the background; `make_batches` takes them when it is asked."""
    global _prefetch_pool
    if not cfgs:
        return
    with _prefetch_lock:
        if _prefetch_pool is None:
            _prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="rw-prefetch")
        if len(_prefetched) + len(cfgs) > MAX_PREFETCHED:
            _prefetched.clear()
        fut = _prefetch_pool.submit(make_batches, list(cfgs), None, dtype, token_dtype, False)  # never its own keys
        for r, cfg in enumerate(cfgs):
            _prefetched[_run_key(cfg, dtype, token_dtype)] = (fut, r)


def _take_prefetched(key: tuple) -> tuple | None:
    with _prefetch_lock:
        hit = _prefetched.pop(key, None)
    if hit is None:
        return None
    fut, r = hit
    try:
        splits = fut.result()
    except Exception:  # noqa: BLE001 - drawn again in the foreground, where an error is reported
        return None
    return tuple(Split(s.tokens[r], s.y[r], s.P_true[r]) for s in splits)
