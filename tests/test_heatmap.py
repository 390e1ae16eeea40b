"""analysis.heatmap draws what seaborn.heatmap drew in the report, pixel for pixel, for every option it uses: phase
panels (a norm, NaN cells, string annotations, labels thinned to fit), matrices (vmin/vmax, a colour bar,
formatted values, square cells), and the figure sizes and cell counts the report makes."""
from __future__ import annotations

import io
from contextlib import contextmanager, nullcontext

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402

from analysis.heatmap import heatmap  # noqa: E402
from matplotlib.backend_bases import FigureCanvasBase  # noqa: E402

sns = pytest.importorskip("seaborn")


@contextmanager
def drawless(fig):
    """The canvas the report drew seaborn's heatmaps on: one whose draw() does nothing (seaborn draws the whole
    figure in every heatmap call to check its tick labels, quadratic in the panels)."""
    canvas = fig.canvas
    FigureCanvasBase(fig)
    try:
        yield fig
    finally:
        fig.set_canvas(canvas)


def pixels(fig) -> np.ndarray:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    plt.close(fig)
    return plt.imread(io.BytesIO(buf.getvalue()))


def both(draw_seaborn, draw_ours, figsize, layout=None):
    out = []
    for draw in (draw_seaborn, draw_ours):
        fig, ax = plt.subplots(figsize=figsize)
        with drawless(fig) if draw is draw_seaborn else nullcontext():
            draw(ax)
        if layout:
            fig.set_layout_engine(layout)
        out.append(pixels(fig))
    return out


def panel(rows: int, cols: int, seed: int, nan: float):
    rng = np.random.default_rng(seed)
    values = rng.uniform(0, 1, (rows, cols))
    values[rng.uniform(size=values.shape) < nan] = np.nan
    texts = np.array([[("" if np.isnan(v) else f"{v:.2f}\nn={i}") for i, v in enumerate(line)] for line in values])
    xs = [f"{v:.3g}" for v in np.geomspace(1e-4, 1, cols)]
    ys = [f"p = {v:.2f}" for v in np.linspace(0, 1, rows)]
    return values, texts, xs, ys


@pytest.mark.parametrize("rows, cols, nan, figsize", [
    (4, 3, 0.0, (5, 4)), (6, 10, 0.2, (8, 5)), (3, 40, 0.1, (6, 3)), (30, 4, 0.0, (4, 3)), (1, 1, 0.0, (2, 2)),
    (5, 5, 1.0, (4, 4))])
def test_a_phase_panel_is_seaborns(rows, cols, nan, figsize):
    values, texts, xs, ys = panel(rows, cols, rows * cols, nan)
    norm = Normalize(0, 1)
    kw = dict(norm=norm, cmap="RdYlGn", cbar=False, linewidths=0.5, linecolor="white", fmt="",
              annot_kws={"fontsize": 7})

    def theirs(ax):
        sns.heatmap(pd.DataFrame(values, index=ys, columns=xs), ax=ax, annot=texts, **kw)

    def ours(ax):
        heatmap(ax, values, columns=xs, index=ys, annot=texts, **kw)

    a, b = both(theirs, ours, figsize, layout="constrained")
    assert a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("K", [2, 6, 8, 9, 20])
@pytest.mark.parametrize("limits", [(None, None), (0.0, 1.0)])
def test_a_matrix_is_seaborns(K, limits):
    M = np.random.default_rng(K).uniform(-0.5, 1.5, (K, K))
    ticks = np.arange(1, K + 1)
    kw = dict(cmap="Blues", vmin=limits[0], vmax=limits[1], square=True, cbar=True, xticklabels=ticks,
              yticklabels=ticks, annot=K <= 8, fmt=".2f", annot_kws={"fontsize": 6})

    a, b = both(lambda ax: sns.heatmap(M, ax=ax, **kw), lambda ax: heatmap(ax, M, **kw), (4, 3.5))
    assert a.shape == b.shape and np.array_equal(a, b)


_V = np.random.default_rng(1).uniform(0, 1, (4, 5))
_FRAME = pd.DataFrame(_V, index=pd.Index(list("abcd"), name="rows"), columns=pd.Index([1, 2.5, 3, 4, 5], name="cols"))
_W = _V.copy()
_W[0, 0], _W[1, 1], _W[2, 2] = np.inf, -np.inf, np.nan


@pytest.mark.parametrize("values, kw", [
    (_V, dict(xticklabels=False)), (_V, dict(yticklabels=False)), (_V, dict(xticklabels=2)),
    (np.random.default_rng(2).uniform(size=(10, 3)), dict(yticklabels=3)),
    (np.arange(12).reshape(3, 4), dict(annot=True, fmt="d")), ([[1, 2], [3, 4]], dict(annot=True, fmt="d")),
    (_FRAME, {}), (_FRAME, dict(annot=True)), (_W, {}), (np.full((3, 3), np.nan), dict(norm=Normalize(0, 1))),
    (np.random.default_rng(3).uniform(size=(3, 300)), {}), (np.ones((3, 3)), {}),
    (pd.DataFrame(_V, columns=[None, 1, 2, 3, 4]), {}),
], ids=["x-false", "y-false", "x-every-2", "y-every-3", "ints-fmt-d", "list-fmt-d", "frame", "frame-annot",
        "inf-and-nan", "all-nan", "300-columns", "constant", "none-and-int-names"])
def test_every_option_seaborn_takes_draws_as_seaborn_draws_it(values, kw):
    """Beyond what the report passes: the same pixels for seaborn's other tick options, integer values, a
    DataFrame's names (a pandas Index shows [None, 1] as nan and 1.0) and ±inf."""
    a, b = both(lambda ax: sns.heatmap(values, ax=ax, cmap="viridis", **kw),
                lambda ax: heatmap(ax, values, cmap="viridis", **kw), (4, 3))
    assert a.shape == b.shape and np.array_equal(a, b)


def test_the_mesh_holds_the_values_row_0_on_top():
    fig, ax = plt.subplots()
    values = np.arange(6.0).reshape(2, 3)
    values[1, 2] = np.nan
    heatmap(ax, values, cmap="viridis", cbar=False)
    mesh = ax.collections[0]
    got = mesh.get_array().reshape(2, 3)
    assert np.array_equal(got.filled(-1), [[0, 1, 2], [3, 4, -1]]) and got.mask[1, 2]
    assert ax.get_ylim() == (2, 0) and ax.get_xlim() == (0, 3)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    plt.close(fig)


def test_annotations_must_match_the_values():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="same shape"):
        heatmap(ax, np.zeros((2, 2)), cmap="viridis", annot=np.array([["a"]]))
    plt.close(fig)
