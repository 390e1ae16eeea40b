"""The repository explains itself: code, tests, presets, benchmarks and the README refer only to what is in it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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



@pytest.mark.e2e
def test_the_unit_layer_refuses_exactly_the_processes_that_make_a_test_end_to_end():
    """`make test-fast` (RW_UNIT_ONLY=1) fails a test that starts a Python process, a SLURM command or a browser
    (so an unmarked end-to-end test cannot slip into the edit loop), and lets the product's cheap helpers run."""
    from .conftest import end_to_end

    assert all(map(end_to_end, [sys.executable, "python3", "/usr/bin/python3.11", "sbatch", "/usr/bin/squeue",
                                "chromium", "node"]))
    assert not any(map(end_to_end, ["git", "/usr/bin/cc", "gcc", "true"]))
    child = f"""
import subprocess, sys
sys.path.insert(0, {str(ROOT)!r})
from tests import conftest
conftest.refuse_processes()
print(subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.split()[0])
try:
    subprocess.run([sys.executable, "-c", "pass"])
except BaseException as exc:
    print(type(exc).__name__, exc)
"""
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert out[0] == "git" and out[1].startswith("Failed this test starts a process") and "mark it `e2e`" in out[1], out
