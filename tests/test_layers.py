"""The two layers, by import graph: the core (configs, chains, data, models, engines, training, results,
theory) never imports the sweep layer or `analysis`; `analysis` reads run folders through the core alone."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dynamic_import(node) -> str | None:
    """The module a call imports by a literal name (`importlib.import_module("x")`, `import_module("x")`,
    `__import__("x")`), or None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return node.args[0].value if name in ("import_module", "__import__") else None


def _imports(source: str, package: str) -> set[str]:
    """Every module a file of `package` imports, at module level or inside a function, relative imports
    made absolute, and what it imports by a literal name (`importlib.import_module`, `__import__`)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if dynamic_import(node):
            out.add(dynamic_import(node))
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def _forbidden(source: str, package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in _imports(source, package) if any(m == f or m.startswith(f + ".") for f in forbidden))


def _offending(folder: str, forbidden: tuple[str, ...]) -> dict:
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        bad = _forbidden(path.read_text(), package, forbidden)
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_core_imports_neither_the_sweep_layer_nor_analysis_nor_the_plugins():
    assert _offending("rw_sweeps/core", ("rw_sweeps.sweeps", "analysis", "hydra_plugins")) == {}


def test_analysis_imports_no_sweep_layer_module():
    assert _offending("analysis", ("rw_sweeps.sweeps", "hydra_plugins")) == {}


def test_the_import_graph_reader_sees_relative_and_function_local_imports():
    """The checks above can fail: function-local imports of the sweep layer, relative or absolute, are seen."""
    source = "import os\n\ndef f():\n    from ..sweeps import app\n    import analysis.load\n"
    assert _forbidden(source, "rw_sweeps.core", ("rw_sweeps.sweeps", "analysis")) == [
        "analysis.load", "rw_sweeps.sweeps", "rw_sweeps.sweeps.app"]


def test_only_the_adapter_touches_private_library_names():
    """Hydra's, OmegaConf's and submitit's private modules and attributes are named in one module."""
    allowed = {"rw_sweeps/sweeps/hydra_adapter.py"}
    found = {}
    for folder in ("rw_sweeps", "hydra_plugins", "analysis", "launch.py"):
        paths = [ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).rglob("*.py"))
        for path in paths:
            text = path.read_text()
            hits = [w for w in ("hydra._internal", "omegaconf._utils", "_return_value", "_make_sbatch_string",
                                "core._submit") if w in text]
            if hits and str(path.relative_to(ROOT)) not in allowed:
                found[str(path.relative_to(ROOT))] = hits
    assert found == {}


# ------------------------------------------------------------------------------------------ the import graph
PACKAGES = ("rw_sweeps", "analysis", "hydra_plugins")
# third-party libraries slow enough to import (or absent without an extra) that a function may import them
# where it needs them, with the reason on the line: a command that never trains should not pay for torch
HEAVY = ("torch", "pandas", "pyarrow", "matplotlib", "wandb", "submitit", "optuna", "networkx", "scipy",
         "tqdm", "nbformat", "nbclient", "playwright", "adaptive")


class Module:
    """One project module as the import rules see it: its imports (target module, name, in a function?, line)."""

    def __init__(self, path: Path):
        parts = path.relative_to(ROOT).with_suffix("").parts
        self.path, self.is_init = path, parts[-1] == "__init__"
        self.name = ".".join(parts[:-1] if self.is_init else parts)
        self.package = self.name if self.is_init else ".".join(parts[:-1])
        self.lines = path.read_text().splitlines()
        self.tree = ast.parse("\n".join(self.lines))


def _modules() -> dict[str, Module]:
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            m = Module(path)
            out[m.name] = m
    return out


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_statements(m: Module):
    """(statement, [(module, name)], in a function?) of every import the module runs: `if TYPE_CHECKING:`
    blocks are for the type checker alone and are left out."""
    def visit(node, local):
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if dynamic_import(child) and not dynamic_import(child).startswith("."):
                yield child, [(dynamic_import(child), None)], True  # loaded where it is called
            elif isinstance(child, ast.Import):
                yield child, [(a.name, None) for a in child.names], local
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = m.package.split(".")[: len(m.package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                yield child, [(base, a.name) for a in child.names], local
            yield from visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from visit(m.tree, False)


def edges(mods: dict[str, Module]) -> dict[str, dict[str, bool]]:
    """{module: {project module it imports: only inside functions?}}."""
    out: dict[str, dict[str, bool]] = {name: {} for name in mods}
    for name, m in mods.items():
        for _, targets, local in import_statements(m):
            for base, what in targets:
                target = f"{base}.{what}" if what and f"{base}.{what}" in mods else base
                if target in mods and target != name:
                    out[name][target] = out[name].get(target, True) and local
    return out


def cycles(graph: dict[str, set]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def heavy_modules(mods: dict[str, Module]) -> set[str]:
    """Project modules that import a HEAVY library when imported (themselves or through another, at module level)."""
    direct, graph = set(), {n: set() for n in mods}
    for name, m in mods.items():
        for _, targets, local in import_statements(m):
            if local:
                continue
            for base, what in targets:
                if base.split(".")[0] in HEAVY:
                    direct.add(name)
                target = f"{base}.{what}" if what and f"{base}.{what}" in mods else base
                if target in mods and target != name:
                    graph[name].add(target)
    heavy, changed = set(direct), True
    while changed:
        changed = False
        for name, targets in graph.items():
            if name not in heavy and targets & heavy:
                heavy.add(name); changed = True
    return heavy


def _commented(m: Module, stmt) -> bool:
    """A reason on the import's lines, or on the lines of the run of imports it ends (blank lines between)."""
    first = stmt.lineno
    while first > 1 and (m.lines[first - 2].strip().startswith(("import ", "from ")) or not m.lines[first - 2].strip()
                         or m.lines[first - 2].strip().startswith("#")):
        first -= 1
        if m.lines[first - 1].strip().startswith("#"):
            return True
    return any(_reason(ln) for ln in m.lines[first - 1: stmt.end_lineno])


def _reason(line: str) -> bool:
    """A comment that says something: a bare `# noqa` or `# type: ignore` is no reason."""
    if "#" not in line:
        return False
    words = line.split("#", 1)[1].strip()
    return bool(words) and not words.startswith(("noqa", "type: ignore"))


def local_import_problems(mods: dict[str, Module]) -> list[str]:
    heavy = heavy_modules(mods)
    found = []
    for name, m in mods.items():
        for stmt, targets, local in import_statements(m):
            if not local:
                continue
            where = f"{m.path.relative_to(ROOT)}:{stmt.lineno}"
            for base, what in targets:
                target = f"{base}.{what}" if what and f"{base}.{what}" in mods else base
                if target in mods:
                    if target not in heavy:
                        found.append(f"{where}: {target} is light; import it at the top")
                elif base.split(".")[0] not in HEAVY:
                    found.append(f"{where}: {base} is light; import it at the top")
            if not _commented(m, stmt):
                found.append(f"{where}: a function-local import says why (a comment)")
    return found


def private_crossings(mods: dict[str, Module]) -> list[str]:
    """`from X import _name` and `X._name` where X is another project module."""
    found = []
    for name, m in mods.items():
        aliases = {}
        for stmt, targets, _ in import_statements(m):
            for (base, what), alias in zip(targets, stmt.names):
                target = f"{base}.{what}" if what and f"{base}.{what}" in mods else base
                if target in mods and target != name:
                    if what and what.startswith("_") and not what.startswith("__") and target == base:
                        found.append(f"{m.path.relative_to(ROOT)}:{stmt.lineno}: {what} of {target}")
                    aliases[alias.asname or (what if what else alias.name.split(".")[0])] = target
        for node in ast.walk(m.tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                    and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")):
                found.append(f"{m.path.relative_to(ROOT)}:{node.lineno}: {node.args[1].value} of {aliases[node.args[0].id]}")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{m.path.relative_to(ROOT)}:{node.lineno}: {node.attr} of {aliases[node.value.id]}")
    return found


def test_no_import_cycle_even_through_function_local_imports():
    mods = _modules()
    assert cycles({n: set(t) for n, t in edges(mods).items()}) == []


def test_no_module_reads_another_modules_private_name():
    assert private_crossings(_modules()) == []


def test_a_function_local_import_is_of_a_heavy_module_and_says_why():
    assert local_import_problems(_modules()) == []


def test_the_import_rules_can_fail(tmp_path):
    """Each rule above sees what it forbids: a cycle through a function-local import, a private name taken
    by `from … import` and by attribute, a light or unexplained function-local import."""
    pkg = tmp_path / "rw_sweeps"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n\nb._hidden()\n")
    (pkg / "b.py").write_text("from ._c import _secret\n\n\ndef f():\n    from . import a, d\n    import torch\n\n"
                              "    import json  # a light one, even with a reason\n")
    (pkg / "d.py").write_text("import json\n")
    (pkg / "_c.py").write_text("import torch\n_secret = 1\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        mods = {}
        for path in sorted(pkg.rglob("*.py")):
            m = Module(path)
            mods[m.name] = m
        assert cycles({n: set(t) for n, t in edges(mods).items()}) == [["rw_sweeps.a", "rw_sweeps.b"]]
        assert sorted(private_crossings(mods)) == ["rw_sweeps/a.py:3: _hidden of rw_sweeps.b",
                                                   "rw_sweeps/b.py:1: _secret of rw_sweeps._c"]
        assert local_import_problems(mods) == [
            "rw_sweeps/b.py:5: rw_sweeps.d is light; import it at the top",
            "rw_sweeps/b.py:5: a function-local import says why (a comment)",
            "rw_sweeps/b.py:6: a function-local import says why (a comment)",
            "rw_sweeps/b.py:8: json is light; import it at the top"]
    finally:
        ROOT = saved
