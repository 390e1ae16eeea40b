"""One typed config for one training run, one schema per option, and their validation.

A run is `RunConfig`: its own keys, and one option of each group (`data`, `model`, `init`, `optim`), each a
dataclass declared with `@option(group)` that holds only that option's keys, every default written once,
with its comment. `register()` stores `RunConfig` in Hydra's ConfigStore as `schema/run` (the first entry of
`conf/config.yaml`'s defaults) and each option as `schema/<group>/<name>`, which the option's YAML file names
in its defaults; the YAML files hold only deltas. A key of another option is then rejected in one line
(`invalid config: data.q=0.3: unknown key for data=random_walk; allowed: name, K, N, n_train, n_test, target, online, batch, p`).

Typing is OmegaConf's: Hydra composes against these schemas, and `from_dict` checks every value of a plain
dict with OmegaConf's own conversion rules (`typed`), once per distinct value. What OmegaConf cannot state
(ranges, Π rows summing to 1, K per family, cross-key rules) is `validate`'s, each failing as `ConfigError`
with the dotted key, the value and what is allowed; `rw_sweeps.sweeps.hydra_errors` maps Hydra's and OmegaConf's own
composition errors to the same line.

Which fields batch together and which identify a run's data are derived from the schemas: every field is
part of a run's shape (`shape_key`) but those a class declares per run (`PER_RUN`: seed, lr, eps, σ, p, …).

Grids across init options: zero init is σ = 0. `init=gaussian init.sigma=0,1e-3,1e-2` sweeps one σ axis
whose σ = 0 point is zero init's V = W = 0 (with the gaussian protocol's normalisation, `model.normalize`
auto); `init=zero` has no σ, so `init=zero init.sigma=…` is refused rather than trained once per σ.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Optional

from omegaconf import MISSING

from .errors import ConfigError, one_line

NORMALIZE = ("none", "whole", "positional", "token")
# bools (and what OmegaConf makes of a bool given to a str key) read as before model.normalize was a string
NORMALIZE_ALIASES = {True: "whole", False: "none", "True": "whole", "False": "none", "true": "whole",
                     "false": "none"}
DEFAULT_SNAPSHOTS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 400, 700, 1000]
SEED_MAX = 2**32 - 1  # seeds are 0 … 2³²−1 (torch's generator uses 32 bits; the init stream: model.init_seed)
GROUPS = ("data", "model", "init", "optim")

# ------------------------------------------------------------------------------------------ the registry
OPTIONS: dict[str, dict[str, type]] = {g: {} for g in GROUPS}  # group → option name → its schema


def option(group: str):
    """Declare a dataclass as the schema of one option of `group`, named by its `name` field's default:
    `from_dict` builds it for `<group>.name`, Hydra composes `schema/<group>/<name>` into it. The group's base
    class may check, here, that the option provides what its group needs (`registered`)."""
    def declare(cls):
        name = cls.__dataclass_fields__["name"].default
        if name in OPTIONS[group] and OPTIONS[group][name] is not cls:
            raise ValueError(f"two schemas declare {group}={name}")
        check = getattr(cls, "registered", None)
        if check is not None:  # the group's base class says what an option of it must provide
            check()
        OPTIONS[group][name] = cls
        _store(group, name, cls)
        return cls
    return declare


def _store(group: str, name: str, cls: type) -> None:
    """The schema as `schema/<group>/<name>` in Hydra's ConfigStore, outside the option group, so it is never a
    choice of `<group>` (`glob(*)`, `--help`, shell completion, "Available options"); the option's YAML extends it
    into its own node with `- /schema/<group>/<name>@_here_`."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=f"schema/{group}", name=name, node=cls, provider="rw_sweeps")


def choice(key: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"must be one of {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class Rule:
    """A key's rule, declared where the key is (`field(default=…, metadata=rule(lo=0, hi=1, hi_open=True))`)
    and checked for every option by `check_rules`: a number finite and within [lo, hi] (an end open where
    said), or a value among `choices`; `note` is said after it."""
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Optional[tuple] = None
    note: str = ""

    def text(self) -> str:
        if self.choices is not None:
            out = f"must be one of {', '.join(map(str, self.choices))}"
        elif self.lo is not None and self.hi is not None:
            out = f"must be in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            out = f"must be {'>' if self.lo_open else '>='} {self.lo:g}"
        elif self.hi is not None:
            out = f"must be {'<' if self.hi_open else '<='} {self.hi:g}"
        else:
            out = "must be a finite number"
        return f"{out} ({self.note})" if self.note else out

    def check(self, key: str, value: Any) -> None:
        if self.choices is not None:
            if value not in self.choices:
                raise ConfigError(key, value, self.text())
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(key, value, "must be a finite number")
        ok = ((self.lo is None or (value > self.lo if self.lo_open else value >= self.lo))
              and (self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)))
        if not ok:
            raise ConfigError(key, value, self.text())


def rule(**kw) -> dict:
    """A field's metadata holding its `Rule`."""
    return {"rule": Rule(**kw)}


def check_rules(obj: Any, prefix: str) -> None:
    """Every rule an option's fields declare (ConfigError, one line, on the first broken one)."""
    for f in dataclasses.fields(obj):
        r = f.metadata.get("rule")
        if r is not None:
            r.check(prefix + f.name, getattr(obj, f.name))


class Refusal(ConfigError):
    """An option asked for an engine it has no implementation for."""


def implementation(option: Any, group: str, engine: str, model: str):
    """The implementation of an option for an engine (`ENGINES[engine]`, a class), or a one-line refusal
    naming the option, the engine and what serves it: a dispatch ends in a refusal, never a default."""
    impl = type(option).ENGINES.get(engine)
    if impl is None:
        serve = [n for n, c in OPTIONS[group].items() if engine in c.ENGINES]
        raise Refusal(group, option.name, f"{group}={option.name} has no implementation for model={model}'s "
                      f"engine ({engine}); {group} options that serve it: {', '.join(serve) or 'none'}")
    check = getattr(impl, "check", None)
    if check is not None:  # what the engine cannot do with this option's values (one line)
        check(option)
    return impl


# ------------------------------------------------------------------------------------------ data
@dataclass
class DataConfig:
    """The keys every data family has. A family (`rw_sweeps.core.families`) subclasses it with its own keys
    and behaviour: its rules (`validate`), its Π (`transition`, None when the chain is not first order),
    its sampler (`draw`) and, where it has a closed form, its Bayes-optimal accuracy (`opt_acc`).

    What a family must provide is checked when it registers (`registered`, a one-line TypeError naming the
    family and the hook): a sampler, its own `draw` or the first-order chain of its `transition`; and, where
    it offers target=all (`TARGETS`), the law at every position: its own `laws` or, for a first-order chain,
    its `transition` (the default `laws` reads Π). A family whose `draw` is not the chain of its `transition`
    defines `laws` or declares TARGETS = ("last",). Its facts live here too: the keys its summary echoes
    (`ECHO`) and Theorem 4.1's trap (`is_trap`)."""

    class _Derived:
        """A class attribute derived from the class it is read on, until a family declares its own value."""

        def __init__(self, derive):
            self.derive = derive

        def __get__(self, obj, cls=None):
            cls = cls if cls is not None else type(obj)
            if "__dataclass_fields__" not in cls.__dict__:  # read by @dataclass itself, before it has fields
                return self
            return self.derive(cls)

    name: str = MISSING  # the family: the choice of `data=...`
    K: int = 6  # number of states (vocabulary size for QA)
    N: int = 97  # sequence length, counting the target: N − 1 observed tokens
    n_train: int = 1000
    n_test: int = 1000
    # what is predicted: last (x_N from x_1 … x_{N−1}, the paper's task) | all (x_{t+1} from x_1 … x_t at every
    # position t, the next-token objective of nanoGPT-style training; model=gpt only)
    target: str = "last"
    online: bool = False  # true: a fresh batch of data.batch sequences every step (model=gpt); false: the fixed training set
    batch: int = 16  # sequences per step when online (the fixed test set stays n_test sequences)
    PER_RUN: ClassVar[tuple] = ()  # keys whose values differ within one batch (the rest is the run's shape)
    SEEDED: ClassVar[bool] = False  # do the family's rules depend on the run's seed (`with_seed`)?
    # the data.target values it serves: last always, all where it has the laws for it (its `laws`, or its
    # `transition`, whose Π the default `laws` reads); a family may declare fewer (`registered` checks it)
    TARGETS: ClassVar[tuple] = _Derived(lambda cls: ("last", "all") if cls.has_laws() else ("last",))
    # the keys a run's summary echoes under their names (`echoed`): by default the family's own keys but its
    # FILES; a family declares fewer where a key is large (a matrix) or says nothing alone
    ECHO: ClassVar[tuple] = _Derived(lambda cls: tuple(k for k in cls.own_keys() if k not in cls.FILES))
    # keys that name a file read when a config is validated, whose content the config then records; a stored
    # config is judged without opening them (`stored`)
    FILES: ClassVar[tuple] = ()

    @classmethod
    def provides(cls, hook: str) -> bool:
        """Does the family define `hook` (a method of this class) itself, rather than inherit this class's?"""
        return getattr(cls, hook) is not getattr(DataConfig, hook)

    @classmethod
    def has_laws(cls) -> bool:
        """Can it give the law at every position (target=all): its own `laws`, or a first-order Π?"""
        return cls.provides("laws") or cls.provides("transition")

    @classmethod
    def own_keys(cls) -> tuple:
        """The family's keys beyond those every family has."""
        base = DataConfig.__dataclass_fields__
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in base)

    @classmethod
    def registered(cls) -> None:
        """What `@option("data")` checks before the family is a choice (a one-line TypeError naming the family
        and what it lacks): a sampler; target=all offered only with the laws for it; an echoed key its own
        and no other field of the summary."""
        name = f"data={cls.__dataclass_fields__['name'].default}"
        if not (cls.provides("draw") or cls.provides("transition")):
            raise TypeError(f"{name}: {cls.__name__} has no sampler: define draw(n, gen, seed), or transition(seed) "
                            "(Π of a first-order chain, which the default draw samples)")
        targets = cls.TARGETS
        if not isinstance(targets, tuple) or "last" not in targets or not set(targets) <= {"last", "all"}:
            raise TypeError(f"{name}: TARGETS={targets!r} must be a tuple of last (every family serves it) and all")
        if "all" in targets and not cls.has_laws():
            raise TypeError(f"{name}: TARGETS offers all but {cls.__name__} has no laws(seq, seed) (nor a "
                            "first-order transition(seed) for the default laws): define laws, or leave all out")
        from .contract import ECHOES, SUMMARY_FIELDS

        echo = cls.ECHO
        if not isinstance(echo, tuple):
            raise TypeError(f"{name}: ECHO={echo!r} must be a tuple of its own keys")
        for key in echo:
            if key not in cls.own_keys():
                raise TypeError(f"{name}: ECHO names {key!r}, which is not one of its own keys "
                                f"({', '.join(cls.own_keys()) or 'none'})")
            if key in SUMMARY_FIELDS and ECHOES.get(key) != f"data.{key}":
                raise TypeError(f"{name}: ECHO names {key!r}, a summary field of its own; leave it out of ECHO")

    def echoed(self) -> dict:
        """The family's keys a run's summary echoes (`ECHO`), under their names (copies)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in type(self).ECHO}

    def is_trap(self) -> bool:
        """Theorem 4.1's conditions on the data (the escape theory's `trap`: zero-init GD stays at the
        symmetric point): False where the family has no such theorem (the circle says where it does)."""
        return False

    def validate(self, seed: int) -> None:
        """The family's own rules (ConfigError, one line)."""

    def transition(self, seed: int = 0):
        """Π as a K×K numpy array (row i: the law of the next state given state i), None if the data are not
        a first-order chain; `seed` (the run's) matters only where the chain is drawn from it."""
        return None

    def laws(self, seq, seed: int):
        """For target=all: (n, N−1, K) numpy, row t the law of s_{t+2} given s_1 … s_{t+1} of each sequence
        `seq` (n, N) (0-based: position t predicts seq[:, t + 1]); None where the family has no such law
        (the QA tasks). Default: the first-order chain, Π[s_t]."""
        import numpy as np

        Pi = self.transition(seed)
        return None if Pi is None else np.asarray(Pi, np.float64)[seq[:, :-1]]

    def stationary(self, seed: int):
        """The law the unigram baseline predicts (K,), or None: the in-context unigram strategy instead. For a
        first-order chain, the long-run law of states from the uniform start, (1/T) Σ_{t<T} u Πᵗ (T = 4096):
        the stationary law where it is unique, and the well-defined average where it is not."""
        from .markov import long_run_law

        Pi = self.transition(seed)
        return None if Pi is None else long_run_law(Pi)

    @property
    def smoothing(self) -> float:
        """α of the in-context strategies (n_k + α) / (n + Kα): 1 (Laplace), or the family's Dirichlet α."""
        return 1.0

    def draw_many(self, datas: list, n: int, gens: list, seeds: list) -> list:
        """`draw` for many runs of this family (online batches, one generator each), each exactly its own
        `draw`: where the family's sampler is this class's first-order chain (`DataConfig.draw`, not
        overridden), one loop over positions for all runs (`data.chains_many`); else run by run."""
        if type(self).draw is DataConfig.draw:
            from .data import chains_many

            return chains_many([d.transition(s) for d, s in zip(datas, seeds)], self.N, n, gens,
                               starts=[d.initial_law(s) for d, s in zip(datas, seeds)])
        from .data import checked

        return [checked(d, d.draw(n, g, s), n) for d, g, s in zip(datas, gens, seeds)]

    def first_order_pi(self, seed: int):
        """The Π that V is compared with (v_pi_cosine) and that the trap's classes come from."""
        return self.transition(seed)

    @property
    def opt_acc(self) -> Optional[float]:
        """The Bayes-optimal accuracy where it has a closed form; None: the summary measures it on the test set."""
        return None

    @property
    def context(self) -> int:
        """How many last states the next one depends on (the attention's parents)."""
        return 1

    def parents_of(self, seed: int):
        """The parents (1-based positions) of every position 1 … N: the `context` positions before it (a
        Bayesian network overrides it with its DAG); None where the law is not a function of positions."""
        k = self.context
        return [list(range(max(1, i - k), i)) for i in range(1, self.N + 1)]

    def parents(self, seed: int):
        """y's parents (1-based positions), or None."""
        of = self.parents_of(seed)
        return None if of is None else of[-1]

    def draw(self, n: int, gen, seed: int):
        """n sequences (`rw_sweeps.core.data.Split`) from the generator; default: the first-order chain Π."""
        from .data import chains

        return chains(self.transition(seed), self.N, n, gen, start=self.initial_law(seed))

    def initial_law(self, seed: int):
        """The law of s_1 (K,), or None: uniform (drawn as the circle draws it)."""
        return None

    def draw_into(self, gen, seed: int, tokens, y, P_true) -> None:
        """`draw` written into a stacked batch's numpy views (a family with a faster path overrides it)."""
        import torch

        from .data import checked

        s = checked(self, self.draw(len(y), gen, seed), len(y))
        tokens[...], y[...] = s.tokens.numpy(), s.y.numpy()
        P_true[...] = s.P_true.to(torch.from_numpy(P_true[:0]).dtype).numpy()

    def in_unit(self, key: str, value: float) -> None:
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ConfigError(f"data.{key}", value, "must be in [0, 1]")


# ------------------------------------------------------------------------------------------ models
@dataclass
class ModelBase:
    """What every model option has: its name, and the training loop that trains it (`TRAINER`, a module of
    `rw_sweeps.core` with `train`, `summary`, `prefetch` and `run_bytes`: `rw_sweeps.core.trainer`)."""
    name: str = MISSING
    PER_RUN: ClassVar[tuple] = ()
    TRAINER: ClassVar[str] = ""
    ENGINE: ClassVar[str] = ""  # the engine its trainer is (what an optimiser or init implements for it)
    # why the escape theory (`rw_sweeps.core.theory`, the linearised GD step of eq. 2.1) does not describe
    # this model, or None where it does
    ESCAPE_THEORY: ClassVar[Optional[str]] = "the escape theory linearises eq. 2.1's GD step (model=transformer)"

    def resolved(self, init: "InitConfig") -> "ModelBase":
        """The model with what depends on the init resolved (model.normalize=auto); a copy where it changes."""
        return self

    def validate(self, c: "RunConfig") -> None:
        """The model's own rules, given the whole run (ConfigError, one line)."""


@option("model")
@dataclass
class ModelConfig(ModelBase):
    """eq. 2.1: f(X) = V X S(X̃ᵀ W x̃_N), X̃ = [X; P]."""
    name: str = "transformer"
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
    PER_RUN: ClassVar[tuple] = ()
    TRAINER: ClassVar[str] = "rw_sweeps.core.training"
    ENGINE: ClassVar[str] = "eq21"
    ESCAPE_THEORY: ClassVar[Optional[str]] = None

    def resolved(self, init: "InitConfig") -> "ModelConfig":
        return resolve_normalize(self, init)

    def validate(self, c: "RunConfig") -> None:
        d = c.data
        choice("model.normalize", self.normalize, NORMALIZE)
        if self.is_ffn:
            choice("model.ffn", self.ffn, ("after", "before"))
        choice("model.pos", self.pos, ("sine",))
        choice("model.pos_denom", self.pos_denom, ("M", "M+1"))
        choice("model.gram", self.gram, ("exact", "numeric"))
        if not math.isfinite(self.pos_scale) or not self.pos_scale > 0:
            raise ConfigError("model.pos_scale", self.pos_scale, "must be a finite number > 0")
        if self.M < d.N:
            raise ConfigError("model.M", self.M, f"must be >= data.N ({d.N}): the N positional embeddings must be orthogonal")
        if self.pos_denom == "M" and self.M == d.N:
            raise ConfigError("model.M", self.M, f"must be > data.N ({d.N}) with model.pos_denom=M (p_M = 0)")
        if self.is_ffn and self.m < 1:
            raise ConfigError("model.m", self.m, "must be an integer >= 1")
        if d.target != "last":
            raise ConfigError("data.target", d.target, f"model={self.name} predicts x_N only; allowed: last "
                              "(model=gpt trains on every position)")
        if d.online:
            raise ConfigError("data.online", d.online, f"model={self.name} trains full-batch on the fixed training "
                              "set; allowed: false (model=gpt draws fresh batches)")

    @property
    def is_ffn(self) -> bool:
        """The F.1 variant, f = A·ReLU(V·X·S)."""
        return False

    @property
    def m(self) -> Optional[int]:
        """The FFN width (None: no FFN)."""
        return None

    @property
    def ffn(self) -> str:
        return "after"


@option("model")
@dataclass
class FfnModelConfig(ModelConfig):
    """App. F.1: f(X) = A ReLU(V X S(X̃ᵀ W x̃_N)), A ∈ R^{K×m}, V ∈ R^{m×K}: the transformer plus an FFN."""
    name: str = "transformer_ffn"
    m: int = 19  # FFN width
    # where the FFN sits: after the attention, f = A·ReLU(V·X·S) | before it, per token,
    # f = Σ_i S_i·A·ReLU(V x_i) = A·ReLU(V)·X·S (x_N's token part is 0, so the query adds nothing)
    ffn: str = "after"
    ESCAPE_THEORY: ClassVar[Optional[str]] = (
        "zero init is a fixed point where ReLU'(0) = 0, so the linearised step is the identity and the escape is "
        "second order in sigma, which this theory does not see")

    @property
    def is_ffn(self) -> bool:
        return True


# ------------------------------------------------------------------------------------------ inits
@dataclass
class InitConfig:
    """What every init has: its name, its scale and its σ axis. An init is a module of `rw_sweeps.core.inits`
    (its schema, its rules, and its implementation for each engine it serves, `ENGINES`: engine name →
    class); `implementation(engine)` gives it or refuses in one line. RunConfig's default is init=zero."""
    name: str = MISSING
    ENGINES: ClassVar[dict] = {}  # engine (a model's `ENGINE`) → the class that draws this init's θ(0) there
    # what model.normalize=auto resolves to with this init (the paper's protocol: whole with a Gaussian init)
    AUTO_NORMALIZE: ClassVar[str] = "none"

    @classmethod
    def registered(cls) -> None:
        name = cls.__dataclass_fields__["name"].default
        if not cls.ENGINES:
            raise TypeError(f"init={name}: ENGINES names no engine it serves")
        for method in ("scale", "unit"):
            if getattr(cls, method) is getattr(InitConfig, method):
                raise TypeError(f"init={name}: declares no {method}()")
        for engine, impl in cls.ENGINES.items():
            missing = [m for m in INIT_METHODS.get(engine, ()) if not callable(getattr(impl, m, None))]
            if missing:
                raise TypeError(f"init={name}: its {engine} implementation {impl.__name__} lacks {', '.join(missing)}")

    def validate(self, c: "RunConfig") -> None:
        """The init's rules beyond its fields' own (ConfigError, one line)."""

    def implementation(self, engine: str, model: str = "?"):
        return implementation(self, "init", engine, model)

    def scale(self) -> float:
        """The init's scale, what a run's summary records as `sigma`: σ, GPT-2's std, 0 for zero init."""
        raise NotImplementedError

    def unit(self) -> "InitConfig":
        """The init at unit scale: the draw of which every point of its σ axis is `scale()` times (the escape
        theory's δ_0; zero init is σ = 0 of init=gaussian's)."""
        raise NotImplementedError


# What an engine calls on an init's implementation for it (checked when an init registers).
INIT_METHODS = {"eq21": ("initial", "draw_bytes"), "gpt": ("weight",), "oracle": ("dense",)}


# ------------------------------------------------------------------------------------------ optimisers
@dataclass
class OptimConfig:
    """What every optimiser has: the loss it descends, ℓ = −log([f]_y + eps), and how long. An optimiser is a
    module of `rw_sweeps.core.optimisers` (its schema, its rules, and its implementation for each engine it
    serves, `ENGINES`: engine name → class); `implementation(engine)` gives it or refuses in one line."""
    name: str = MISSING
    lr: float = field(default=1.0, metadata=rule(lo=0, lo_open=True))  # η
    steps: int = field(default=50, metadata=rule(lo=1))  # T
    eps: float = field(default=0.1, metadata=rule(lo=0, lo_open=True))  # ε in ℓ(z) = −log(z + ε)
    # mean | sum of the per-sequence losses (§8.3, §8.10)
    reduction: str = field(default="mean", metadata=rule(choices=("mean", "sum")))
    PER_RUN: ClassVar[tuple] = ("lr", "eps", "reduction")
    ENGINES: ClassVar[dict] = {}  # engine (a model's `ENGINE`) → the class that trains with this optimiser there
    LINEARISED: ClassVar[bool] = False  # is its step eq. 2.3's GD step (what the escape theory linearises)?

    @classmethod
    def registered(cls) -> None:
        if not cls.ENGINES:
            raise TypeError(f"optim={cls.__dataclass_fields__['name'].default}: ENGINES names no engine it serves")
        for engine, impl in cls.ENGINES.items():
            missing = [m for m in ENGINE_METHODS.get(engine, ()) if not callable(getattr(impl, m, None))]
            if missing:
                raise TypeError(f"optim={cls.__dataclass_fields__['name'].default}: its {engine} implementation "
                                f"{impl.__name__} lacks {', '.join(missing)}")

    def validate(self, c: "RunConfig") -> None:
        """The optimiser's rules beyond its fields' own (ConfigError, one line)."""

    def implementation(self, engine: str, model: str = "?"):
        return implementation(self, "optim", engine, model)

    def lr_factor(self, t: int) -> float:
        """The learning rate of the step from θ_t is lr·lr_factor(t): 1 without a schedule."""
        return 1.0


# What an engine calls on an optimiser's implementation for it (checked when an optimiser registers).
ENGINE_METHODS = {"eq21": ("start", "steps"), "gpt": ("state", "update"), "oracle": ("make",)}


# ------------------------------------------------------------------------------------------ the run
def _env(name: str, default: Any) -> Any:
    """wandb's own environment variable as a default: an explicit `wandb.*` key overrides it, and the run's
    config.yaml records what was used. WANDB_TAGS is comma-separated; WANDB_MODE's legacy `dryrun` is
    offline and `run` is online, as wandb reads them."""
    import os

    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if name == "WANDB_TAGS":
        return [t.strip() for t in value.split(",") if t.strip()]
    if name == "WANDB_MODE":
        return {"dryrun": "offline", "run": "online"}.get(value, value)
    return value


@dataclass
class WandbConfig:
    mode: str = field(default_factory=lambda: _env("WANDB_MODE", "offline"))  # offline | online | disabled
    project: str = field(default_factory=lambda: _env("WANDB_PROJECT", "rw-sweeps"))
    entity: Optional[str] = field(default_factory=lambda: _env("WANDB_ENTITY", None))  # null: wandb's default
    group: Optional[str] = None  # the sweep; filled in from Hydra's sweep folder when left null
    tags: List[str] = field(default_factory=lambda: _env("WANDB_TAGS", []))  # the experiment is added
    granularity: str = "auto"  # run: a wandb run per training run | job: one per packed job | auto
    per_run_limit: int = 32  # auto: per-run wandb runs (logged live) for batches up to this size
    analysis: bool = True  # a finished sweep logs its report's figures and runs table (one job_type=analysis run)


def resolve_normalize(model, init):
    """model.normalize=auto → whole with a Gaussian init, none otherwise (the paper's protocol); a copy."""
    where = NORMALIZE_ALIASES.get(model.normalize, model.normalize)
    if where == "auto":
        where = init.AUTO_NORMALIZE
    return model if where == model.normalize else dataclasses.replace(model, normalize=where)


def _default_data() -> DataConfig:
    return OPTIONS["data"]["random_walk"]()


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
    data: DataConfig = field(default_factory=_default_data)
    model: ModelBase = field(default_factory=lambda: OPTIONS["model"]["transformer"]())
    init: InitConfig = field(default_factory=lambda: OPTIONS["init"]["zero"]())
    optim: OptimConfig = field(default_factory=lambda: OPTIONS["optim"]["gd"]())
    wandb: WandbConfig = field(default_factory=WandbConfig)
    # keys whose values differ within one batch (the init whole: zero and Gaussian runs train together); the
    # other groups' are their classes' PER_RUN
    PER_RUN: ClassVar[tuple] = ("seed", "checkpoint_every", "experiment", "objective", "wandb", "init")

    def __post_init__(self) -> None:
        # model.normalize=auto is the paper's protocol, which depends on the init: resolved here, once, so
        # that the run's config, its shape and its summary all say what was trained (a copy: a model config
        # passed in by the caller is never changed)
        self.model = self.model.resolved(self.init)

    def to_dict(self) -> dict:
        """The config as plain data (what config.yaml holds): `dataclasses.asdict`'s result, ~5× faster."""
        return _as_dict(self)

    @property
    def opt_acc(self) -> float | None:
        """The Bayes-optimal test accuracy where it has a closed form (OPT = max(p, 1 − p) on the circle, 1 for
        the QA tasks); None for the other chains: the summary measures it on the test set (`training.train`)."""
        return self.data.opt_acc


def option_config(group: str, name: Optional[str] = None, **keys: Any):
    """The schema of option `name` of `group` (RunConfig()'s by default), with these keys
    (`option_config("optim", "adam", lr=0.01)`)."""
    return OPTIONS[group][name or _DEFAULTS[group]](**keys)


@functools.lru_cache(maxsize=None)
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _as_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {k: _as_dict(getattr(obj, k)) for k in _names(type(obj))}
    if isinstance(obj, (list, tuple)):
        return [_as_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _as_dict(v) for k, v in obj.items()}
    return obj


def data_config(name: str = "random_walk", **keys: Any) -> DataConfig:
    """The schema of the data family `name`, with these keys (`data_config("binary_chain", p=0.3)`)."""
    return option_config("data", name, **keys)


# ------------------------------------------------------------------------------------------ derived keys
def _frozen(v: Any) -> Any:
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


@functools.lru_cache(maxsize=None)
def _shape_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.PER_RUN)


def shape_key(cfg: RunConfig) -> tuple:
    """Runs with equal keys can share one tensor program: every field of the schema but those declared per
    run (`PER_RUN`), with each option's class."""
    out = [getattr(cfg, k) for k in _shape_fields(RunConfig) if k not in GROUPS]
    for g in (g for g in GROUPS if g not in RunConfig.PER_RUN):
        opt = getattr(cfg, g)
        out.append((type(opt).__name__, *(_frozen(getattr(opt, k)) for k in _shape_fields(type(opt)))))
    return tuple(_frozen(x) for x in out)


def data_key(cfg: RunConfig) -> tuple:
    """What a run's data are a function of: its seed and every key of its data family."""
    d = cfg.data
    return (cfg.seed, type(d).__name__, *(_frozen(getattr(d, k)) for k in _names(type(d))))


# ------------------------------------------------------------------------------------------ building
@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple[tuple[str, Any], ...]:
    """(name, the group it is, or None) of each field of a class."""
    return tuple((f.name, f.name if cls is RunConfig and f.name in GROUPS else
                  "wandb" if cls is RunConfig and f.name == "wandb" else None) for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def _node(cls):
    """A structured OmegaConf node of the class: OmegaConf's own type conversion, as a scratch target."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(cls)


_TYPED: dict = {}  # (class, key, type, value) → the converted value: a grid repeats its values


def typed(cls, name: str, value: Any, key: str) -> Any:
    """The value as OmegaConf converts it for field `name` of the schema `cls` (`p: 0` → 0.0), or a one-line
    ConfigError for a value of the wrong type."""
    scalar = isinstance(value, (str, int, float, bool)) or value is None
    flat = isinstance(value, list) and all(isinstance(x, (str, int, float, bool)) for x in value)
    cache = scalar or flat  # lists of scalars (snapshot_steps, tags) by their items and the items' types
    ck = (cls, name, type(value), value) if scalar else (cls, name, list, tuple((type(x), x) for x in value)) \
        if flat else None
    if cache and ck in _TYPED:
        out = _TYPED[ck]
        return list(out) if flat else out  # a list of its own: a config may be changed in place
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    plain = _plain(cls, name, value)
    if plain is not _NOT_PLAIN:
        return plain
    node = _node(cls)
    if name == "normalize" and isinstance(value, bool):  # the key's old type: a config from before
        value = NORMALIZE_ALIASES[value]
    try:
        node[name] = value
    except ValidationError as e:
        raise ConfigError(key, value, type_rule(cls, name, e)) from None
    out = node[name]
    out = OmegaConf.to_container(out) if OmegaConf.is_config(out) else out
    if cache:
        _TYPED[ck] = list(out) if flat else out
    return out


_NOT_PLAIN = object()


@functools.lru_cache(maxsize=None)
def _hint(cls, name: str):
    import typing

    return typing.get_type_hints(cls).get(name)


def _plain(cls, name: str, value: Any) -> Any:
    """OmegaConf's conversion where it is the identity or int → float (an int for an int field, a number for
    a float field, a string for a string field, a bool for a bool field), without a node; else _NOT_PLAIN."""
    hint, kind = _hint(cls, name), type(value)
    if hint is int and kind is int or hint is str and kind is str or hint is bool and kind is bool:
        return value
    if hint is float and kind in (int, float):
        return float(value)
    return _NOT_PLAIN


_RULES = {int: "must be an integer", float: "must be a number", bool: "must be true or false", str: "must be a string"}


def type_rule(cls, name: str, e: BaseException) -> str:
    import typing

    hint = _hint(cls, name)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    base = args[0] if optional and args else hint
    if base in _RULES:
        return _RULES[base] + (" or null" if optional else "")
    text = str(base).replace("typing.", "")
    if "List[List[float]]" in text or "List[List[Any]]" in text:
        return "must be a list of rows of numbers, e.g. [[0.9,0.1],[0.2,0.8]]" + (", or null" if optional else "")
    if "List[float]" in text:
        return "must be a list of numbers, e.g. [0.4,0.3,0.2,0.1]"
    if "List[int]" in text:
        return "must be a list of integers"
    if "List[str]" in text:
        return "must be a list of strings"
    return one_line(e)


def option_class(group: str, d: Any, key: str) -> type:
    """The schema of the option a group's dict names (`name`), or a one-line ConfigError."""
    name = d.get("name", _DEFAULTS[group]) if isinstance(d, dict) else None
    if name not in OPTIONS[group]:
        raise ConfigError(f"{key}.name" if key else "name", name, f"unknown option; allowed: {', '.join(OPTIONS[group])}")
    return OPTIONS[group][name]


_DEFAULTS = {"data": "random_walk", "model": "transformer", "init": "zero", "optim": "gd"}  # RunConfig()'s


def allowed(cls) -> str:
    return ", ".join(_names(cls))


def describe_unknown(cls, prefix: str, key: str | None = None) -> str:
    group = prefix.rstrip(".")
    if group in GROUPS:
        text = f"unknown key for {group}={cls.__dataclass_fields__['name'].default}; allowed: {allowed(cls)}"
        owners = [n for n, c in OPTIONS[group].items() if key in c.__dataclass_fields__] if key else []
        if owners:
            text += f" ({group}.{key} is a key of {', '.join(f'{group}={n}' for n in owners)})"
        if group == "init" and key == "sigma":  # the paper's grid, written as one σ axis
            text += "; to sweep σ with zero init, write init=gaussian init.sigma=0,… (σ = 0 is zero init)"
        return text
    return f"unknown key; allowed: {allowed(cls)}"


def _build(cls, d: Any, prefix: str, complete: bool):
    if not isinstance(d, dict):
        raise ConfigError(prefix.rstrip(".") or "<root>", d, "must be a mapping")
    fields = _fields(cls)
    names = {name for name, _ in fields}
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ConfigError(prefix + unknown[0], d[unknown[0]], describe_unknown(cls, prefix, unknown[0]))
    kwargs = {}
    for name, group in fields:
        if name not in d:
            if complete:  # deleted with `~key`, which the engine cannot do without
                raise ConfigError(prefix + name, "<deleted>", "is required by the schema and cannot be removed")
            continue
        if group in GROUPS:
            kwargs[name] = _build(option_class(group, d[name], prefix + name), d[name], prefix + name + ".", complete)
        elif group == "wandb":
            kwargs[name] = _build(WandbConfig, d[name], prefix + name + ".", complete)
        else:
            kwargs[name] = typed(cls, name, d[name], prefix + name)
    return cls(**kwargs)


# Before each option had its own schema, one flat schema per group gave every run every option's keys, at
# these defaults: a run folder of that time holds them. They are dropped where the run's option has no such
# key and the value is that default (a value that differs was never a default, and is refused).
LEGACY_DEFAULTS = {
    "data": {"p": 0.5, "q": 0.5, "stay": 0.0, "Pi": None, "Pi_file": None, "jumps": None, "graph": "cycle",
             "degree": 3, "side": 3, "dim": 3, "order": 1, "alpha": 1.0},
    "model": {"m": None, "ffn": "after"},
    "init": {"sigma": 0.0, "draw": "compact"},
    "optim": {"beta1": 0.9, "beta2": 0.999, "adam_eps": 1e-8},
}


def _default(f: dataclasses.Field):
    """A field's schema default (its value or its factory's), or `dataclasses.MISSING` where it has none."""
    if f.default is not dataclasses.MISSING and f.default is not MISSING:
        return copy.deepcopy(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _filled(node: dict, cls) -> dict:
    """`node` with every field of `cls` it lacks at that field's schema default."""
    missing = [f for f in dataclasses.fields(cls) if f.name not in node]
    if not missing:
        return node
    out = dict(node)
    for f in missing:
        value = _default(f)
        if value is not dataclasses.MISSING:
            out[f.name] = _as_dict(value) if dataclasses.is_dataclass(value) else value
    return out


def canonical(d: dict) -> dict:
    """A config dict as the current schemas state it (a copy; anything else is left for `from_dict` to judge):

    - a key the dict lacks reads at its schema default, for every key of every option (`_filled`): a
      config.yaml written before a key existed was trained as that key's default says. This is the rule every
      new key must keep — its default is the behaviour before it (tests/test_versions.py holds run folders
      of older versions to it);
    - the legacy keys of `LEGACY_DEFAULTS` are dropped where the run's option has no such key and the value is
      that default (a value that differs was never a default, and is refused).
    """
    out = _filled(d, RunConfig)
    for group in GROUPS:
        node = out.get(group)
        if not isinstance(node, dict) or node.get("name", _DEFAULTS[group]) not in OPTIONS[group]:
            continue
        cls = OPTIONS[group][node.get("name", _DEFAULTS[group])]
        own = cls.__dataclass_fields__
        legacy = LEGACY_DEFAULTS.get(group, {})
        node = {k: v for k, v in node.items() if k in own or k not in legacy or v != legacy[k]}
        out[group] = _filled(node, cls)
    if isinstance(out.get("wandb"), dict):
        out["wandb"] = _filled(out["wandb"], WandbConfig)
    return out


def stored(d: dict) -> RunConfig:
    """A run folder's config.yaml → a validated RunConfig, judged from what it records alone: no file it names
    is opened (a family's `FILES` keys, such as `data.Pi_file`, are set aside: the recorded matrix serves), so
    a planted config cannot make its reader hang on a FIFO or read /dev/zero."""
    d = canonical({k: v for k, v in d.items() if k != "hydra"})
    data = d.get("data")
    if isinstance(data, dict) and data.get("name") in OPTIONS["data"]:
        files = getattr(OPTIONS["data"][data["name"]], "FILES", ())
        if any(data.get(k) is not None for k in files):
            d = {**d, "data": {**data, **{k: None for k in files}}}
    return validate(_build(RunConfig, d, "", False))


def from_dict(d: dict, complete: bool = False) -> RunConfig:
    """A composed (resolved) config dict, or a run folder's config.yaml → a validated RunConfig. Hydra's own
    `hydra` node is ignored. `complete`: the dict was composed against the schema, so every key must be there."""
    d = {k: v for k, v in d.items() if k != "hydra"}
    return validate(_build(RunConfig, d if complete else canonical(d), "", complete))


def convert(task: dict, dotted: str, value: Any) -> Any:
    """A command-line value for `dotted` in a composed task dict, as OmegaConf converts it for that key's
    schema (`data.p=0` → 0.0), or a one-line ConfigError (an unknown key, a value of the wrong type)."""
    *parents, leaf = dotted.split(".")
    cls, node = RunConfig, task
    for i, part in enumerate(parents):
        group = dict(_fields(cls)).get(part, False) if cls is RunConfig else None
        if not isinstance(node, dict) or part not in node or group is False:
            raise ConfigError(".".join(parents[: i + 1]), value, "unknown key")
        node = node[part]
        cls = option_class(group, node, part) if group in GROUPS else WandbConfig if group == "wandb" else None
        if cls is None:
            raise ConfigError(dotted, value, "unknown key")
    if not isinstance(node, dict) or leaf not in node:
        raise ConfigError(dotted, value, describe_unknown(cls, ".".join(parents) + "." if parents else "", leaf))
    if dict(_fields(cls)).get(leaf):  # a whole group or wandb node given a value
        raise ConfigError(dotted, value, "is a group; set its keys (or choose an option)")
    return typed(cls, leaf, value, dotted)


# ------------------------------------------------------------------------------------------ validation
def validate(c: RunConfig) -> RunConfig:
    """Every rule the engine relies on that OmegaConf cannot state, each failing with the dotted key, the
    value and what is allowed. The model's own rules are its schema's (`ModelBase.validate`)."""
    d, mo, i, o = c.data, c.model, c.init, c.optim
    check_rules(o, "optim.")  # the optimiser's rules live on its fields
    check_rules(i, "init.")  # and the init's on its
    _check_seed(c.seed)
    choice("precision", c.precision, ("float64", "float32"))
    if not (c.device in ("auto", "cpu", "cuda") or (c.device.startswith("cuda:") and c.device[5:].isascii() and c.device[5:].isdigit())):
        raise ConfigError("device", c.device, "must be auto, cpu, cuda or cuda:N")
    choice("wandb.mode", c.wandb.mode, ("offline", "online", "disabled"))
    choice("wandb.granularity", c.wandb.granularity, ("auto", "run", "job"))
    if d.N < 2:
        raise ConfigError("data.N", d.N, "must be >= 2")
    choice("data.target", d.target, ("last", "all"))
    d.validate(c.seed)
    for key, val in (("data.n_train", d.n_train), ("data.n_test", d.n_test), ("data.batch", d.batch),
                     ("eval_every", c.eval_every)):
        if val < 1:
            raise ConfigError(key, val, "must be >= 1")
    if c.checkpoint_every < 0:
        raise ConfigError("checkpoint_every", c.checkpoint_every, "must be >= 0 (0 disables checkpoints)")
    mo.validate(c)
    i.validate(c)
    i.implementation(mo.ENGINE, mo.name)  # refused here, before anything is written, where it cannot serve
    o.validate(c)
    o.implementation(mo.ENGINE, mo.name)  # refused here, before anything is written, where it cannot serve
    from .metrics import OBJECTIVES

    if c.objective is not None and c.objective not in OBJECTIVES:
        raise ConfigError("objective", c.objective, f"must be null or a numeric summary field: {', '.join(OBJECTIVES)}")
    for s in c.snapshot_steps:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError("snapshot_steps", c.snapshot_steps, "must be a list of integers >= 0")
    return c


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "must be an integer")
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError("seed", seed, f"must be in [0, {SEED_MAX}] (2³² − 1)")


def with_seed(cfg: RunConfig, seed: int) -> RunConfig:
    """A validated config with another seed, validated as `validate` would: the seed's own rule, and the data
    family's rules again where they depend on the seed (`DataConfig.SEEDED`: a graph drawn from it)."""
    _check_seed(seed)
    out = copy.copy(cfg)  # the same option objects (never changed in place), another seed
    out.seed = seed
    if type(cfg.data).SEEDED:
        out.data.validate(seed)
    return out


def wandb_group(folder: str) -> str:
    """A run's wandb group when `wandb.group` is null: its sweep (or single run) folder, as the last two parts
    of the path (`multirun/2026-12-01/10-00-00` → `2026-12-01/10-00-00`)."""
    from pathlib import Path

    return "/".join(Path(str(folder)).parts[-2:])


def register() -> None:
    """RunConfig as Hydra's schema for `conf/config.yaml` (`defaults: [/schema/run@_here_, ...]`): each group
    typed by its base schema, so that any option's schema merges into it. Stored as `schema/run`, beside the
    options' schemas, not as a root config (a primary config or choice of its own)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    node = OmegaConf.structured(RunConfig)
    node.data = OmegaConf.structured(DataConfig)
    node.model = OmegaConf.structured(ModelBase)
    node.init = OmegaConf.structured(InitConfig)
    node.optim = OmegaConf.structured(OptimConfig)
    ConfigStore.instance().store(group="schema", name="run", node=node, provider="rw_sweeps")


from . import families  # noqa: E402,F401 - every data family declares itself (`@option("data")`)
from . import optimisers  # noqa: E402,F401 - every optimiser declares itself (`@option("optim")`)
from . import inits  # noqa: E402,F401 - every init declares itself (`@option("init")`)
from .gpt import schema as _gpt_schema  # noqa: E402,F401 - model=gpt declares itself (`@option("model")`)

register()
