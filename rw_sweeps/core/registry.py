"""The option registry and its typing: which options each group has (`OPTIONS`, filled by `@option`), what
registering checks (a key declared once, `check_shadowing`; methods that take their base's calls,
`check_signatures`; an implementation for each engine it names, `check_engines`), the rules a key declares
where it is declared (`rule`, `check_rules`), an option's implementation for an engine or a one-line refusal
(`implementation`), why a schema an option's YAML names is not registered (`unregistered`), and a value as
OmegaConf converts it for a schema's field (`typed`).

Every option module (`families/`, `models.py`, `inits/`, `optimisers/`, `gpt/schema.py`) builds on this
module and its group's base class alone; `rw_sweeps.core.config` puts them together into a run.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from .errors import ConfigError, one_line

GROUPS = ("data", "model", "init", "optim")
SEED_MAX = 2**32 - 1  # seeds are 0 … 2³²−1 (torch's generator uses 32 bits; the init stream: model.init_seed)

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
        try:
            check_shadowing(cls, f"{group}={name}")
            check_signatures(cls, f"{group}={name}")
            check = getattr(cls, "registered", None)
            if check is not None:  # the group's base class says what an option of it must provide
                check()
        except TypeError as e:
            raise Unregistrable(f"{e} ({_source(cls)})") from None
        OPTIONS[group][name] = cls
        _store(group, name, cls)
        return cls
    return declare


class Unregistrable(TypeError):
    """An option its group refuses as its module is imported, naming the module's file. A command that
    imports it (`launch.py`, `--help` included) ends in this one line, not a traceback (`_said_in_one_line`)."""


def _source(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls) or "?"
    except TypeError:  # a class made at run time (a test's throwaway option) has no file
        return f"class {cls.__qualname__}"
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _said_in_one_line(kind, exc, tb, _previous=sys.excepthook) -> None:
    if issubclass(kind, Unregistrable):
        print(f"error: {exc}", file=sys.stderr)
    else:
        _previous(kind, exc, tb)


sys.excepthook = _said_in_one_line


def _store(group: str, name: str, cls: type) -> None:
    """The schema as `schema/<group>/<name>` in Hydra's ConfigStore, outside the option group, so it is never a
    choice of `<group>` (`glob(*)`, `--help`, shell completion, "Available options"); the option's YAML extends it
    into its own node with `- /schema/<group>/<name>@_here_`."""
    ConfigStore.instance().store(group=f"schema/{group}", name=name, node=cls, provider="rw_sweeps")


def check_shadowing(cls: type, label: str) -> None:
    """Each key of an option is declared once: a schema that declares again a key of its base, or of a schema
    it is composed with (`Scheduled`'s), changes that key for every run of the option without a word (an
    optimiser's own `eps` would replace the loss's ε, eq. 2.1's ℓ, and its default). Refused in one line
    naming the option and the key, but for `name` (each option's own) and the keys the base that declares
    them lets its options re-default (`OPTION_DEFAULTS`: `lr`, a family's `K`), which keep its type and rule."""
    for f in dataclasses.fields(cls):
        owners = [b for b in reversed(cls.__mro__) if f.name in b.__dict__.get("__annotations__", {})]
        if len(owners) < 2 or f.name == "name":
            continue
        first, again = owners[0], owners[-1]
        base = first.__dataclass_fields__[f.name]
        if f.name not in first.__dict__.get("OPTION_DEFAULTS", ()):
            raise TypeError(f"{label}: {again.__name__} declares the key {f.name!r}, which {first.__name__} has "
                            f"(default {_default_text(base)}); give the option's own key another name "
                            f"(optim=adam's own ε is adam_eps)")
        if (f.type, dict(f.metadata)) != (base.type, dict(base.metadata)):
            raise TypeError(f"{label}: {again.__name__} re-defaults the key {f.name!r} of {first.__name__} with "
                            f"another type or rule; keep {f.name}: {base.type} and its rule, or name a key of its own")


def _default_text(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return repr(f.default)


def called_as(owner: type, method: str) -> tuple[inspect.Signature, bool]:
    """How a method of a class is called: its signature without `self` or `cls`, and whether it is called on
    the class itself (a staticmethod or classmethod); `__init__`: the class's own call."""
    if method == "__init__":
        sig = inspect.signature(owner.__init__)
        return sig.replace(parameters=list(sig.parameters.values())[1:]), True
    raw = inspect.getattr_static(owner, method)
    on_class = isinstance(raw, (staticmethod, classmethod))
    sig = inspect.signature(getattr(owner, method))
    return (sig if on_class else sig.replace(parameters=list(sig.parameters.values())[1:])), on_class


def takes(got: inspect.Signature, want: inspect.Signature) -> bool:
    """Does a method of signature `got` take every call one of signature `want` takes: the same parameters in
    the same order, by name and kind, with a default where `want` has one, and more only with a default?"""
    g, w = list(got.parameters.values()), list(want.parameters.values())
    if len(g) < len(w):
        return False
    for a, b in zip(g, w):
        if a.name != b.name or a.kind != b.kind or (b.default is not b.empty and a.default is a.empty):
            return False
    return all(a.default is not a.empty or a.kind in (a.VAR_POSITIONAL, a.VAR_KEYWORD) for a in g[len(w):])


def plain(sig: inspect.Signature) -> str:
    """A signature as a reader writes it: without annotations."""
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=inspect.Signature.empty))


def _own_methods(cls: type) -> list[str]:
    """The public methods a class defines itself (not its properties, nor what @dataclass writes)."""
    return [k for k, v in cls.__dict__.items()
            if not k.startswith("_") and (isinstance(v, (staticmethod, classmethod)) or inspect.isfunction(v))]


def check_signatures(cls: type, label: str) -> None:
    """Every method an option overrides takes its base's calls (`takes`): a family's `draw(n, gen)` without
    the seed its callers pass fails here, in one line naming the option, the method and the expected
    signature, not in the middle of a sweep."""
    for method in _own_methods(cls):
        base = next((b for b in cls.__mro__[1:] if method in b.__dict__), None)
        if base is None:
            continue
        got, _ = called_as(cls, method)
        want, _ = called_as(base, method)
        if not takes(got, want):
            raise TypeError(f"{label}: {cls.__name__}.{method}{plain(got)} does not take the calls of "
                            f"{base.__name__}.{method}; expected {method}{plain(want)}")


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
            raise ConfigError(key, value, "must be a finite number" + (
                "" if self.lo is None and self.hi is None else "; " + self.text()))
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


def check_engines(cls: type, group: str, contracts: dict[str, type]) -> None:
    """What `@option(group)` checks of an option's `ENGINES` (a one-line TypeError naming the option and what
    is wrong): declared by the class itself (a subclass that inherited its parent's would train as its
    parent), naming only engines there are (`contracts`: engine → the Protocol its implementation meets),
    each a class with every method of its engine's contract, called as the contract says (on the class for a
    staticmethod) and taking its calls (`takes`)."""
    name = f"{group}={cls.__dataclass_fields__['name'].default}"
    if "ENGINES" not in cls.__dict__ or not cls.ENGINES:
        raise TypeError(f"{name}: {cls.__name__} declares no ENGINES of its own (engine → its implementation there)")
    for engine, impl in cls.ENGINES.items():
        if engine not in contracts:
            raise TypeError(f"{name}: ENGINES names the engine {engine!r}; engines: {', '.join(contracts)}")
        if not isinstance(impl, type):
            raise TypeError(f"{name}: ENGINES[{engine!r}] is {impl!r}, not a class")
        methods = contract_methods(contracts[engine])
        missing = [m for m in methods if not callable(getattr(impl, m, None))]
        if missing:
            raise TypeError(f"{name}: its {engine} implementation {impl.__name__} lacks {', '.join(missing)}")
        for m in methods:
            _check_call(name, engine, impl, contracts[engine], m)


def contract_methods(contract: type) -> list[str]:
    """The methods an engine calls on an implementation: its contract's own, `__init__` where it builds one."""
    return ["__init__"] * ("__init__" in contract.__dict__) + _own_methods(contract)


def _check_call(name: str, engine: str, impl: type, contract: type, method: str) -> None:
    got, on_class = called_as(impl, method)
    want, wanted_on_class = called_as(contract, method)
    shown = impl.__name__ if method == "__init__" else f"{impl.__name__}.{method}"
    expected = f"{impl.__name__ if method == '__init__' else method}{plain(want)}"
    if wanted_on_class and not on_class and method != "__init__":
        raise TypeError(f"{name}: its {engine} implementation's {method} is called on the class; expected "
                        f"@staticmethod {expected}")
    if not takes(got, want):
        raise TypeError(f"{name}: its {engine} implementation {shown}{plain(got)} does not take the engine's "
                        f"call; expected {expected}")


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


def unregistered(group: str, name: str) -> str:
    """Why `schema/<group>/<name>`, which `conf/<group>/<name>.yaml` extends, is in no registry (what Hydra
    says as `Could not load 'schema/<group>/<name>'`), naming the file to edit. A group whose base is a
    package's `base.py` has a module per option, which the package's `__init__.py` imports: the option's
    module is never imported, imported but declaring no such option, or not written. Else the options are
    declared in the base's module (`models.py`) or a module it imports."""
    base = [b for b in next(iter(OPTIONS[group].values())).__mro__ if dataclasses.is_dataclass(b)][-1]
    home = Path(sys.modules[base.__module__].__file__)
    says = f"conf/{group}/{name}.yaml extends schema/{group}/{name}, which no option declares"
    declare = f"@option({group!r}) on a schema whose name is {name!r}"
    if home.name != "base.py":
        return f"{says}: declare it ({declare}) in {_shown(home)} or a module it imports"
    module, where = home.parent / f"{name}.py", _shown(home.parent / "__init__.py")
    if module.exists() and f"{base.__module__.rsplit('.', 1)[0]}.{name}" in sys.modules:
        return f"{says}: {_shown(module)} is imported but has no {declare}"
    if module.exists():
        return f"{says}: {_shown(module)} is never imported; import it in {where}"
    return f"{says}: write {_shown(module)} ({declare}), which {where} imports"


def _shown(path: Path) -> str:
    """A module's path from the repository (or site-packages) root: `rw_sweeps/core/optimisers/rmsprop.py`."""
    parts = path.parts
    return "/".join(parts[parts.index("rw_sweeps"):]) if "rw_sweeps" in parts else str(path)


# ------------------------------------------------------------------------------------------ typing
@functools.lru_cache(maxsize=None)
def names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def frozen(v: Any) -> Any:
    """A value as a key can hold it: lists (and lists of lists) as tuples."""
    return tuple(frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


def as_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {k: as_dict(getattr(obj, k)) for k in names(type(obj))}
    if isinstance(obj, (list, tuple)):
        return [as_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    return obj


@functools.lru_cache(maxsize=None)
def node(cls):
    """A structured OmegaConf node of the class: OmegaConf's own type conversion, as a scratch target."""
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
    plain = _plain(cls, name, value)
    if plain is not _NOT_PLAIN:
        return plain
    scratch = node(cls)
    try:
        scratch[name] = value
    except ValidationError as e:
        raise ConfigError(key, value, type_rule(cls, name, e)) from None
    out = scratch[name]
    out = OmegaConf.to_container(out) if OmegaConf.is_config(out) else out
    if cache:
        _TYPED[ck] = list(out) if flat else out
    return out


_NOT_PLAIN = object()


@functools.lru_cache(maxsize=None)
def _hint(cls, name: str):
    return typing.get_type_hints(cls).get(name)


def _plain(cls, name: str, value: Any) -> Any:
    """OmegaConf's conversion where it is the identity or int → float (an int for an int field, a number for
    a float field, a string for a string field, a bool for a bool field), without a node; else _NOT_PLAIN."""
    hint, kind = _hint(cls, name), type(value)
    if hint is int and kind is int or hint is str and kind is str or hint is bool and kind is bool:
        return value
    if hint is float and kind in (int, float):
        return float(value)
    if kind is list and hint in _MATRICES and all(type(row) is list and all(type(x) in (int, float) for x in row)
                                                  for row in value):
        # a matrix of numbers (data.Pi) as OmegaConf keeps Any items, without its node per number: ~90 s of a
        # 900×900 Π's every read (the launch's, and each judgement of its run folder)
        return [list(row) for row in value]
    return _NOT_PLAIN


_MATRICES = (typing.List[typing.List[Any]], Optional[typing.List[typing.List[Any]]])


_RULES = {int: "must be an integer", float: "must be a number", bool: "must be true or false", str: "must be a string"}


def type_rule(cls, name: str, e: BaseException) -> str:
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
