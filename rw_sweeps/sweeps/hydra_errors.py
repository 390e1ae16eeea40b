"""Hydra's and OmegaConf's composition errors as the project's one-line ConfigError (`invalid config: key=value:
what is allowed`): a value of the wrong type against a schema, a key an option has no place for, a deleted
required key, an unknown group option, an unknown launcher key. The sweep layer's: it reads Hydra's error
types and message texts (beside `hydra_adapter`, which holds the private names), and knows the launcher's keys;
the schemas (`rw_sweeps.core.config`) say what is allowed."""
from __future__ import annotations

import contextlib
import dataclasses
import re
import typing
import unicodedata

from rw_sweeps.core.config import ConfigError, RunConfig, describe_unknown
from rw_sweeps.core.registry import OPTIONS, type_rule, unregistered
from rw_sweeps.core.errors import Typed, did_you_mean, one_line
from rw_sweeps.sweeps import placement
from hydra.errors import OverrideParseException
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, ConfigTypeError, InterpolationResolutionError,
                             ValidationError)


def _schema_of(e: BaseException):
    """The schema class an OmegaConf error was raised on, when it is one of ours."""
    cls = getattr(e, "object_type", None)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def from_hydra_error(exc: BaseException) -> ConfigError | None:
    """Hydra's / OmegaConf's composition errors (a value of the wrong type against the schema, a key the
    option has no place for, a deleted required key, an unknown group option) as the same one-line
    ConfigError, or None."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        key = getattr(e, "full_key", None)
        if isinstance(e, ConfigError):
            return e
        if isinstance(e, OverrideParseException):
            return _unparsed(e.override, e.message)
        if isinstance(e, InterpolationResolutionError) and key:
            node = getattr(e, "child_node", None)
            return ConfigError(key, str(node) if node is not None else None, _unresolved(e))
        if not key:
            continue
        cls = _schema_of(e)
        if isinstance(e, ValidationError):
            key = key.split("[")[0]
            leaf = key.rsplit(".", 1)[-1]
            if cls is None or leaf not in cls.__dataclass_fields__:  # an item of a list: the run's own key
                cls = RunConfig if "." not in key else cls
            rule = (RULES[key] if key in RULES else type_rule(cls, leaf, e)
                    if cls is not None and leaf in cls.__dataclass_fields__ else one_line(e))
            return ConfigError(key, getattr(e, "value", None), rule)
        if isinstance(e, (ConfigAttributeError, ConfigKeyError)):
            # Hydra names the override as typed (`use +daat.p=0.5`): its key may go below the unknown one
            m = re.search(r"use \+(" + re.escape(key) + r"(?:\.[^=\s]+)?)=(.*)$", str(exc), re.M)
            typed, value = (m.group(1), Typed(m.group(2))) if m else (key, None)
            if key.startswith("hydra.launcher."):
                return ConfigError(typed, value, "unknown launcher key" + _closest(key, cls) + "; any other sbatch "
                                   f"option goes in '+hydra.launcher.additional_parameters.{key.rsplit('.', 1)[1]}=...'")
            if key.startswith("hydra.sweeper.") and cls is not None:  # a sweeper's own schema: its keys
                names = [f for f in cls.__dataclass_fields__ if not f.startswith("_")]
                return ConfigError(typed, value, f"unknown sweeper key{_closest(key, cls)}; allowed: {', '.join(names)}")
            if key.startswith("hydra."):
                return ConfigError(typed, value, "unknown Hydra key")
            prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
            return ConfigError(typed, value, describe_unknown(cls, prefix, key.rsplit(".", 1)[-1], typed != key)
                               if cls is not None else "unknown key")
        if isinstance(e, ConfigTypeError) and "deletion" in str(e):
            return ConfigError(key, "<deleted>", "is required by the schema and cannot be removed")
    text = str(exc)
    m = re.search(r"Could not load 'schema/(\w+)/([^']+)'", text)
    if m and m.group(1) in OPTIONS:  # an option's YAML whose schema no imported module declares
        return ConfigError(m.group(1), m.group(2), unregistered(m.group(1), m.group(2)))
    m = re.search(r"Could not (?:find|load) '([\w/]+)/([^']+)'.*?Available options in '[^']+':\s*(.*?)(?:Config search path|$)",
                  text, re.S)
    if m:
        options = ", ".join(o.strip() for o in m.group(3).split() if o.strip() and not o.strip().endswith("_schema"))
        extra = EXTRAS.get((m.group(1), m.group(2)))
        hint = f" ({m.group(2)} is in the '{extra}' extra: pip install 'rw-sweeps[{extra}]')" if extra else ""
        close = did_you_mean(m.group(2), options.split(", "))
        return ConfigError(m.group(1), m.group(2), f"unknown option{close}; allowed: {options}{hint}")
    m = re.match(r"Ambiguous value for argument '(.*)'\n", text)
    if m:  # a comma list in a single run: Hydra's three readings, the sweep first (a forgotten -m)
        return _ambiguous(m.group(1))
    return None


# launcher keys whose allowed values say more than their type (a value of the wrong type is refused with these)
RULES = {"hydra.launcher.retry": placement.RETRY_RULE}


def _ambiguous(override: str) -> ConfigError:
    """A forgotten -m, and the other two readings only where the key's type admits them (a list, a string)."""
    key, _, value = override.partition("=")
    key = key.lstrip("+~")
    kinds = _kinds(key)
    text = "a comma list in a single run: to sweep over it, add --multirun (-m) to your command line"
    if not kinds or list in kinds:
        text += f"; for a list write {key}=[{value}]"
    if not kinds or str in kinds:
        text += f"; for a string quote it: \"{key}='{value}'\""
    return ConfigError(key, Typed(value), text)


def _kinds(key: str) -> set:
    """The types (list for any List[…], null dropped) of every schema field `key` may name: the run's own,
    or that key of each option of its group that has it; empty for a key no schema here declares."""
    group, _, leaf = key.rpartition(".")
    classes = [RunConfig] if not group else list(OPTIONS.get(group, {}).values())
    hints = [typing.get_type_hints(c)[leaf] for c in classes if leaf in c.__dataclass_fields__]
    bases = [next((a for a in typing.get_args(h) if a is not type(None)), h) if typing.get_origin(h) is typing.Union
             else h for h in hints]
    return {list if typing.get_origin(b) in (list, tuple) else b for b in bases}


def _closest(key: str, cls) -> str:
    """` (did you mean …?)` among the keys of the schema a `hydra.launcher.*`/`hydra.sweeper.*` key was refused by."""
    if cls is None:
        return ""
    prefix, _, leaf = key.rpartition(".")
    return did_you_mean(leaf, [f for f in cls.__dataclass_fields__ if not f.startswith("_")], prefix + ".")


GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def _unparsed(override: str, message: str) -> ConfigError:
    """An override Hydra's grammar cannot read, named whole: what the parser says, or the characters it does not
    read (full-width digits typed on a CJK keyboard, a smart quote), with the ASCII spelling where there is one,
    else, for one plain value (not a list or a sweep), the same value quoted, which the grammar reads as it is."""
    key, sep, value = override.partition("=")
    key = key.lstrip("+~") if sep else override
    odd = [c for c in dict.fromkeys(override) if ord(c) > 127]
    if odd:
        names = ", ".join(f"{c!r} ({unicodedata.name(c, 'unnamed')}, U+{ord(c):04X})" for c in odd[:3])
        plain = "".join(_ascii(c) for c in unicodedata.normalize("NFKC", override))
        if plain != override and plain.isascii():
            advice = f"; write {plain}"
        elif sep and not re.search(r"[,'\"\[\]{}()$\\]", value):   # one plain value: quoted, any characters read
            advice = f"; the grammar reads any character quoted, inside the shell's quotes: \"{override.partition('=')[0]}='{value}'\""
        else:
            advice = ""
        rule = f"the override grammar does not read {names}{advice}"
    elif value.count("${") > value.count("}"):
        rule = "an interpolation opened with ${ is not closed (write ${key}, and quote the override in a shell)"
    else:
        said = [ln.strip() for ln in message.strip().splitlines()
                if ln.strip() and not ln.startswith(("Error parsing override", "See https://"))]
        rule = f"Hydra's override grammar cannot parse it: {said[0] if said else 'unreadable'} (see {GRAMMAR})"
    return ConfigError(key, value if sep else None, rule) if sep else ConfigError(override, None, rule)


# typographic quotes a pasted command carries, and their ASCII spelling
QUOTES = {"“": '"', "”": '"', "„": '"', "‘": "'", "’": "'", "‚": "'"}


def _ascii(c: str) -> str:
    """The ASCII spelling of one character where it has one: a decimal digit of any script, a typographic quote."""
    digit = unicodedata.decimal(c, None)
    return str(digit) if digit is not None else QUOTES.get(c, c)


def _unresolved(e: BaseException) -> str:
    """Why an interpolation did not resolve, with the option that has the key it names, if another one does."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    m = re.match(r"Interpolation key '([\w.]+)' not found", first)
    if not m:
        return f"cannot be resolved: {first}"
    ref = m.group(1)
    group, _, field = ref.partition(".")
    owners = [n for n, c in OPTIONS.get(group, {}).items() if field in c.__dataclass_fields__]
    hint = f" ({ref} is a key of {', '.join(f'{group}={n}' for n in owners)})" if owners else ""
    return f"its interpolation names {ref}, which this run's config does not have{hint}"


# Hydra plugins that come with an extra of this package (pyproject.toml): a missing one says how to get it
EXTRAS = {("hydra/sweeper", "optuna"): "optuna", ("hydra/launcher", "submitit_local"): "submitit",
          ("hydra/launcher", "submitit_slurm"): "submitit"}


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


