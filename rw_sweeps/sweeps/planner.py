"""From Hydra job overrides to job specs, fast, before any job starts.

A job spec (`Spec`) holds everything Hydra would know about one job of a sweep, as plain data: its number,
its overrides, its composed task config, its `hydra` node and its output folder. The packed launcher
builds one per run and hands it to `rw_sweeps.sweeps.hydra_job`, which does for it what Hydra's `run_job` does.

Hydra composes one job's config in ~85 ms; a 1,000-run grid would spend minutes there. Runs of a grid
differ almost always in plain values (data.p, seed, init.sigma…), not in config-group choices, so we
compose once per distinct combination of group choices (and `hydra.*` overrides) and apply the value
overrides to the composed dict in pure Python (microseconds). Anything unusual (`+`/`~` overrides,
interpolations) falls back to Hydra's own composition for that job, so the result is always what Hydra
would have built.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from hydra.types import RunMode

from rw_sweeps.core import env_vars
from rw_sweeps.core.config import ConfigError, RunConfig, convert, from_dict, shape_key, with_seed
from rw_sweeps.core.registry import GROUPS
from rw_sweeps.core.contract import too_large

from .hydra_adapter import split_arguments
from .hydra_errors import one_line_errors


@dataclass
class Spec:
    """One Hydra job, as plain data (cheap to build, copy and pickle).

    Jobs composed from one set of group choices share their composition's dicts (`base_task`,
    `base_hydra`, never mutated, pickled once per chunk) and hold only what differs (`*_changes`: dotted
    key → value); `task` and `hydra` are the job's own, built from them when asked, so that a grid of
    100,000 jobs holds 100,000 small dicts of changes, not 100,000 configs.
    """
    num: int
    overrides: list[str]
    own_task: dict | None  # a job Hydra composed itself: its task config, unresolved; else None (`task`)
    own_resolved: dict | None  # the same, resolved (what the task function sees); else None (`resolved`)
    base_hydra: dict = field(repr=False, default_factory=dict)  # the composition's `hydra` node
    hydra_changes: dict = field(default_factory=dict)  # this job's own: overrides, job.num/id, output_dir…
    base_task: dict | None = field(repr=False, default=None)  # the composition's task config (None: `task`)
    task_changes: dict = field(default_factory=dict)  # this job's value overrides
    output_dir: str = ""  # absolute
    sweep_dir: str = ""  # absolute, resolved (`${now:…}` and all): the sweep's folder, its wandb group
    cfg: RunConfig | None = None  # validated, for the project's own task
    template: Any = field(default=None, repr=False)  # key of the composed DictConfig it came from
    placed: dict | bool | None = None  # by the launcher (`rw_sweeps.sweeps.placement`): None not yet, False to train,
    # or the summary of the finished run its folder holds (read once per launch, passed on)
    shape: tuple | None = None  # config.shape_key(cfg), computed once per composition and value set
    checked_in: int | None = None  # the process whose resource check found it can run (the rw sweeper's)
    placed_in: int | None = None  # the process whose placement found it not done (a requeued job asks again)
    varies: list = field(default_factory=list)  # its overrides of the keys the sweep varies (`varying`)
    env: tuple | None = None  # hydra.job.env_set as the job's environment gets it, where it interpolates:
    # resolved against this job's `hydra` node alone, as Hydra's run_job does (None: its values as written)

    @property
    def tag(self) -> str:
        """Its values of the keys the sweep varies (`data.p=0.5 seed=1`): what its console line ends with."""
        return " ".join(self.varies)

    @property
    def task(self) -> dict:
        """The composed task config, unresolved (what `.hydra/config.yaml` holds)."""
        return self.own_task if self.own_task is not None else with_changes(self.base_task, self.task_changes)

    @property
    def resolved(self) -> dict:
        """The task config, resolved (what the task function sees)."""
        return self.own_resolved if self.own_resolved is not None else self.task

    @cached_property
    def hydra(self) -> dict:
        """The job's `hydra` node, unresolved but for job.num/id and runtime.output_dir."""
        out = _copy(self.base_hydra)
        for key, value in self.hydra_changes.items():
            set_key(out, key, value)
        return out

    @property
    def name(self) -> str:
        return str(self.base_hydra["job"]["name"])

    def set_hydra(self, key: str, value: Any) -> None:
        self.hydra_changes[key] = value
        self.__dict__.pop("hydra", None)

    def relocate(self, num: int, output_dir: str) -> None:
        """This job lives in another folder of its sweep (`rw_sweeps.sweeps.placement`): its number and folder."""
        self.num, self.output_dir = num, output_dir
        self.set_hydra("job.num", num)
        self.set_hydra("job.id", str(num))
        self.set_hydra("runtime.output_dir", output_dir)


_INT_CHANGE = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)=(0|-?[1-9][0-9]*)")


def quick_override(line: str, loader=None) -> Override | None:
    """`key=<decimal integer>` (a grid's `seed=17`) as the Override Hydra's grammar makes of it, without the
    ANTLR parser (~0.5 ms a string, once per run of a seed axis); None for anything else, which Hydra
    parses. tests/test_hydra_citizen.py holds it equal to Hydra's own parse."""
    m = _INT_CHANGE.fullmatch(line)
    if m is None:
        return None
    return Override(type=OverrideType.CHANGE, key_or_group=m.group(1), value_type=ValueType.ELEMENT,
                    _value=int(m.group(2)), package=None, input_line=line, config_loader=loader)


def has_interpolation(node: Any) -> bool:
    """Does this node of a config (plain dicts, lists and values) hold a `${…}` anywhere?"""
    if isinstance(node, dict):
        return any(has_interpolation(v) for v in node.values())
    if isinstance(node, list):
        return any(has_interpolation(v) for v in node)
    return isinstance(node, str) and "${" in node


def with_changes(base: dict, changes: dict) -> dict:
    """A copy of `base` with the dotted keys of `changes` set (only the dicts along each path are copied)."""
    out = base
    for dotted, value in changes.items():
        out = replaced(out, dotted.split("."), value)
    return out if changes else _copy(base)


def replaced(node: dict, path: list, value: Any) -> dict:
    """A copy of the dict with the value at `path` replaced (the dicts along the path are copied)."""
    if path[0] not in node:
        raise KeyError(".".join(path))
    out = dict(node)
    out[path[0]] = replaced(node[path[0]], path[1:], value) if len(path) > 1 else value
    return out


def set_key(d: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = d
    for i, k in enumerate(parents):
        if not isinstance(node, dict) or k not in node:
            raise ConfigError(".".join(parents[: i + 1]), value, "unknown key")
        node = node[k]
    if not isinstance(node, dict) or leaf not in node:
        allowed = ", ".join(node) if isinstance(node, dict) else "none"
        raise ConfigError(dotted, value, f"unknown key; allowed here: {allowed}")
    node[leaf] = value


def _copy(node: Any) -> Any:
    """deepcopy for plain YAML data, ~10× faster."""
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def _readable(cfg: RunConfig) -> None:
    """Every file the run would write fits its readers' caps (`contract.too_large`), else its one-line refusal:
    checked for every job, whatever launcher runs it, before any folder is made."""
    problem = too_large(cfg)
    if problem is not None:
        raise problem


@dataclass(frozen=True)
class OverrideDirname:
    """hydra.job.override_dirname, exactly as Hydra's config loader computes it: the job's override lines but
    the excluded keys, sorted, joined by item_sep, each `=` written as kv_sep. Called with a grid job's seed
    line, which the lines it was made from leave out (the seed axis shares one `Kind`)."""
    kept: tuple
    seed_excluded: bool
    item_sep: str
    kv_sep: str

    @classmethod
    def of(cls, parsed: Sequence[Override], hydra: dict) -> "OverrideDirname":
        conf = hydra["job"]["config"]["override_dirname"]
        excluded = set(conf.get("exclude_keys") or [])
        kept = tuple(sorted(o.input_line for o in parsed if o.key_or_group not in excluded))
        return cls(kept, "seed" in excluded, str(conf["item_sep"]), str(conf["kv_sep"]))

    def __call__(self, seed_line: str | None = None) -> str:
        lines = self.kept if seed_line is None or self.seed_excluded else sorted([*self.kept, seed_line])
        return self.item_sep.join(lines).replace("=", self.kv_sep)


class Kind(NamedTuple):
    """What a job's overrides but its integer seed make of it (`Planner._kind`), shared by a seed axis. `base`
    is None where Hydra must compose the job itself; the fields after `values` are then None too."""
    key: tuple  # the overrides that choose its composition (a template's key)
    base: Optional[dict]  # its task dict, as composed
    hydra: dict  # its hydra node
    values: list  # the value overrides (Override objects)
    conv: Optional[dict] = None  # override line → its value converted for its key's schema
    cfg: Optional[RunConfig] = None  # the validated config
    shape: Optional[tuple] = None  # its shape (`config.shape_key`)
    dirname: Optional[OverrideDirname] = None  # its override_dirname, given a seed line


class Planner:
    """Specs for job override lists, composing once per distinct set of group choices."""

    def __init__(self, config_loader, primary: DictConfig):
        self.loader, self.primary = config_loader, primary
        self.parser = OverridesParser.create(config_loader=config_loader)
        self._templates: dict[tuple, tuple[DictConfig, dict | None, dict]] = {}
        self._parsed: dict[str, Override] = {}  # grids repeat their override strings: parse each once
        self._group_keys: dict[str, bool] = {}
        self._kinds: dict[tuple, Kind] = {}  # a job's overrides but its seed → what they make of it (`_kind`)
        self._env_sets: dict[int, tuple] = {}  # id of an env_set → (it, whether it interpolates)
        self._env_cfgs: dict[tuple, DictConfig] = {}  # a composition → its copy that resolves its jobs' env_sets
        self._varied: set = set()  # the keys any batch planned so far varies (`plan`)
        sweep = primary.hydra.sweep
        self.sweep_dir = os.path.abspath(str(sweep.dir))
        self.subdir = OmegaConf.to_container(sweep, resolve=False)["subdir"]

    def __getstate__(self) -> dict:  # the parser holds ANTLR state; it is rebuilt where it is unpickled
        return {k: v for k, v in self.__dict__.items() if k != "parser"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.parser = OverridesParser.create(config_loader=self.loader)

    def _is_template_key(self, o: Override) -> bool:
        key = o.key_or_group
        if key not in self._group_keys:  # a grid repeats its keys: ask the repository once per key
            self._group_keys[key] = key.startswith("hydra") or ("." not in key and self.loader.repository.group_exists(key))
        return self._group_keys[key]

    def compose(self, overrides: list[str], num: int) -> DictConfig:
        """Hydra's own composition of one job (as its launchers do it), with hydra.job.num and id set."""
        cfg = self.loader.load_sweep_config(self.primary, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num, cfg.hydra.job.id = num, str(num)
        return cfg

    def _template(self, key: tuple, overrides: list[str], num: int):
        if key not in self._templates:
            cfg = self.compose(overrides, num)
            full = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
            hydra = full.pop("hydra")
            self._templates[key] = (cfg, None if has_interpolation(full) else full, hydra)
        return self._templates[key]

    def _interpolates(self, env_set) -> bool:
        """Does this env_set (a composition's, shared by its jobs) interpolate? Asked once per composition."""
        hit = self._env_sets.get(id(env_set))
        if hit is None or hit[0] is not env_set:
            if len(self._env_sets) > 4096:  # jobs Hydra composed itself each have their own: kept bounded
                self._env_sets.clear()
            hit = self._env_sets[id(env_set)] = (env_set, has_interpolation(env_set))
        return hit[1]

    def _parse(self, overrides: list[str]) -> list[Override]:
        new = [s for s in overrides if s not in self._parsed]
        if new:
            quick = {s: o for s in new if (o := quick_override(s, self.loader)) is not None}
            self._parsed.update(quick)
            rest = [s for s in new if s not in quick]
            if rest:
                self._parsed.update(zip(rest, self.parser.parse_overrides(rest)))
        return [self._parsed[s] for s in overrides]

    def spec(self, overrides: Sequence[str], num: int) -> Spec:
        overrides = list(overrides)
        # A grid repeats every override but those of its swept keys. What a job's overrides other than an
        # integer seed make of it (its composition, its converted values, its validated config and shape) is
        # worked out once per distinct set of them; a seed axis then costs a copy of the config per job.
        seed_line = next((s for s in overrides if s.startswith("seed=")), None)
        seed = _INT_CHANGE.fullmatch(seed_line) if seed_line is not None else None
        sig = tuple(s for s in overrides if s is not seed_line) if seed else tuple(overrides)
        if sig not in self._kinds:
            if len(self._kinds) > 4096:  # a grid of many distinct values: no cache grows without bound
                self._kinds.clear()
            self._kinds[sig] = self._kind([s for s in overrides if s is not seed_line] if seed else overrides, num)
        kind = self._kinds[sig]
        if kind.base is not None:
            changes = {o.key_or_group: kind.conv[o.input_line] for o in kind.values}
            if seed:
                changes["seed"] = convert(kind.base, "seed", int(seed.group(2)))
            spec = Spec(num, overrides, None, None, kind.hydra, {
                "overrides.task": overrides, "job.override_dirname": kind.dirname(seed_line if seed else None),
                "job.num": num, "job.id": str(num)}, kind.base, changes, template=kind.key)
            spec.cfg = with_seed(kind.cfg, changes["seed"]) if seed else copy.copy(kind.cfg)
            spec.shape = kind.shape
        else:  # Hydra composes this job itself; `${hydra:...}` resolves against its own node
            template = self.compose(overrides, num)
            HydraConfig.instance().set_config(template)
            full = OmegaConf.to_container(template, resolve=False, enum_to_str=True)
            hydra = full.pop("hydra")
            task_keys = [k for k in template if k != "hydra"]
            resolved = OmegaConf.to_container(OmegaConf.masked_copy(template, task_keys), resolve=True)
            spec = Spec(num, overrides, full, resolved, hydra, template=template)
            spec.cfg = from_dict(spec.resolved, complete=True)
            _readable(spec.cfg)
            spec.shape = shape_key(spec.cfg)
        spec.output_dir = self.output_dir(spec)
        spec.sweep_dir = self.sweep_dir
        spec.set_hydra("runtime.output_dir", spec.output_dir)
        if self._interpolates((spec.base_hydra.get("job") or {}).get("env_set")):
            spec.env = self._job_env(spec)
            env_vars.check({**os.environ, **dict(spec.env)})  # before any job: the front door saw `${…}`
        return spec

    def _job_env(self, spec: Spec) -> tuple:
        """The job's hydra.job.env_set as Hydra's run_job gives it to the job: its composition with the job's own
        hydra values (num, id, output_dir, …) set, then env_set resolved against the `hydra` node alone
        (HydraConfig's copy), so `${hydra:job.num}` and `${oc.env:…}` resolve and a task key such as `${seed}`
        does not (Hydra's job fails on it; here it is one line before any job). Sorted (name, value) pairs."""
        if isinstance(spec.template, DictConfig):
            cfg = spec.template  # the job's own composition
        else:  # its composition's, copied once: the jobs' values are set on it in turn
            if spec.template not in self._env_cfgs:
                self._env_cfgs[spec.template] = copy.deepcopy(self._templates[spec.template][0])
            cfg = self._env_cfgs[spec.template]
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            for key, value in spec.hydra_changes.items():
                OmegaConf.update(cfg.hydra, key, value, merge=False, force_add=True)
        HydraConfig.instance().set_config(cfg)
        raw = spec.hydra["job"]["env_set"]
        try:
            # run_job's own copy: its hydra node's parent is then a root holding that node alone
            env = OmegaConf.to_container(copy.deepcopy(HydraConfig.instance().cfg).hydra.job.env_set, resolve=True)
        except Exception as e:  # noqa: BLE001 - OmegaConf's resolution errors: one line naming the key
            key = next((k for k in raw if has_interpolation(raw[k])), next(iter(raw)))
            raise ConfigError(f"hydra.job.env_set.{key}", raw[key],
                              "cannot be resolved: Hydra resolves env_set against the job's hydra node alone "
                              f"(${{hydra:job.num}} is there, a task key is not): {' '.join(str(e).split())[:160]}") from None
        return tuple(sorted((str(k), str(v)) for k, v in env.items()))

    def _kind(self, overrides: list[str], num: int) -> Kind:
        """What these overrides (a job's, but its integer seed) make of a job (`Kind`), its base None where
        Hydra must compose the job itself (`+`/`~` overrides, sweeps inside a job, interpolations)."""
        parsed = self._parse(overrides)
        is_template = [self._is_template_key(o) for o in parsed]
        key = tuple(s for s, t in zip(overrides, is_template) if t)
        values = [o for o, t in zip(parsed, is_template) if not t]
        simple = all(o.type == OverrideType.CHANGE and not o.is_sweep_override() for o in values)
        _, base, hydra = self._template(key, overrides, num)
        if not simple or base is None:
            return Kind(key, None, hydra, values)
        conv = {o.input_line: convert(base, o.key_or_group, o.value()) for o in values}
        cfg = from_dict(with_changes(base, {o.key_or_group: conv[o.input_line] for o in values}), complete=True)
        _readable(cfg)
        return Kind(key, base, hydra, values, conv, cfg, shape_key(cfg), OverrideDirname.of(parsed, hydra))

    def output_dir(self, spec: Spec) -> str:
        if self.subdir == "${hydra.job.num}":  # the default, without building a config
            return os.path.join(self.sweep_dir, str(spec.num))
        node = OmegaConf.create({**spec.task, "hydra": {**spec.hydra, "sweep": {"subdir": self.subdir}}})
        return os.path.join(self.sweep_dir, str(node.hydra.sweep.subdir))

    def config(self, spec: Spec) -> DictConfig:
        """The job's full DictConfig, as Hydra's launcher would hand it to run_job (built only when a user
        can observe it: for callbacks; ~10 ms)."""
        if not isinstance(spec.template, tuple):
            cfg = spec.template
        else:
            cfg = copy.deepcopy(self._templates[spec.template][0])
            with open_dict(cfg):
                for k, v in spec.task_changes.items():
                    OmegaConf.update(cfg, k, v, merge=False)
        with open_dict(cfg):
            for k, v in spec.hydra_changes.items():
                OmegaConf.update(cfg, "hydra." + k, v, merge=False)
        return cfg

    def plan(self, jobs: Sequence[Sequence[str]], initial_job_idx: int = 0) -> list[Spec]:
        """Validate every job; the first bad value raises ConfigError (one line) before anything runs."""
        out = []
        for i, overrides in enumerate(jobs):
            with one_line_errors():
                out.append(self.spec(overrides, initial_job_idx + i))
        # a sweeper asking in batches (Optuna, the adaptive rounds): a key that varied in an earlier batch, or
        # that the sweep searches (`hydra.sweeper.params`), names every later run too, one batch of one alike
        self._varied |= {o.partition("=")[0] for v in varying(jobs) for o in v} | self._searched()
        for s, varies in zip(out, varying(jobs, self._varied)):
            s.varies = varies
        return out

    def _searched(self) -> set:
        """The keys `hydra.sweeper.params` sweeps (a range, a choice, an interval: more than one value)."""
        params = OmegaConf.select(self.primary, "hydra.sweeper.params", default=None) or {}
        return {k for k, v in params.items()
                if self.parser.parse_override(f"{k}={v}").is_sweep_override()}


def varying(jobs: Sequence[Sequence[str]], also: set = frozenset()) -> list[list[str]]:
    """Per job, its overrides of the keys whose values differ between the jobs (what tells its runs apart),
    and of the keys in `also` (keys the sweep varies beyond these jobs)."""
    values: dict = {}  # key → the values the jobs give it
    count: dict = {}  # key → how many jobs give it one (fewer than all: it varies too)
    for overrides in jobs:
        for key in {o.partition("=")[0] for o in overrides}:
            count[key] = count.get(key, 0) + 1
        for o in overrides:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    keys = {k for k, v in values.items() if len(v) > 1 or count[k] < len(jobs)} | set(also)
    return [[o for o in overrides if o.partition("=")[0] in keys] for overrides in jobs]


# ------------------------------------------------------------------------------------------ the one entry
def no_group_deleted(overrides: Sequence[str]) -> None:
    """`~data` would drop the group's YAML and train on the schema's defaults without a word: refuse it."""
    for o in overrides:
        name = o[1:].split("=")[0] if o.startswith("~") else None
        if name in GROUPS:
            raise ConfigError(name, "<deleted>", "is a required config group and cannot be removed; choose an "
                              f"option instead ({name}=...)")


def packaged_conf() -> str:
    """The folder of the configs packaged beside the code (`conf/`, installed as `rw_sweeps_conf`): where
    the package is found; it is not imported (it holds only the YAML files)."""
    spec = importlib.util.find_spec("rw_sweeps_conf")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("No module named 'rw_sweeps_conf'", name="rw_sweeps_conf")
    return os.path.dirname(os.path.abspath(spec.origin))


def plan_overrides(overrides: Sequence[str], conf_dir: str | None = None) -> list[Spec]:
    """The validated specs of `python launch.py -m <overrides>`, without launching anything: conf/ composed
    with Hydra, the experiment's `hydra.sweeper.params` first and then the overrides, expanded as the rw
    sweeper expands them, each job planned by `Planner`. What the theory CLI and the tests plan with; a bad
    value raises ConfigError (one line)."""
    overrides = [o for o in overrides if o not in ("-m", "--multirun")]  # comma lists always expand here
    GlobalHydra.instance().clear()
    try:
        with one_line_errors():
            no_group_deleted(overrides)
            with initialize_config_dir(config_dir=conf_dir or packaged_conf(), version_base="1.3", job_name="plan"):
                loader = GlobalHydra.instance().config_loader()
                primary = loader.load_configuration("config", overrides=list(overrides), run_mode=RunMode.MULTIRUN)
                params = OmegaConf.select(primary, "hydra.sweeper.params") or {}
                args = [f"{k}={v}" for k, v in params.items()] + list(overrides)
                parser = OverridesParser.create(config_loader=loader)
                jobs = [j for b in split_arguments(parser.parse_overrides(args), None) for j in b]
                return Planner(loader, primary).plan(jobs)
    finally:
        GlobalHydra.instance().clear()
