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
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

# every option of every group declares itself when its package is imported (`@option(group)`)
from . import families, inits, optimisers  # noqa: F401
from .errors import ConfigError, did_you_mean
from .families.base import DataConfig
from .gpt import schema as gpt_schema  # noqa: F401
from .inits.base import InitConfig
from .metrics import OBJECTIVES
from .models import ModelBase
from .optimisers.base import OptimConfig
from .registry import GROUPS, OPTIONS, SEED_MAX, as_dict, check_rules, choice, frozen, names, rule, typed

DEFAULT_SNAPSHOTS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 400, 700, 1000]

# ------------------------------------------------------------------------------------------ the run
def _env(name: str, default: Any) -> Any:
    """wandb's own environment variable as a default: an explicit `wandb.*` key overrides it, and the run's
    config.yaml records what was used. WANDB_TAGS is comma-separated; WANDB_MODE's legacy `dryrun` is
    offline and `run` is online, as wandb reads them."""
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
    name: Optional[str] = None  # the run's name; null: its values of the keys its sweep varies (optim.lr=0.1 seed=1)
    tags: List[str] = field(default_factory=lambda: _env("WANDB_TAGS", []))  # the experiment is added
    granularity: str = "auto"  # run: a wandb run per training run | job: one per packed job | auto
    per_run_limit: int = field(default=32, metadata=rule(lo=0))  # auto: per-run wandb runs (logged live) for batches up to this size
    analysis: bool = True  # a finished sweep logs its report's figures and runs table (one job_type=analysis run)


def _default_data() -> DataConfig:
    return OPTIONS["data"]["random_walk"]()


@dataclass
class RunConfig:
    seed: int = 0  # seeds the data (train then test) and, on its own stream, the initial parameters
    # auto: the model's own (`PRECISION`: float64 for eq. 2.1's models, float32 for model=gpt), recorded as
    # resolved | float64 | float32
    precision: str = "auto"
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
        if self.precision == "auto":  # the model's own, resolved once like model.normalize: what was trained
            self.precision = type(self.model).PRECISION

    def to_dict(self) -> dict:
        """The config as plain data (what config.yaml holds): `dataclasses.asdict`'s result, ~5× faster."""
        return as_dict(self)

    @property
    def opt_acc(self) -> float | None:
        """The Bayes-optimal test accuracy where it has a closed form (OPT = max(p, 1 − p) on the circle, 1 for
        the QA tasks); None for the other chains: the summary measures it on the test set (`training.train`)."""
        return self.data.opt_acc


def option_config(group: str, name: Optional[str] = None, **keys: Any):
    """The schema of option `name` of `group` (RunConfig()'s by default), with these keys
    (`option_config("optim", "adam", lr=0.01)`)."""
    return OPTIONS[group][name or _DEFAULTS[group]](**keys)


def data_config(name: str = "random_walk", **keys: Any) -> DataConfig:
    """The schema of the data family `name`, with these keys (`data_config("binary_chain", p=0.3)`)."""
    return option_config("data", name, **keys)


# ------------------------------------------------------------------------------------------ derived keys
@functools.lru_cache(maxsize=None)
def _shape_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.PER_RUN)


def shape_key(cfg: RunConfig) -> tuple:
    """Runs with equal keys can share one tensor program: every field of the schema but those declared per
    run (`PER_RUN`), with each option's class."""
    out = [getattr(cfg, k) for k in _shape_fields(RunConfig) if k not in GROUPS]
    for g in (g for g in GROUPS if g not in RunConfig.PER_RUN):
        opt = getattr(cfg, g)
        out.append((type(opt).__name__, *(frozen(getattr(opt, k)) for k in _shape_fields(type(opt)))))
    return tuple(frozen(x) for x in out)


# ------------------------------------------------------------------------------------------ building
@functools.lru_cache(maxsize=None)
def _fields(cls) -> tuple[tuple[str, Any], ...]:
    """(name, the group it is, or None) of each field of a class."""
    return tuple((f.name, f.name if cls is RunConfig and f.name in GROUPS else
                  "wandb" if cls is RunConfig and f.name == "wandb" else None) for f in dataclasses.fields(cls))


def option_class(group: str, d: Any, key: str) -> type:
    """The schema of the option a group's dict names (`name`), or a one-line ConfigError."""
    name = d.get("name", _DEFAULTS[group]) if isinstance(d, dict) else None
    if name not in OPTIONS[group]:
        raise ConfigError(f"{key}.name" if key else "name", name, f"unknown option; allowed: {', '.join(OPTIONS[group])}")
    return OPTIONS[group][name]


_DEFAULTS = {"data": "random_walk", "model": "transformer", "init": "zero", "optim": "gd"}  # RunConfig()'s


def allowed(cls) -> str:
    return ", ".join(names(cls))


def describe_unknown(cls, prefix: str, key: str | None = None, named: bool = False) -> str:
    """Why `prefix + key` is refused: the options that have it, else the key of `cls` closest to it (a typo);
    `named`: the message's key is not `key` itself (`daat.p=0.5` names `daat`), so the text names it."""
    group = prefix.rstrip(".")
    unknown = f"unknown key {prefix}{key}" if named and key else "unknown key"
    owners = [n for n, c in OPTIONS[group].items() if key in c.__dataclass_fields__] if key and group in GROUPS else []
    hint = did_you_mean(key, names(cls), prefix) if key and not owners else ""
    if group in GROUPS:
        text = f"{unknown} for {group}={cls.__dataclass_fields__['name'].default}{hint}; allowed: {allowed(cls)}"
        name = cls.__dataclass_fields__["name"].default
        if owners:
            text += f" ({group}.{key} is a key of {', '.join(f'{group}={n}' for n in owners)})"
        axis = cls().unit() if group == "init" else None  # an init that is the 0 of another's scale axis
        if axis is not None and type(axis) is not cls and key in axis.__dataclass_fields__:
            text += _as_axis_zero(group, key, name, cls, axis)
        return text
    return f"{unknown}{hint}; allowed: {allowed(cls)}"


def _as_axis_zero(group: str, key: str, name: str, cls, axis) -> str:
    """How to write `group=name` as the 0 of `axis`'s scale axis: the same θ(0), and the same model only where
    model.normalize=auto resolves alike under both (else it is named: a σ = 0 Gaussian run normalised whole
    stays at the symmetric point where the unnormalised zero init learns)."""
    where = "" if axis.AUTO_NORMALIZE == cls.AUTO_NORMALIZE else f" model.normalize={cls.AUTO_NORMALIZE}"
    same = (f"{group}.{key} = 0 is {group}={name}" if not where else
            f"{group}.{key} = 0 with{where} is {group}={name}; model.normalize=auto is {axis.AUTO_NORMALIZE} "
            f"under {group}={axis.name}")
    return f"; to sweep {group}.{key} with {group}={name}, write {group}={axis.name} {group}.{key}=0,…{where} ({same})"


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
            out[f.name] = as_dict(value) if dataclasses.is_dataclass(value) else value
    return out


def canonical(d: dict) -> dict:
    """A config dict as the current schemas state it (a copy; anything else is left for `from_dict` to judge):

    - a key the dict lacks reads at its schema default, for every key of every option (`_filled`): a
      config.yaml written before a key existed was trained as that key's default says. This is the rule every
      new key must keep — its default is the behaviour before it (tests/test_versions.py holds run folders
      of older versions to it);
    - `precision`, whose default became `auto` (the model's own) after every version had written it, reads as
      float64, what it was before;
    - the legacy keys of `LEGACY_DEFAULTS` are dropped where the run's option has no such key and the value is
      that default (a value that differs was never a default, and is refused).
    """
    # every version wrote `precision`; a dict without it predates `auto` (the model's own), when it was float64
    out = _filled({"precision": "float64", **d} if isinstance(d, dict) and "precision" not in d else d, RunConfig)
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
    for group in GROUPS:  # every option's key rules live on its fields
        check_rules(getattr(c, group), group + ".")
    check_rules(c.wandb, "wandb.")
    _check_seed(c.seed)
    choice("precision", c.precision, ("auto", "float64", "float32"))
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
    return "/".join(Path(str(folder)).parts[-2:])


def register() -> None:
    """RunConfig as Hydra's schema for `conf/config.yaml` (`defaults: [/schema/run@_here_, ...]`): each group
    typed by its base schema, so that any option's schema merges into it. Stored as `schema/run`, beside the
    options' schemas, not as a root config (a primary config or choice of its own)."""
    node = OmegaConf.structured(RunConfig)
    node.data = OmegaConf.structured(DataConfig)
    node.model = OmegaConf.structured(ModelBase)
    node.init = OmegaConf.structured(InitConfig)
    node.optim = OmegaConf.structured(OptimConfig)
    ConfigStore.instance().store(group="schema", name="run", node=node, provider="rw_sweeps")


register()
