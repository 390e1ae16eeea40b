"""config.yaml, read ~3x faster than PyYAML (even with libyaml) for the files runs write.

A cold load of 10,000 runs is mostly YAML parsing: libyaml still builds a Python node object per
scalar. The configs are plain block YAML (nested `key: value` mappings, `- item` lists, plain
scalars), which this reads line by line; each distinct scalar is typed once by PyYAML's own
resolver, so `0.5`, `1.0e-05`, `null`, `true`, `M` come out exactly as `yaml.safe_load` gives
them. Any other line (quotes, flow collections, anchors, comments, ...) hands the whole file to
PyYAML.
"""
from __future__ import annotations

import re
from functools import lru_cache

import yaml

_YAML = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SAFE = yaml.SafeLoader("")
# `<indent>- item` | `<indent>key:` | `<indent>key: value`
_LINE = re.compile(r"( *)(?:- (.*)|([A-Za-z_][\w.-]*):(?: (.*))?)\Z")


class _NotPlain(Exception):
    """A line outside the plain block subset: PyYAML reads the file instead."""


def load_yaml(text: str):
    try:
        return _block_yaml(text)
    except _NotPlain:
        return yaml.load(text, Loader=_YAML)


def _block_yaml(text: str):
    root: dict = {}
    stack: list = [(0, root)]    # open containers, innermost last, with their lines' indent
    pending = None               # (indent, dict, key) of a `key:` whose block may follow
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise _NotPlain(line)
        indent, item, key, value = len(m[1]), m[2], m[3], m[4]
        if pending:              # open the block of the last `key:`: a list or a mapping
            p_indent, parent, p_key = pending
            pending = None
            if item is not None and indent >= p_indent:   # lists may sit at the key's indent
                parent[p_key] = []
                stack.append((indent, parent[p_key]))
            elif indent > p_indent:
                parent[p_key] = {}
                stack.append((indent, parent[p_key]))
        while stack[-1][0] > indent or (item is None and isinstance(stack[-1][1], list)
                                         and stack[-1][0] == indent):
            stack.pop()
        depth, box = stack[-1]
        if depth != indent or isinstance(box, list) != (item is not None):
            raise _NotPlain(line)
        if item is not None:
            box.append(_scalar(item))
        elif value is None:      # null unless a block follows
            box[key] = None
            pending = (indent, box, key)
        else:
            box[key] = _scalar(value)
    return root


def _scalar(v: str):
    if v == "[]":                # fresh containers: never shared through the cache
        return []
    if v == "{}":
        return {}
    return _plain(v)


@lru_cache(maxsize=1 << 16)
def _plain(v: str):
    if (v[:1] in "'\"[]{}&*!|>%@`#?,-:" and not (v[:1] == "-" and v[1:2].isdigit())) \
            or ": " in v or " #" in v or v.endswith(":") or v != v.strip():
        raise _NotPlain(v)
    tag = _SAFE.resolve(yaml.ScalarNode, v, (True, False))
    return _SAFE.yaml_constructors[tag](_SAFE, yaml.ScalarNode(tag, v))
