"""One typed config for one training run, and its validation.

These dataclasses are the schema: `register()` puts `RunConfig` in Hydra's ConfigStore as `run_schema`, the
first entry of `conf/config.yaml`'s defaults, so every default is written here once and the YAML files hold
only deltas. Hydra composes `conf/` into a plain dict; `from_dict` turns it into a `RunConfig`, checking
every key once, before anything is trained or written. A bad value raises `ConfigError` whose one-line
message names the key by its dotted Hydra name, the value, and what is allowed; `from_hydra_error` maps
Hydra's and OmegaConf's own composition errors to the same line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional

from .errors import ConfigError, one_line

# kth_order's bound on T (markov is plain numpy: no import cycle, nothing heavy)
from .markov import MAX_KTH_ENTRIES

# Shapes of the question-answering tasks of §6 (19-word vocabulary; N − 1 words, then the answer).
QA_SHAPES = {"qa_majority": (19, 17), "qa_preference": (19, 19)}
# First-order Markov chains over K states (rw_sweeps.core.markov.transition gives each one's Π); the circle
# families need K ≥ 3 (for K = 2 the ±1 steps land on the same node), binary_chain is K = 2 by definition.
CIRCLE_CHAINS = ("random_walk", "lazy_walk", "jump_walk")
CHAINS = (*CIRCLE_CHAINS, "binary_chain", "markov_matrix")
CHAINS += ("graph_walk",)  # a simple random walk on a named graph (markov.GRAPHS)
# Chains whose next state depends on more than the last one: an order-k chain with a Dirichlet tensor per seed,
# and Edelman et al.'s fresh chain per sequence (rw_sweeps.core.data.kth_order, icl_markov); no single Π.
CONTEXT_CHAINS = ("kth_order", "icl_markov")
NORMALIZE = ("none", "whole", "positional", "token")
# bools (and what OmegaConf makes of a bool given to a str key) read as before model.normalize was a string
NORMALIZE_ALIASES = {True: "whole", False: "none", "True": "whole", "False": "none", "true": "whole",
                     "false": "none"}
DEFAULT_SNAPSHOTS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 400, 700, 1000]


@dataclass
class DataConfig:
    name: str = "random_walk"  # random_walk | lazy_walk | jump_walk | graph_walk | binary_chain | markov_matrix | kth_order | icl_markov | qa_majority | qa_preference
    K: int = 6  # number of nodes (vocabulary size for QA; 2 for binary_chain; Π's size for markov_matrix)
    N: int = 97  # sequence length, counting the target: N − 1 observed tokens
    p: float = 0.5  # probability of a clockwise (+1) step (random_walk, lazy_walk); P(0→1) for binary_chain
    q: float = 0.5  # P(1→0) (binary_chain only: Makkuva et al.'s switching probabilities p, q)
    stay: float = 0.0  # holding probability (lazy_walk only): Π = stay·I + (1 − stay)·Π_circle(p)
    Pi: Optional[List[List[float]]] = None  # the row-stochastic K×K Π, a list of rows (markov_matrix only)
    # markov_matrix only: Π from a file instead (a .npy array, or text: K rows of K numbers separated by spaces
    # or commas; a relative path is from the launch folder). Read when the config is validated; it replaces
    # data.Pi, so a run's config.yaml holds the matrix it was trained on.
    Pi_file: Optional[str] = None
    jumps: Optional[List[float]] = None  # jump_walk only: [P(+1), P(−1), P(+2), P(−2), …, P(+r), P(−r)], sum 1
    graph: str = "cycle"  # graph_walk only: cycle | path | complete | grid | torus | hypercube | random_regular
    degree: int = 3  # graph_walk random_regular only: d of the random d-regular graph on K nodes (drawn from the seed)
    side: int = 3  # graph_walk grid/torus only: side × side nodes (data.K must be side²)
    dim: int = 3  # graph_walk hypercube only: {0,1}^dim (data.K must be 2^dim)
    order: int = 1  # kth_order only: k, the next state's law depends on the last k states
    alpha: float = 1.0  # Dirichlet(alpha·1_K) concentration of kth_order's T rows and icl_markov's per-sequence Π rows
    n_train: int = 1000
    n_test: int = 1000


@dataclass
class ModelConfig:
    name: str = "transformer"  # transformer (eq. 2.1) | transformer_ffn (F.1)
    M: int = 1000  # positional-embedding dimension
    # where x̃_i is scaled to unit length inside the attention only (§4, §8.5; the value path keeps one-hot
    # x_i): auto (the paper's protocol: whole with init=gaussian, none with init=zero) | none | whole (x̃_i)
    # | positional (p_i only, x̃_i = [x_i; p_i/‖p_i‖]) | token (x_i only: the identity on one-hot tokens, so
    # the same as none; kept so that a reading search can say so). true/false are read as whole/none.
    normalize: str = "auto"
    pos: str = "sine"  # [p_i]_j = pos_scale · sin(π i j / D), j = 1..M (§2.1)
    pos_denom: str = "M"  # D = M (spec's choice) | "M+1" (DST-I basis)
    pos_scale: float = 1.0
    gram: str = "exact"  # exact: p_iᵀp_j = ‖p‖²·1[i=j] | numeric: P Pᵀ as rounded (fragility studies, §8.9)
    m: Optional[int] = None  # FFN width (transformer_ffn only)
    # where the FFN of F.1 sits (transformer_ffn only): after the attention, f = A·ReLU(V·X·S) | before it,
    # per token, f = Σ_i S_i·A·ReLU(V x_i) = A·ReLU(V)·X·S (x_N's token part is 0, so the query adds nothing)
    ffn: str = "after"

    @property
    def is_ffn(self) -> bool:
        """The F.1 variant, f = A·ReLU(V·X·S): the one place that asks."""
        return self.name == "transformer_ffn"


@dataclass
class InitConfig:
    name: str = "zero"  # zero | gaussian: V, W (and A) i.i.d. N(0, sigma²)
    sigma: float = 0.0
    # how gaussian draws W (A and V are drawn the same either way): compact (default) draws a = (W x̂_N)[:K]
    # and c_j = p_jᵀ(W x̂_N)[K:] directly, the same distribution as the dense draw, not the same sample |
    # dense: the literal (K+M)² W, so the oracle tests and any dense implementation compare run for run
    draw: str = "compact"


@dataclass
class OptimConfig:
    name: str = "gd"  # gd: full-batch gradient descent, eq. 2.3 | adam: full-batch Adam (torch.optim.Adam's rule)
    lr: float = 1.0  # η
    steps: int = 50  # T
    eps: float = 0.1  # ε in ℓ(z) = −log(z + ε)
    reduction: str = "mean"  # mean | sum of the per-sequence losses (§8.3, §8.10)
    beta1: float = 0.9  # Adam's first-moment decay (optim=adam only)
    beta2: float = 0.999  # Adam's second-moment decay (optim=adam only)
    adam_eps: float = 1e-8  # Adam's denominator term, added to √v̂ (optim=adam only)


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "rw-sweeps"
    group: Optional[str] = None  # the sweep; filled in from Hydra's sweep folder when left null
    tags: List[str] = field(default_factory=list)
    granularity: str = "auto"  # run: a wandb run per training run | job: one per packed job | auto
    per_run_limit: int = 32  # auto: per-run wandb runs for batches up to this size
    analysis: bool = True  # a finished sweep logs its phase diagrams and runs table (one job_type=analysis run)


@dataclass
class RunConfig:
    seed: int = 0  # seeds the data (train then test) and, on its own stream, the initial parameters
    precision: str = "float64"  # float64 | float32
    device: str = "auto"  # auto (cuda when visible, else cpu) | cpu | cuda | cuda:N
    eval_every: int = 1  # test-set metrics every this many steps (and at step 0 and the last step)
    snapshot_steps: List[int] = field(default_factory=lambda: list(DEFAULT_SNAPSHOTS))  # V, attention saved
    checkpoint_every: int = 0  # save the training state every this many steps (0: never)
    experiment: Optional[str] = None  # set by the experiment presets, recorded with the results
    objective: Optional[str] = None  # a numeric summary field (e.g. test_acc): the task returns it (Optuna)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    init: InitConfig = field(default_factory=InitConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        # model.normalize=auto is the paper's protocol, which depends on the init: resolved here, once, so
        # that the run's config, its shape and its summary all say what was trained (a copy: a ModelConfig
        # passed in by the caller is never changed)
        where = NORMALIZE_ALIASES.get(self.model.normalize, self.model.normalize)
        if where == "auto":
            where = "whole" if self.init.name == "gaussian" else "none"
        if where != self.model.normalize:
            self.model = dataclasses.replace(self.model, normalize=where)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def opt_acc(self) -> float | None:
        """OPT = max(p, 1 − p) for random walks (§1); the QA answers are deterministic. None for the other
        chains, whose Bayes-optimal accuracy depends on the test set's last tokens: the summary measures it
        there (`training.train`)."""
        if self.data.name in QA_SHAPES:
            return 1.0
        return max(self.data.p, 1 - self.data.p) if self.data.name == "random_walk" else None


def _coerce(key: str, value: Any, typ: str) -> Any:
    """Cast a value from YAML or the command line to the field's type, or raise a one-line error."""
    if typ in ("int", "Optional[int]"):
        if value is None and typ.startswith("Optional"):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(key, value, "must be an integer")
        return int(value)
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "must be a number")
        return float(value)
    if typ == "bool":
        if not isinstance(value, bool):
            raise ConfigError(key, value, "must be true or false")
        return value
    if typ == "str":
        if key == "model.normalize" and isinstance(value, bool):  # the key's old type: a config from before
            return NORMALIZE_ALIASES[value]
        if not isinstance(value, str):
            raise ConfigError(key, value, "must be a string")
        return value
    if typ == "Optional[str]":
        if value is not None and not isinstance(value, (str, int, float)):
            raise ConfigError(key, value, "must be a string or null")
        return None if value is None else str(value)
    if typ == "Optional[List[List[float]]]":  # a matrix as a list of rows (data.Pi)
        if value is None:
            return None
        if (not isinstance(value, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in value)
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for r in value for x in r)):
            raise ConfigError(key, value, "must be a list of rows of numbers, e.g. [[0.9,0.1],[0.2,0.8]], or null")
        return [[float(x) for x in r] for r in value]
    if typ == "Optional[List[float]]":  # a list of probabilities (data.jumps)
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            raise ConfigError(key, value, "must be a list of numbers, e.g. [0.4,0.3,0.2,0.1], or null")
        return [float(x) for x in value]
    if typ in ("list", "List[int]", "List[str]"):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, "must be a list")
        return list(value)
    raise TypeError(f"unhandled field type {typ} for {key}")


@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple[tuple[str, str, Any], ...]:
    """(name, type name, nested dataclass or None) of each field: what _build and _require_all walk, once
    per class rather than once per run (planning a grid builds a RunConfig per job)."""
    out = []
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        out.append((f.name, f.type if isinstance(f.type, str) else f.type.__name__,
                    sub if dataclasses.is_dataclass(sub) else None))
    return tuple(out)


def _build(cls, d: Any, prefix: str):
    if not isinstance(d, dict):
        raise ConfigError(prefix.rstrip(".") or "<root>", d, "must be a mapping")
    fields = _fields(cls)
    if not d.keys() <= _names(cls):
        names = [name for name, _, _ in fields]
        unknown = sorted(set(d) - set(names))
        raise ConfigError(prefix + unknown[0], d[unknown[0]], f"unknown key; allowed: {', '.join(names)}")
    kwargs = {}
    for name, typ, sub in fields:
        if name not in d:
            continue
        kwargs[name] = _build(sub, d[name], prefix + name + ".") if sub is not None else _coerce(prefix + name, d[name], typ)
    return cls(**kwargs)


@functools.lru_cache(maxsize=None)
def _names(cls) -> frozenset:
    return frozenset(name for name, _, _ in _fields(cls))


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"must be one of {', '.join(map(str, allowed))}")


SEED_MAX = 2**32 - 1  # seeds are 0 … 2³²−1 (torch's generator uses 32 bits; the init stream: model.init_seed)


def validate(c: RunConfig) -> RunConfig:
    """Every rule the engine relies on, each failing with the dotted key, the value and what is allowed."""
    d, mo, i, o = c.data, c.model, c.init, c.optim
    for key, val in (("data.p", d.p), ("data.q", d.q), ("data.stay", d.stay), ("model.pos_scale", mo.pos_scale), ("init.sigma", i.sigma),
                     ("optim.lr", o.lr), ("optim.eps", o.eps), ("optim.beta1", o.beta1), ("optim.beta2", o.beta2),
                     ("optim.adam_eps", o.adam_eps)):
        if not math.isfinite(val):
            raise ConfigError(key, val, "must be a finite number")
    if not 0 <= c.seed <= SEED_MAX:
        raise ConfigError("seed", c.seed, f"must be in [0, {SEED_MAX}] (2³² − 1)")
    _choice("data.name", d.name, (*CHAINS, *CONTEXT_CHAINS, *QA_SHAPES))
    _choice("model.name", mo.name, ("transformer", "transformer_ffn"))
    _choice("init.name", i.name, ("zero", "gaussian"))
    _choice("init.draw", i.draw, ("compact", "dense"))
    _choice("optim.name", o.name, ("gd", "adam"))
    _choice("model.normalize", mo.normalize, NORMALIZE)
    _choice("model.ffn", mo.ffn, ("after", "before"))
    if mo.ffn != "after" and not mo.is_ffn:
        raise ConfigError("model.ffn", mo.ffn, "must be after unless model=transformer_ffn (only F.1 has an FFN)")
    _choice("optim.reduction", o.reduction, ("mean", "sum"))
    _choice("precision", c.precision, ("float64", "float32"))
    _choice("model.pos", mo.pos, ("sine",))
    _choice("model.pos_denom", mo.pos_denom, ("M", "M+1"))
    _choice("model.gram", mo.gram, ("exact", "numeric"))
    if not (c.device in ("auto", "cpu", "cuda") or (c.device.startswith("cuda:") and c.device[5:].isdigit())):
        raise ConfigError("device", c.device, "must be auto, cpu, cuda or cuda:N")
    _choice("wandb.mode", c.wandb.mode, ("offline", "online", "disabled"))
    _choice("wandb.granularity", c.wandb.granularity, ("auto", "run", "job"))
    for key, val in (("data.p", d.p), ("data.q", d.q), ("data.stay", d.stay)):
        if not 0.0 <= val <= 1.0:
            raise ConfigError(key, val, "must be in [0, 1]")
    _validate_chain(d, c.seed)
    if d.N < 2:
        raise ConfigError("data.N", d.N, "must be >= 2")
    _validate_context_chain(d)
    if d.name in QA_SHAPES and (d.K, d.N) != QA_SHAPES[d.name]:
        K, N = QA_SHAPES[d.name]
        key, val, want = ("data.K", d.K, K) if d.K != K else ("data.N", d.N, N)
        raise ConfigError(key, val, f"must be {want} for data={d.name} (fixed by the task)")
    for key, val in (("data.n_train", d.n_train), ("data.n_test", d.n_test), ("optim.steps", o.steps),
                     ("eval_every", c.eval_every)):
        if val < 1:
            raise ConfigError(key, val, "must be >= 1")
    if c.checkpoint_every < 0:
        raise ConfigError("checkpoint_every", c.checkpoint_every, "must be >= 0 (0 disables checkpoints)")
    if mo.M < d.N:
        raise ConfigError("model.M", mo.M, f"must be >= data.N ({d.N}): the N positional embeddings must be orthogonal")
    if mo.pos_denom == "M" and mo.M == d.N:
        raise ConfigError("model.M", mo.M, f"must be > data.N ({d.N}) with model.pos_denom=M (p_M = 0)")
    if not mo.pos_scale > 0:
        raise ConfigError("model.pos_scale", mo.pos_scale, "must be > 0")
    if mo.is_ffn:
        if mo.m is None or mo.m < 1:
            raise ConfigError("model.m", mo.m, "must be an integer >= 1 for model=transformer_ffn")
    elif mo.m is not None:
        raise ConfigError("model.m", mo.m, "must be null unless model=transformer_ffn")
    if i.sigma < 0:
        raise ConfigError("init.sigma", i.sigma, "must be >= 0")
    if i.name == "gaussian" and i.sigma == 0:
        raise ConfigError("init.sigma", i.sigma, "must be > 0 for init=gaussian (use init=zero)")
    if not o.lr > 0:
        raise ConfigError("optim.lr", o.lr, "must be > 0")
    if not o.eps > 0:
        raise ConfigError("optim.eps", o.eps, "must be > 0")
    for key, val in (("optim.beta1", o.beta1), ("optim.beta2", o.beta2)):
        if not 0 <= val < 1:
            raise ConfigError(key, val, "must be in [0, 1)")
    if not o.adam_eps > 0:
        raise ConfigError("optim.adam_eps", o.adam_eps, "must be > 0")
    if c.objective is not None and c.objective not in OBJECTIVES:
        raise ConfigError("objective", c.objective, f"must be null or a numeric summary field: {', '.join(OBJECTIVES)}")
    for s in c.snapshot_steps:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError("snapshot_steps", c.snapshot_steps, "must be a list of integers >= 0")
    return c


def _validate_context_chain(d: DataConfig) -> None:
    """kth_order and icl_markov: K ≥ 2, a finite alpha > 0, 1 ≤ order ≤ N − 1 (y's k states are all
    observed), and T's K^order·K entries within markov.MAX_KTH_ENTRIES."""
    if not math.isfinite(d.alpha) or not d.alpha > 0:
        raise ConfigError("data.alpha", d.alpha, "must be a finite number > 0 (the Dirichlet concentration)")
    if d.name not in CONTEXT_CHAINS:
        return
    if d.K < 2:
        raise ConfigError("data.K", d.K, f"must be >= 2 for data={d.name}")
    if d.name != "kth_order":
        return
    if not 1 <= d.order <= d.N - 1:
        raise ConfigError("data.order", d.order, f"must be in [1, data.N − 1] = [1, {d.N - 1}] for data=kth_order")
    if d.K ** (d.order + 1) > MAX_KTH_ENTRIES:
        raise ConfigError("data.order", d.order, f"makes T too large: K^(order+1) = {d.K}^{d.order + 1} entries > "
                          f"{MAX_KTH_ENTRIES} (2^24); lower data.order or data.K")


def _validate_chain(d: DataConfig, seed: int = 0) -> None:
    """The per-family rules on K and Π (the K ≥ 3 rule is the circle's)."""
    if d.name in CIRCLE_CHAINS and d.K < 3:
        raise ConfigError("data.K", d.K, f"must be >= 3 for data={d.name} (a circle of K nodes)")
    if d.name == "binary_chain" and d.K != 2:
        raise ConfigError("data.K", d.K, "must be 2 for data=binary_chain")
    _validate_jumps(d)
    _validate_graph(d, seed)
    if d.name != "markov_matrix":
        for key, val in (("data.Pi", d.Pi), ("data.Pi_file", d.Pi_file)):
            if val is not None:
                raise ConfigError(key, val, "must be null unless data=markov_matrix")
        return
    if d.Pi_file is not None:  # the file replaces data.Pi (the group's example, or what a config.yaml recorded)
        d.Pi = _read_pi(d.Pi_file)
    P = d.Pi
    if P is None:
        raise ConfigError("data.Pi", P, "must be a K×K row-stochastic matrix (a list of rows) for data=markov_matrix")
    if not P or any(len(row) != len(P) for row in P):
        raise ConfigError("data.Pi", P, "must be square: K rows of K entries each")
    if len(P) != d.K:
        raise ConfigError("data.Pi", P, f"must be data.K×data.K ({d.K}×{d.K}); it is {len(P)}×{len(P)}")
    if d.K < 2:
        raise ConfigError("data.K", d.K, "must be >= 2 for data=markov_matrix")
    for i, row in enumerate(P):
        if not all(math.isfinite(x) and x >= 0 for x in row):
            raise ConfigError("data.Pi", P, f"row {i} has a negative or non-finite entry; entries must be in [0, 1]")
        if abs(math.fsum(row) - 1) > 1e-9:
            raise ConfigError("data.Pi", P, f"row {i} sums to {math.fsum(row):.12g}; every row must sum to 1 (to 1e-9)")


def _read_pi(path: str) -> list:
    """data.Pi_file's matrix as a list of rows, or a one-line ConfigError."""
    import os

    import numpy as np

    f = os.path.expanduser(path)
    try:
        if f.endswith(".npy"):
            P = np.load(f, allow_pickle=False)
        else:
            with open(f, encoding="utf-8") as fh:
                P = np.loadtxt(fh.read().replace(",", " ").splitlines(), ndmin=2)
    except (OSError, ValueError) as e:
        raise ConfigError("data.Pi_file", path, f"must be a readable .npy or text matrix ({one_line(e)})") from None
    if P.ndim != 2:
        raise ConfigError("data.Pi_file", path, f"must hold a 2-d matrix; it holds {P.ndim} dimension(s)")
    return [[float(x) for x in row] for row in P]


def _validate_jumps(d: DataConfig) -> None:
    """jump_walk's data.jumps: 2r probabilities, P(+k) then P(−k) for k = 1 … r, summing to 1. Any r is allowed:
    steps are taken mod K, and steps landing on the same node add (markov.jump)."""
    if d.name != "jump_walk":
        if d.jumps is not None:
            raise ConfigError("data.jumps", d.jumps, "must be null unless data=jump_walk")
        return
    J = d.jumps
    if J is None or not J or len(J) % 2:
        raise ConfigError("data.jumps", J, "must be an even-length list [P(+1), P(−1), P(+2), P(−2), …] for data=jump_walk")
    for k, x in enumerate(J):
        if not (math.isfinite(x) and x >= 0):
            raise ConfigError("data.jumps", J, f"entry {k} (P({'+-'[k % 2]}{k // 2 + 1})) is {x}; entries must be in [0, 1]")
    if abs(math.fsum(J) - 1) > 1e-9:
        raise ConfigError("data.jumps", J, f"sums to {math.fsum(J):.12g}; the probabilities must sum to 1 (to 1e-9)")


def _validate_graph(d: DataConfig, seed: int) -> None:
    """graph_walk: the graph's name, its size keys, K consistent with them, and a connected graph (built here,
    from the run's seed for random_regular, so a disconnected draw fails before any job starts)."""
    if d.name != "graph_walk":
        return
    from . import markov
    _choice("data.graph", d.graph, markov.GRAPHS)
    g = d.graph
    if g in ("grid", "torus"):
        if d.side < (3 if g == "torus" else 2):
            raise ConfigError("data.side", d.side, f"must be >= {3 if g == 'torus' else 2} for data.graph={g}")
        if d.K != d.side ** 2:
            raise ConfigError("data.K", d.K, f"must be side² = {d.side ** 2} for data.graph={g} (data.side={d.side})")
    elif g == "hypercube":
        if d.dim < 1:
            raise ConfigError("data.dim", d.dim, "must be >= 1 for data.graph=hypercube")
        if d.K != 2 ** d.dim:
            raise ConfigError("data.K", d.K, f"must be 2^dim = {2 ** d.dim} for data.graph=hypercube (data.dim={d.dim})")
    elif d.K < (3 if g == "cycle" else 2):
        raise ConfigError("data.K", d.K, f"must be >= {3 if g == 'cycle' else 2} for data.graph={g}")
    if g == "random_regular":
        if not 0 <= d.degree < d.K or (d.K * d.degree) % 2:
            raise ConfigError("data.degree", d.degree, f"must be in [1, K−1] with K·degree even (K={d.K})")
    try:
        markov.graph(g, d.K, d.degree, d.side, d.dim, seed)
    except ValueError as e:  # not connected (degree 0, or an unlucky random draw)
        key = "data.degree" if g == "random_regular" else "data.graph"
        raise ConfigError(key, d.degree if g == "random_regular" else g,
                          f"gives a graph that is not connected ({e}; seed={seed}); a random walk on it never mixes") from None


def _require_all(cls, d: dict, prefix: str) -> None:
    """A composed config holds every schema key; a missing one was deleted with `~key`, which the engine
    cannot do without (rather than silently training with the default)."""
    for name, _, sub in _fields(cls):
        if name not in d:
            raise ConfigError(prefix + name, "<deleted>", "is required by the schema and cannot be removed")
        if sub is not None and isinstance(d[name], dict):
            _require_all(sub, d[name], prefix + name + ".")


def from_dict(d: dict, complete: bool = False) -> RunConfig:
    """A composed (resolved) config dict → a validated RunConfig. Hydra's own `hydra` node is ignored.
    `complete`: the dict was composed against the schema, so every key must be there."""
    d = {k: v for k, v in d.items() if k != "hydra"}
    if complete:
        _require_all(RunConfig, d, "")
    return validate(_build(RunConfig, d, ""))


# Summary fields a task can return as its objective (`objective=...`, e.g. for the Optuna sweeper).
OBJECTIVES = ("test_acc", "test_loss", "train_loss", "test_kl", "parent_attention", "v_pi_cosine", "pred_dist",
              "attention_spread", "symmetry_break_step", "steps", "wall_s")

_TYPE_RULE = {"float": "must be a number", "int": "must be an integer", "bool": "must be true or false",
              "str": "must be a string"}


def _allowed_keys(dotted: str) -> str:
    cls = RunConfig
    for part in dotted.split(".")[:-1]:
        f = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        sub = f.default_factory if f is not None and f.default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(sub):
            return "none"
        cls = sub
    return ", ".join(f.name for f in dataclasses.fields(cls))


def from_hydra_error(exc: BaseException) -> ConfigError | None:
    """Hydra's / OmegaConf's composition errors (a value of the wrong type against the schema, a key the
    schema has no place for, a deleted required key, an unknown group option) as the same one-line
    ConfigError, or None."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        key = getattr(e, "full_key", None)
        if isinstance(e, ConfigError):
            return e
        if not key:
            continue
        if isinstance(e, ValidationError):
            key = key.split("[")[0]
            typ = schema_type(key) or ""
            typ = typ[len("Optional["):-1] if typ.startswith("Optional[") else typ
            rule = _TYPE_RULE.get(typ, {"List[int]": "must be a list of integers",
                                        "List[List[float]]": "must be a list of rows of numbers or null",
                                        "List[float]": "must be a list of numbers or null"}.get(
                typ, one_line(e)))
            return ConfigError(key, getattr(e, "value", None), rule)
        if isinstance(e, (ConfigAttributeError, ConfigKeyError)):
            m = re.search(r"use \+" + re.escape(key) + r"=(.*)$", str(exc), re.M)
            value = m.group(1) if m else None
            if key.startswith("hydra.launcher."):
                return ConfigError(key, value, "unknown launcher key; any other sbatch option goes in "
                                   f"'+hydra.launcher.additional_parameters.{key.rsplit('.', 1)[1]}=...'")
            if key.startswith("hydra."):
                return ConfigError(key, value, "unknown Hydra key")
            return ConfigError(key, value, f"unknown key; allowed here: {_allowed_keys(key)}")
        if isinstance(e, ConfigTypeError) and "deletion" in str(e):
            return ConfigError(key, "<deleted>", "is required by the schema and cannot be removed")
    text = str(exc)
    m = re.search(r"Could not (?:find|load) '([\w/]+)/([^']+)'.*?Available options in '[^']+':\s*(.*?)(?:Config search path|$)",
                  text, re.S)
    if m:
        options = ", ".join(o.strip() for o in m.group(3).split() if o.strip())
        return ConfigError(m.group(1), m.group(2), f"unknown option; allowed: {options}")
    return None


@contextlib.contextmanager
def one_line_errors():
    """Inside: Hydra's and OmegaConf's composition errors leave as the one-line ConfigError that
    `from_hydra_error` maps them to (anything it cannot map leaves unchanged)."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors, as one line
        mapped = from_hydra_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


@functools.lru_cache(maxsize=4096)
def schema_type(dotted: str) -> str | None:
    """The schema's type of a dotted key ("float", "Optional[str]", …), None if it has no such key."""
    cls, typ = RunConfig, None
    for part in dotted.split("."):
        field = next((f for f in _fields(cls) if f[0] == part), None) if cls is not None else None
        if field is None:
            return None
        _, typ, cls = field
    return typ


def as_schema(dotted: str, value: Any) -> Any:
    """A command-line value converted as OmegaConf converts it for the schema's type (`data.p=0` → 0.0),
    where that conversion is lossless; anything else is left for `validate` to reject in one line."""
    typ = schema_type(dotted)
    if typ == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ in ("str", "Optional[str]") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def wandb_group(folder: str) -> str:
    """A run's wandb group when `wandb.group` is null: its sweep (or single run) folder, as the last two parts
    of the path (`multirun/2026-12-01/10-00-00` → `2026-12-01/10-00-00`)."""
    from pathlib import Path

    return "/".join(Path(str(folder)).parts[-2:])


def register() -> None:
    """RunConfig as Hydra's schema for `conf/config.yaml` (`defaults: [run_schema, ...]`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConfig, provider="rw_sweeps")


register()
