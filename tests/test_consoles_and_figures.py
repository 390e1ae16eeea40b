"""What a sweep's console says and what its figures draw, for a researcher reading them: the per-run-limit
switch said in one line, batches numbered across the sweep, wandb names naming every searched key, the sweep's
analysis run drawn cheaply; a phase diagram drawn into an axes returns it, its title fits its slot; the
learning curves' titles keep off each other and count a run loaded twice once; zero init's σ is 0."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from analysis import curves, load_runs, wandb_run
from analysis.phase import add_success, phase_diagram
from rw_sweeps.sweeps import planner, tracking

from ._fake_runs import make_sweep, write_run

matplotlib.use("Agg")


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.fixture
def grid(tmp_path):
    make_sweep(tmp_path / "g", {"data.p": [0.0, 0.5], "init": ["zero", "gaussian"]}, sigma=0.01)
    return tmp_path / "g"


def test_a_diagram_drawn_into_an_axes_returns_that_axes_with_its_cells(grid):
    fig, ax = plt.subplots(figsize=(5, 2.5))
    got = phase_diagram(add_success(load_runs(grid, progress=False)), "data.p", "init", ax=ax)
    assert got is ax and len(ax.phase_table) == 4 and fig.phase_table is ax.phase_table
    plt.close(fig)


def test_a_diagram_of_load_runs_table_adds_the_success_it_draws(grid):
    runs = load_runs(grid, progress=False)
    assert "success" not in runs
    fig = phase_diagram(runs, "data.p", "init")
    cells = fig.phase_table.set_index(["init", "data.p"])["value"]
    assert cells[("zero", 0.0)] == 0 and cells[("zero", 0.5)] == 1 and cells[("gaussian", 0.5)] == 1
    plt.close(fig)


def test_zero_init_is_the_sigma_axis_zero_so_a_groupby_on_sigma_keeps_its_runs(grid):
    runs = load_runs(grid, progress=False)
    assert set(runs.loc[runs["init"] == "zero", "init.sigma"]) == {0.0}
    assert runs.groupby("init.sigma").size().to_dict() == {0.0: 2, 0.01: 2}


def test_a_long_title_in_an_axes_is_broken_to_the_axes_width_and_sits_right_above_it(grid):
    fig, (ax, right) = plt.subplots(1, 2, figsize=(8, 3))
    phase_diagram(add_success(load_runs(grid, progress=False)), "data.p", "init", ax=ax, title="pooled over " * 12)
    fig.canvas.draw()
    title, box = ax.title.get_window_extent(), ax.get_window_extent()
    assert title.height > 2 * 9 * fig.dpi / 72                          # several lines of 9 pt, not one long one
    assert title.x1 <= fig.bbox.x1 and not overlap(title, right.get_tightbbox())   # nor over the neighbour
    assert title.y0 >= box.y0 and title.y0 - box.y1 < 0.5 * fig.dpi    # right above its panel, no blank band
    plt.close(fig)


def test_learning_curve_titles_of_four_swept_keys_keep_off_each_other(tmp_path):
    make_sweep(tmp_path / "s", {"data.p": [0.15, 0.55], "init.sigma": [0.001, 0.0316], "optim.lr": [0.25, 1.5],
                                "model.pos_scale": [0.25, 0.5]}, init="gaussian")
    runs = add_success(load_runs(tmp_path / "s", progress=False))
    (_, _, draw), = curves.curve_figures(runs, [])
    fig = draw()
    fig.canvas.draw()
    titles = [a.title for a in fig.axes if a.title.get_text()]
    assert len(titles) == 16
    boxes = [t.get_window_extent() for t in titles]
    assert not any(overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)


def test_a_run_loaded_twice_is_one_run_of_its_learning_curve_panel(tmp_path):
    for sweep in ("a", "b"):  # the same run, in two sweep folders loaded together
        write_run(tmp_path / sweep / "0", p=0.5, group=sweep)
    runs = add_success(load_runs(tmp_path / "a", tmp_path / "b", progress=False))
    assert len(runs) == 2
    (_, _, draw), = curves.curve_figures(runs, [])
    fig = draw()
    (title,) = [t.get_text() for t in fig.findobj(Text) if "run" in t.get_text()]
    assert title == "1 run"
    plt.close(fig)


def _cfgs(n, **w):
    return [{"wandb": {"mode": "offline", "granularity": "auto", "per_run_limit": 2, **w}} for _ in range(n)]


def test_a_job_above_the_per_run_limit_says_once_that_it_is_one_wandb_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tracking, "_said_packed", False)
    dirs = [tmp_path / str(i) for i in range(3)]
    assert tracking.live(_cfgs(3), dirs) is None and tracking.live(_cfgs(3), dirs) is None
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"wandb: a job of 3 runs is logged as one wandb run (job_type=packed, in {tmp_path}/wandb_jobs/): "
                     "more than wandb.per_run_limit=2; wandb.granularity=run gives every run its own"]
    assert tracking.live(_cfgs(3, granularity="job"), dirs) is None and capsys.readouterr().out == ""


def test_a_key_the_sweep_varies_names_every_run_even_in_a_batch_where_it_is_constant():
    batch = [["optim.lr=0.5", "data.p=0.1"], ["optim.lr=0.5", "data.p=0.9"]]
    assert planner.varying(batch) == [["data.p=0.1"], ["data.p=0.9"]]
    assert planner.varying(batch, {"optim.lr"}) == batch


def test_the_analysis_run_draws_the_phase_diagram_of_a_grid_and_of_each_data_family(tmp_path):
    make_sweep(tmp_path / "g", {"data.p": [0.0, 0.5]})
    runs = add_success(load_runs(tmp_path / "g", progress=False))
    assert [(n, c) for n, c, _ in wandb_run.figures(runs, [])] == [("phase_success", "success over data.p")]
    write_run(tmp_path / "m" / "0", p=0.5)
    write_run(tmp_path / "m" / "1", data="binary_chain", K=2, p=0.5)
    mixed = add_success(load_runs(tmp_path / "m", progress=False))
    assert [n for n, _, _ in wandb_run.figures(mixed, [])] == ["phase_success_random_walk", "phase_success_binary_chain"]


def test_learning_curves_of_two_data_families_name_the_family_not_a_p_of_none(tmp_path):
    for i, p in enumerate((0.1, 0.5)):
        write_run(tmp_path / "s" / str(i), p=p)
    write_run(tmp_path / "s" / "2", data="bayes_net", K=3, N=17)
    runs = add_success(load_runs(tmp_path / "s", progress=False))
    (_, _, draw), = curves.curve_figures(runs, [])
    fig = draw()
    titles = sorted(a.title.get_text() for a in fig.axes if a.title.get_text())
    assert titles == ["bayes_net (1 run)", "random_walk, p=0.1 (1 run)", "random_walk, p=0.5 (1 run)"]
    plt.close(fig)


def test_a_facet_no_run_reached_says_so_and_draws_no_empty_heatmap(tmp_path):
    for i, (K, N) in enumerate([(5, 21), (6, 97)]):   # two sweeps of other shapes: K=5 has no N=97 run
        write_run(tmp_path / "s" / str(i), p=0.5, K=K, N=N)
    fig = phase_diagram(load_runs(tmp_path / "s", progress=False), "data.p", row="data.K", col="data.N")
    panels = fig.axes[:4]   # the 2 × 2 facets, in row order
    drawn = [bool(a.axison) for a in panels]
    assert drawn == [True, False, False, True]
    said = [t.get_text() for a in panels if not a.axison for t in a.texts]
    assert said == ["K = 5, N = 97:\nno runs", "K = 6, N = 21:\nno runs"]
    plt.close(fig)


def test_an_inline_figure_of_a_diagram_in_an_axes_ends_at_its_title(grid):
    """A notebook shows the figure cropped to its tight box: the title of one line is one line tall, and the
    box ends at its top (no blank band above the panel)."""
    fig, ax = plt.subplots(figsize=(5, 2.5))
    phase_diagram(add_success(load_runs(grid, progress=False)), "data.p", "init", ax=ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title, tight = ax.title.get_window_extent(renderer), fig.get_tightbbox(renderer)
    line = 9 * fig.dpi / 72
    lines = ax.get_title().count("\n") + 1   # (model.normalize=auto differs with init: a clause names it)
    assert title.height < (lines + 1) * line
    assert tight.y1 * fig.dpi - title.y1 < 1 and tight.y1 * fig.dpi - ax.get_window_extent().y1 < title.height + 3 * line
    plt.close(fig)


def test_the_sweeps_analysis_run_says_when_it_starts_how_to_skip_it_and_what_it_cost(grid, capsys):
    from omegaconf import OmegaConf

    from analysis.callback import WandbAnalysis

    cfg = OmegaConf.create({"wandb": {"mode": "offline", "analysis": True, "group": None},
                            "hydra": {"sweep": {"dir": str(grid)}, "launcher": {}}})
    WandbAnalysis().on_multirun_end(cfg)
    start, end = capsys.readouterr().out.splitlines()
    assert start == f"wandb analysis run: the runs table and phase diagram of {grid} (wandb.analysis=false skips it)"
    assert end.startswith("wandb analysis run: 4 runs, 1 figure in ") and end.endswith(f"CPU s), {grid}/wandb_analysis")
    assert sorted(p.name for p in (grid / "wandb_analysis" / "figures").iterdir()) == ["phase_success.png"]
