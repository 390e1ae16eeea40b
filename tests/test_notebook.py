"""The example notebook runs as written: its code cells, in order, in one namespace (as a kernel runs them)."""
from __future__ import annotations

import json
import os

import matplotlib
import pytest

matplotlib.use("Agg")

from .conftest import ROOT

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)


def test_the_example_notebook_runs_and_draws_what_it_says(tmp_path, monkeypatch):
    nb = json.loads((ROOT / "examples" / "analysis.ipynb").read_text(encoding="utf-8"))
    monkeypatch.setenv("RW_SWEEPS_ROOT", str(ROOT))
    monkeypatch.setenv("RW_EXAMPLE_SWEEP", str(tmp_path / "sweep"))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    for cell in (c for c in nb["cells"] if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), "analysis.ipynb", "exec"), ns)  # noqa: S102 - the repo's own notebook
    runs, fig = ns["runs"], ns["fig"]
    assert len(runs) == 12 and set(runs["data.p"]) == {0.0, 0.5, 1.0}
    table = fig.phase_table
    assert len(table) == 6 and (table["n"] == 2).all()  # 3 p × 2 inits, 2 seeds per cell
    trap = table[(table["data.p"] != 0.5) & (table["init"] == "zero")]
    assert (trap["value"] == 0).all() and trap["theory_fail"].all()  # Theorem 4.1: zero init fails at p ∈ {0, 1}
    assert len(ns["history"]) == 12 * 31 and os.path.isdir(tmp_path / "sweep" / "0")
