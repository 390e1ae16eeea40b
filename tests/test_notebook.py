"""The example notebook as a researcher runs it: executed in a real Jupyter kernel (nbclient, as `jupyter
nbconvert --execute` does), its figures inline in the executed file; and `analysis` leaves the matplotlib
backend to whoever imports it."""
from __future__ import annotations

import base64
import io
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.e2e  # a kernel and a child interpreter: both tests start a process (tests/conftest.py)

# nbformat, nbclient and a kernel: the dev extra's; the notebook's test is skipped only where they are not installed
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

# What the test reads out of the kernel after the notebook's own cells ran: the state its cells left
PROBE = """import json
print(json.dumps({"runs": len(runs), "p": sorted(set(runs["data.p"])),
                  "cells": ax.phase_table.assign(theory_fail=ax.phase_table["theory_fail"].astype(bool))
                  .to_dict("records"), "history": len(history)}, default=str))"""


def _png(output) -> "np.ndarray":
    import matplotlib.image as mpimg   # matplotlib: decoding the figure the kernel sent
    return mpimg.imread(io.BytesIO(base64.b64decode(output["data"]["image/png"])), format="png")


def test_the_example_notebook_executes_in_a_kernel_and_shows_its_figures(tmp_path):
    nb = nbformat.read(ROOT / "examples" / "analysis.ipynb", as_version=4)
    own = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    env = {**os.environ, "RW_SWEEPS_ROOT": str(ROOT), "RW_EXAMPLE_SWEEP": str(tmp_path / "sweep")}
    env.pop("MPLBACKEND", None)   # the kernel's own default (inline), as in Jupyter
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)   # the kernel's environment
    nbformat.validate(nb)

    figures = {i: [o for o in nb.cells[i].outputs if "image/png" in o.get("data", {})] for i in own}
    sources = {i: nb.cells[i].source for i in own}
    plots = [i for i in own if "sns.lineplot(" in sources[i] or "phase_diagram(" in sources[i]]
    assert len(plots) == 2, sources
    for i in plots:   # the seaborn learning curves and the phase diagram, each one inline figure
        assert len(figures[i]) == 1, (i, [o.output_type for o in nb.cells[i].outputs])
        img = _png(figures[i][0])
        assert img.shape[0] > 150 and img.shape[1] > 300   # a drawn figure, at the kernel's inline size
        assert img[..., :3].std() > 0.05                    # with something on it, not a blank canvas
    assert sum(len(v) for k, v in figures.items() if k not in plots) == 0   # tables stay tables

    probe = json.loads(nb.cells[-1].outputs[-1]["text"])
    assert probe["runs"] == 12 and probe["p"] == [0.0, 0.5, 1.0]
    cells = probe["cells"]
    assert len(cells) == 6 and all(c["n"] == 2 for c in cells)   # 3 p × 2 inits, 2 seeds per cell
    trap = [c for c in cells if c["data.p"] != 0.5 and c["init"] == "zero"]
    # Theorem 4.1: zero init fails at p ∈ {0, 1}, and the diagram outlines exactly those cells
    assert len(trap) == 2 and all(c["value"] == 0 and c["theory_fail"] for c in trap)
    assert [c for c in cells if c["theory_fail"]] == trap
    assert probe["history"] == 12 * 31 and (tmp_path / "sweep" / "0").is_dir()


def test_importing_analysis_leaves_the_backend_to_the_user():
    """Every module of `analysis`, imported where the user chose a backend (here `svg`, as a notebook chooses
    inline), keeps it: the CLI and the report's wandb run choose theirs when they run, not at import."""
    import analysis
    mods = sorted(f"analysis.{m.name}" for m in pkgutil.iter_modules(analysis.__path__))
    assert "analysis.phase" in mods and "analysis.__main__" in mods
    code = ("import importlib, sys, matplotlib\nmatplotlib.use('svg')\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            "import matplotlib.pyplot as plt\nprint(matplotlib.get_backend(), type(plt.figure().canvas).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["svg", "FigureCanvasSVG"]
