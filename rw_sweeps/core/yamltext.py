"""The YAML text of many dicts that share one shape (a grid's configs), byte for byte what `dump` writes.

PyYAML represents and serialises every node in Python (~1 ms for a Hydra config). The configs of a grid
differ in a few leaves, so a `Templates` dumps each *shape* once, with a placeholder at every leaf that
differs from the first dict it saw, and fills a document's placeholders with the text of its own scalars
(scalar text does not depend on where the scalar sits in a block document, bar line folding, which is
why long scalars with spaces, and anything that is not a scalar, take the slow path). The first document
of every template is also dumped the slow way and compared, so a template that would differ is never used.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

_SCALARS = (str, int, float, bool, type(None))
_SLOT = re.compile(r"RWSLOT(\d+)X")


def _flat(node: Any, path: tuple, out: dict) -> None:
    """Leaves by path: a dict's items, a list's scalar items (a list of anything else is one leaf)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            if not isinstance(k, str):
                raise TypeError("non-string key")
            _flat(v, path + (k,), out)
    elif isinstance(node, list) and node and all(type(v) in _SCALARS for v in node):
        out[path + ("#len",)] = len(node)
        for i, v in enumerate(node):
            out[path + (i,)] = v
    else:
        out[path] = node


def _unflat(flat: dict, slots: dict) -> Any:
    """The document of a flattened dict with the leaves in `slots` replaced by their placeholders."""
    root: dict = {}
    for path, value in flat.items():
        if path[-1] == "#len":
            continue
        node, keys = root, path
        if isinstance(path[-1], int):  # an item of a list of scalars
            *keys, i = path
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        leaf = slots.get(path, value)
        if isinstance(path[-1], int):
            node.setdefault(keys[-1], []).append(leaf)
        else:
            node[keys[-1]] = leaf
    return root


class Templates:
    """`text(d)` == `dump(d)` for every dict d, fast for the dicts that share a shape."""

    def __init__(self, dump: Callable[[Any], str]):
        self.dump = dump
        self.base: Optional[dict] = None  # the first document's leaves
        self.keys: tuple = ()
        self.list_checked = False
        self.templates: dict[tuple, Optional[tuple[str, list]]] = {}  # changed paths → (text, paths) or None
        self.scalars: dict[tuple, Optional[str]] = {}

    def text(self, d: dict) -> str:
        try:
            flat: dict = {}
            _flat(d, (), flat)
        except TypeError:
            return self.dump(d)
        return self.text_flat(flat, lambda: d)

    def text_flat(self, flat: dict, doc: Callable[[], Any]) -> str:
        if self.base is None:
            self.base, self.keys = flat, tuple(flat)
        base = self.base
        if len(flat) != len(base) or tuple(flat) != self.keys:  # another shape (or key order)
            return self.dump(doc())
        changed = tuple(k for k, v in flat.items() if type(v) is not type(base[k]) or v != base[k])
        pieces = []
        for path in changed:
            s = self._scalar(flat[path]) if path[-1] != "#len" else ""
            if s is None:
                return self.dump(doc())
            pieces.append(s)
        if changed not in self.templates:
            self.templates[changed] = self._template(flat, changed, doc)
        tpl = self.templates[changed]
        if tpl is None:
            return self.dump(doc())
        text, order = tpl
        return _SLOT.sub(lambda m: pieces[order[int(m.group(1))]], text)

    def text_list(self, items: list) -> str:
        """`dump(items)` for a list of scalars (overrides.yaml), checked against it once."""
        pieces = [self._scalar(v) for v in items]
        if not items or None in pieces:
            return self.dump(items)
        text = "".join(f"- {s}\n" for s in pieces)
        if not self.list_checked:
            if text != self.dump(items):
                return self.dump(items)
            self.list_checked = True
        return text

    def _template(self, flat: dict, changed: tuple, doc: Callable[[], Any]) -> Optional[tuple[str, list]]:
        slots = {path: f"RWSLOT{i}X" for i, path in enumerate(p for p in changed if p[-1] != "#len")}
        order = [changed.index(p) for p in slots]
        text = self.dump(_unflat(flat, slots))
        if len(_SLOT.findall(text)) != len(slots):
            return None
        pieces = [self._scalar(flat[p]) for p in changed]
        if _SLOT.sub(lambda m: pieces[order[int(m.group(1))]], text) != self.dump(doc()):
            return None  # checked once per template: never a text the slow path would not write
        return text, order

    def _scalar(self, v: Any) -> Optional[str]:
        """The text of a scalar as a block-document value, or None where it may depend on its place."""
        if type(v) not in _SCALARS:
            return None
        key = (type(v), v)
        if key not in self.scalars:
            s, out = None, self.dump([v])
            if out.startswith("- ") and out.count("\n") == 1 and out.endswith("\n"):
                s = out[2:-1]
                if " " in s and len(s) > 30:  # long text with spaces may be folded where it sits
                    s = None
            self.scalars[key] = s
        return self.scalars[key]
