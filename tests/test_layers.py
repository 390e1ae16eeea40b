"""The two layers, by import graph: the core (configs, chains, data, models, engines, training, results,
theory) never imports the sweep layer or `analysis`; `analysis` reads run folders through the core alone."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(source: str, package: str) -> set[str]:
    """Every module a file of `package` imports, at module level or inside a function, relative imports
    made absolute."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
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
