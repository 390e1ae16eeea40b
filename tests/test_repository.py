"""The repository explains itself: code, tests, presets, benchmarks and the README refer only to what is in it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pointers a reader of the repository cannot follow: tracker numbers and documents kept elsewhere (the
# pattern is assembled so that this file does not match itself)
OUTSIDE = re.compile("|".join([r"[Ii]ssue[ -]?[0-9]", "spec" + " §", "shared" + "/", "performance" + "-notes",
                               "hydra" + "-jobs"]))
FOLDERS = ("rw_sweeps", "analysis", "hydra_plugins", "conf", "tests", "benchmarks", "docs", "examples")
SUFFIXES = {".py", ".yaml", ".c", ".md", ".toml"}


def test_nothing_points_outside_the_repository():
    files = [p for d in FOLDERS for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    files += [ROOT / "README.md", ROOT / "launch.py", ROOT / "Makefile", ROOT / "pyproject.toml"]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits[:20])


def test_test_names_say_what_they_check_not_a_number():
    numbered = [f"{p.name}: {m.group(0)}" for p in (ROOT / "tests").glob("test_*.py")
                for m in re.finditer(r"def test_[0-9]\w*", p.read_text(encoding="utf-8"))]
    assert not numbered, numbered


def test_every_package_and_config_folder_is_packaged():
    """`pip install .` ships every Python package and every conf/ folder (as `rw_sweeps_conf.*`); setuptools
    warns of a folder with files it is not told of, and a non-editable install would lack it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {p.parent.relative_to(ROOT).parts for d in ("rw_sweeps", "analysis", "hydra_plugins")
               for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts}
    packages = {".".join(f[:i]) for f in folders for i in range(1, len(f) + 1)}  # a namespace's parent too
    conf = {".".join(("rw_sweeps_conf", *p.relative_to(ROOT / "conf").parts)) for p in (ROOT / "conf").rglob("*")
            if p.is_dir() and "__pycache__" not in p.parts}
    assert packages | conf | {"rw_sweeps_conf"} == listed, sorted((packages | conf | {"rw_sweeps_conf"}) ^ listed)
