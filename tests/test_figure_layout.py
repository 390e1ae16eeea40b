"""Figures keep to their axes and say what they show, checked on the drawn figure's boxes (window extents and
tight bounding boxes after a draw), not by eye: a phase diagram drawn into a caller's axes beside another
panel, the trap legend against the x labels, a step diagram's colour scale, the learning curves' caption, one
label for zero init's σ."""
from __future__ import annotations

import itertools
import re

import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from analysis import load_runs
from analysis import curves
from analysis.__main__ import build, unbroken
from analysis.phase import ZERO, add_success, axis_label, phase_diagram

from ._fake_runs import write_run


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def suptitle(fig):
    """The figure's title artist, found by its text (public API)."""
    (title,) = [t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle() and t.figure is fig]
    return title


@pytest.fixture(autouse=True)
def agg():
    """Boxes measured on the Agg canvas, as saved; every figure closed after the test."""
    old = matplotlib.get_backend()
    plt.switch_backend("Agg")
    yield
    plt.close("all")
    plt.switch_backend(old)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The default demo's shape: p ∈ {0, 0.5, 1} × zero/Gaussian init × 2 seeds; the Gaussian runs never left
    the symmetric point (as in the demo's 50 steps), the zero-init ones broke at step 2 where they could."""
    d = tmp_path_factory.mktemp("fig") / "demo"
    for i, (p, init, seed) in enumerate(itertools.product((0.0, 0.5, 1.0), ("zero", "gaussian"), (0, 1))):
        write_run(d / str(i), p=p, init=init, sigma=0.01, seed=seed, steps=50,
                  summary={"symmetry_break_step": None} if init == "gaussian" else None)
    return d


@pytest.mark.parametrize("layout", [None, "constrained", "tight"])
def test_a_diagram_drawn_into_an_axes_keeps_its_colour_bar_and_legend_out_of_the_neighbouring_panel(demo, layout):
    runs = add_success(load_runs(demo, progress=False))
    fig, (ax, mine) = plt.subplots(1, 2, figsize=(10, 3.2), layout=layout)
    mine.plot([0, 1], [0, 1])
    mine.set(title="the user's own panel", ylabel="the user's label")
    phase_diagram(runs, "data.p", "init", ax=ax)
    fig.canvas.draw()
    added = [a for a in fig.axes if a is not mine]
    bars = [a for a in added if a.get_label() == "<colorbar>"]
    legend = ax.get_legend()
    assert len(bars) == 1 and legend is not None and len(added) == 3   # the heatmap, its OPT axis, its colour bar
    neighbour = mine.get_tightbbox()
    for a in added:
        assert not overlap(a.get_tightbbox(), neighbour), (a.get_label(), a.get_tightbbox(), neighbour)
    assert not overlap(bars[0].get_window_extent(), ax.get_window_extent())   # beside the heatmap, not on it
    box = legend.get_window_extent()
    assert not overlap(box, neighbour)
    assert not overlap(box, ax.xaxis.label.get_window_extent())
    assert not any(overlap(box, t.get_window_extent()) for t in ax.get_xticklabels() if t.get_text())
    assert box.y1 <= ax.xaxis.label.get_window_extent().y0   # below the x label


def test_diagrams_drawn_into_a_grid_then_fig_tight_layout_keep_off_each_other_and_inside_the_figure(demo):
    """The usual notebook cell: `plt.subplots(2, 2)`, a diagram into three of the axes, then
    `fig.tight_layout()` (a one-off call, no layout engine set while drawing): no diagram's axes, colour bar
    or labels overlap another panel's, and every colour bar stays inside the figure."""
    runs = add_success(load_runs(demo, progress=False))
    fig, axs = plt.subplots(2, 2, figsize=(10, 8))
    panels = []   # each grid slot's axes and those its diagram added (its OPT axis, its colour bar)
    for ax in (axs[0, 0], axs[0, 1], axs[1, 0]):
        before = set(fig.axes)
        phase_diagram(runs, "data.p", "init", ax=ax)
        panels.append([ax, *(a for a in fig.axes if a not in before)])
    axs[1, 1].plot([0, 1], [0, 1])
    axs[1, 1].set_ylabel("the user's label")
    panels.append([axs[1, 1]])
    fig.tight_layout()
    fig.canvas.draw()
    boxes = [[a.get_tightbbox() for a in panel] for panel in panels]
    for i, mine in enumerate(boxes):
        for theirs in boxes[i + 1:]:
            assert not any(overlap(b, c) for b in mine for c in theirs), (mine, theirs)
    for a in fig.axes:
        if a.get_label() == "<colorbar>":
            box = a.get_tightbbox()
            assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)


@pytest.mark.parametrize("layout", ["constrained", "tight"])
def test_a_diagram_above_another_panel_keeps_its_trap_legend_and_labels_off_it(demo, layout):
    """A panel below a diagram (a 2 × 1 grid) is clear of the diagram's x label, OPT axis, colour bar and trap
    legend under a layout engine. (Without one, matplotlib's default spacing leaves no room between rows for
    any x label and title, the README says so.)"""
    runs = add_success(load_runs(demo, progress=False))
    fig, (top, below) = plt.subplots(2, 1, figsize=(6, 6), layout=layout)
    below.plot([0, 1], [0, 1])
    below.set(title="the user's own panel")
    before = set(fig.axes)
    phase_diagram(runs, "data.p", "init", ax=top)
    added = [top, *(a for a in fig.axes if a not in before)]
    fig.canvas.draw()
    neighbour = below.get_tightbbox()
    assert top.get_legend() is not None
    assert not overlap(top.get_legend().get_window_extent(), neighbour)
    for a in added:
        assert not overlap(a.get_tightbbox(), neighbour), (a.get_label(), a.get_tightbbox(), neighbour)


@pytest.mark.parametrize("facets", [{}, {"row": "seed"}])
def test_the_trap_legend_and_the_title_of_a_diagrams_own_figure_stay_clear_of_its_labels(demo, facets):
    runs = add_success(load_runs(demo, progress=False))
    fig = phase_diagram(runs, "data.p", "init", **facets)
    fig.canvas.draw()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(), fig.bbox
    heatmaps = [a for a in fig.axes if a.get_label() != "<colorbar>" and a.get_xlabel() == "p  (data.p)"]
    assert len(heatmaps) == (2 if facets else 1)
    for a in fig.axes:
        for text in [a.xaxis.label, a.yaxis.label, *a.get_xticklabels(), *a.get_yticklabels()]:
            if text.get_text():
                t = text.get_window_extent()
                assert not overlap(box, t), text.get_text()
                assert page.x0 <= t.x0 and t.x1 <= page.x1 and page.y0 <= t.y0 and t.y1 <= page.y1, text.get_text()
    title = suptitle(fig).get_window_extent()
    for b in (box, title):
        assert page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1, (b, page)
    # the title names what the cells pool, and not a key that follows the axes (σ follows init here)
    # (model.normalize=auto differs with init: named as differing, after the pooled keys)
    assert "pooled over seed;" in fig.get_suptitle() and "init.sigma" not in fig.get_suptitle()


def test_a_long_title_wraps_inside_the_figure(demo):
    fig = phase_diagram(add_success(load_runs(demo, progress=False)), "data.p", "init", title="pooled over " * 30)
    fig.canvas.draw()
    b = suptitle(fig).get_window_extent()
    assert fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 and b.height > 2 * 11   # several lines


def test_a_near_constant_step_diagram_is_coloured_against_the_runs_horizon(tmp_path):
    """Cells at steps 10.0 and 10.5 of a 50-step horizon are one colour, a fifth of the way up: not the two ends
    of the scale."""
    for i, (p, seed, step) in enumerate([(0.1, 0, 10), (0.1, 1, 10), (0.5, 0, 10), (0.5, 1, 11)]):
        write_run(tmp_path / "s" / str(i), p=p, seed=seed, steps=50, summary={"symmetry_break_step": step})
    fig = phase_diagram(load_runs(tmp_path / "s", progress=False), "data.p", metric="symmetry_break_step")
    assert sorted(fig.phase_table["value"]) == [10.0, 10.5]
    mesh = fig.axes[0].collections[0]
    assert (mesh.norm.vmin, mesh.norm.vmax) == (0, 50)
    colours = mesh.get_facecolors()
    assert len(colours) == 2 and abs(colours[0] - colours[1]).max() < 0.03
    assert "of 50 steps" in next(a for a in fig.axes if a.get_label() == "<colorbar>").get_ylabel()


def test_the_learning_curves_say_what_each_panel_pools_and_how_many_runs_it_read(demo, tmp_path, monkeypatch):
    runs = add_success(load_runs(demo, progress=False))
    notes: list[str] = []
    (name, caption, draw), = curves.curve_figures(runs, notes)
    assert "pooling seed" in caption and "every run of the cell" in caption
    titles = [a.get_title() for a in draw().axes if a.get_title()]
    assert len(titles) == 6 and all(t.endswith("(2 runs)") for t in titles)
    assert sum("σ=zero" in t for t in titles) == 3 and not any("none" in t for t in titles)
    monkeypatch.setattr(curves, "MAX_RUNS", 1)   # a cell with more runs than are read says so
    (name, caption, draw), = curves.curve_figures(runs, notes)
    assert "at most the first 1 runs of a cell" in caption
    assert all(t.endswith("(1 of 2 runs)") for t in (a.get_title() for a in draw().axes if a.get_title()))


def test_zero_init_has_one_sigma_label_on_axes_panels_and_the_run_table(demo, tmp_path):
    assert axis_label("init.sigma", 0.0) == axis_label("init.sigma", ZERO) == "zero"
    report = build([demo], tmp_path / "report")
    table = report.path.read_text().split("<table class='sortable' id='runs'>")[1].split("</table>")[0]
    heads = re.findall(r"<th>(.*?)</th>", table)
    rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])]
    sigmas = {row[heads.index("init.sigma")] for row in rows}
    assert len(rows) == 12
    assert sigmas == {"zero", "0.01"}


def test_a_row_that_never_left_the_symmetric_point_is_captioned_as_such(demo, tmp_path):
    runs = add_success(load_runs(demo, progress=False))
    said = unbroken(runs, "init.sigma")
    assert said == (". σ = 1e-2: no run's attention left the symmetric point (symmetry_break_step: attention spread "
                    "> 1e-3) within its 50 steps, so its cells measure only that horizon")
    assert unbroken(runs, "init") == said.replace("σ = 1e-2", "init = gaussian")
    assert unbroken(runs[runs["init"] == "zero"], "init.sigma") == ""   # its trap cells are the theorem's
    report = build([demo], tmp_path / "report")
    caption = next(f["caption"] for f in report.figures if f.get("file") == "phase_success.png")
    assert caption.endswith(said)
