"""Sentences built from the runs they describe: the paper figures' captions state what the run shows beside what
the paper shows, the adaptive diagram's caption names a boundary only where one is drawn, and the depth entry of
docs/deeper-models.md (the symmetric point survives rounding for a time that shrinks with depth and precision)
holds on a shape the doc's tables did not use."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from matplotlib.contour import ContourSet

from analysis import load_runs
from analysis.adaptive import adaptive_figures
from analysis.figures import paper_figures
from analysis.report import negative_loss_note
from rw_sweeps.core import trainer

from ._fake_runs import write_run
from .test_config import CONF, composed


def _fig6_sweep(root: Path, parent: float, cos: float, acc: float) -> pd.DataFrame:
    """A fig6 sweep of two runs: the random walk (p = 0.5) with the given summary, and the deterministic one."""
    for i, p in enumerate((0.5, 1.0)):
        summary = {"parent_attention": parent, "v_pi_cosine": cos} if p == 0.5 else None
        write_run(root / str(i), p=p, init="gaussian", sigma=0.01, lr=0.01, steps=20, experiment="fig6",
                  acc=acc if p == 0.5 else None, summary=summary)
    return load_runs(root, progress=False)


def _captions(runs: pd.DataFrame) -> dict[str, str]:
    return {name: caption for name, caption, _ in paper_figures(runs, [])}


def test_fig_11_caption_states_the_runs_own_numbers_and_says_when_it_is_not_the_papers_picture(tmp_path):
    """A p = 0.5 run with parent attention 0.0105, cos(V, Πᵀ) 0.31 and test accuracy 0.17: the caption gives
    those numbers and says it is not the paper's picture; it never says V recovers Πᵀ of the run."""
    caption = _captions(_fig6_sweep(tmp_path / "s", 0.0105, 0.31, 0.17))["fig11"]
    assert "This run at step 20: test_acc 0.17 (OPT 0.5, 1/K 0.167)" in caption
    assert "parent attention 0.0105" in caption and "cos(V, Πᵀ) 0.31" in caption
    assert "not the paper's picture" in caption
    assert "The paper: V recovers Πᵀ" in caption and ": V recovers Πᵀ, attention on the parent." not in caption


def test_fig_11_caption_calls_a_run_that_meets_the_reading_tables_thresholds_the_papers_picture(tmp_path):
    caption = _captions(_fig6_sweep(tmp_path / "s", 0.995, 0.93, 0.5))["fig11"]
    assert "parent attention 0.995" in caption and caption.endswith(": the paper's picture.")


def test_fig_6_curves_caption_gives_each_settings_final_accuracy_against_opt(tmp_path):
    """The learning curves' caption: per p, the runs' final test accuracy (mean and range) against OPT, so a
    sweep that ends at chance says so beside the paper's claim."""
    root = tmp_path / "s"
    for i, (p, acc) in enumerate(((0.5, 0.17), (0.5, 0.19), (1.0, 0.16), (1.0, 0.18))):
        write_run(root / str(i), p=p, seed=i, init="gaussian", sigma=0.01, lr=0.01, steps=20, experiment="fig6",
                  acc=acc)
    caption = _captions(load_runs(root, progress=False))["fig6_curves"]
    assert "The paper: p = 0.5 close to OPT (50 %) after about 400 steps" in caption
    assert "data.p = 0.5: test_acc 0.18 (0.17–0.19) over 2 run(s), OPT 0.5" in caption
    assert "data.p = 1: test_acc 0.17 (0.16–0.18) over 2 run(s), OPT 1" in caption


def _plane(values: list[float]) -> tuple[pd.DataFrame, dict]:
    """An adaptive sweep's runs on a 2-axis plane (p × lr, so no theory overlay), one run a point, and its record."""
    at = [(0.1, 0.1), (0.9, 0.1), (0.1, 1.0), (0.9, 1.0), (0.5, 0.5)]
    runs = pd.DataFrame({"data.p": [a for a, _ in at], "optim.lr": [b for _, b in at], "test_acc": values,
                         "opt_acc": 0.9, "steps": 10, "status": "done", "sweep": "sw", "init": "zero"})
    rec = {"axes": [{"key": "data.p", "lo": 0.0, "hi": 1.0, "log": False},
                    {"key": "optim.lr", "lo": 0.1, "hi": 1.0, "log": False}],
           "metric": "test_acc", "level": 0.5, "tol": 0.02, "crossed": [], "points": []}
    return runs, rec


def _level_sets(fig, level: float) -> int:
    return sum(isinstance(c, ContourSet) and list(c.levels) == [level] for ax in fig.axes for c in ax.collections)


@pytest.mark.parametrize("values, drawn", [([0.1, 0.2, 0.3, 0.2, 0.4], False), ([0.1, 0.9, 0.2, 0.8, 0.6], True)])
def test_the_adaptive_caption_names_the_boundary_only_where_the_diagram_draws_it(values, drawn):
    """No point reaches the level: the caption says no boundary is drawn (with the values' range) and the figure has
    no level set; points on both sides: the caption names the black boundary and the figure draws it."""
    runs, rec = _plane(values)
    (name, caption, draw), = adaptive_figures(runs, {"sw": rec}, [])
    fig = draw()
    assert _level_sets(fig, 0.5) == int(drawn)
    assert ("black: the boundary test_acc = 0.5" in caption) == drawn
    assert ("no boundary drawn: no panel's points cross test_acc = 0.5 (the points' values 0.1–0.4)"
            in caption) == (not drawn)


def _horizon(n_layer: int, precision: str, steps: int = 30) -> int | None:
    """The step at which balanced zero-init walks at p = 1 leave the symmetric point (attention spread > 1e-3),
    or None if they hold it for `steps` GD steps, on a shape the doc's tables did not use (K 5, N 21, M 30,
    50 walks)."""
    cfg = composed("experiment=deep_trap", "hydra.mode=RUN", "data.K=5", "data.N=21", "model.M=30", "data.n_train=50",
                   "data.n_test=50", "data.start=balanced", "data.p=1", f"model.n_layer={n_layer}", "init.sigma=0",
                   f"optim.steps={steps}", f"precision={precision}", "seed=0")
    run = trainer.of(cfg).train([cfg], [Path(tempfile.mkdtemp())], progress=False)[0]
    return next((h["step"] for h in run.history if h["attention_spread"] > 1e-3), None)


def test_the_balanced_symmetric_point_survives_rounding_for_a_time_that_shrinks_with_depth_and_precision():
    """docs/deeper-models.md: four layers in float32 leave the point within 30 steps (at step 24 here), where
    two layers in float32 and four in float64 hold it (those break at 212 and 47–48)."""
    deep_single = _horizon(4, "float32")
    assert deep_single is not None and deep_single <= 30
    assert _horizon(2, "float32") is None
    assert _horizon(4, "float64") is None


def test_the_report_says_why_a_test_loss_is_negative_only_where_one_is():
    runs = pd.DataFrame({"test_loss": [-0.53, 0.2, None]})
    note = negative_loss_note(runs)
    assert note.startswith(" 1 run(s) have a negative test_loss (lowest -0.53)") and "−log(f_y + ε)" in note
    assert negative_loss_note(runs.assign(test_loss=[0.1, 0.2, None])) == ""


def _preset_line(preset: str) -> str | None:
    """The line a preset's launch prints as it starts (its `hydra.callbacks.preset_note`), or None without one."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    note = cfg.hydra.callbacks.get("preset_note")
    return None if note is None else instantiate(note).line(cfg)


def test_a_preset_that_does_not_reproduce_its_figure_says_so_as_its_launch_starts():
    assert _preset_line("fig6").startswith("experiment=fig6: does not reproduce Fig. 6. All 6 runs end at chance")
    assert _preset_line("fig6_readings").startswith("experiment=fig6_readings: the reading search for Fig. 6: no "
                                                     "reading reproduces Fig. 6")
    assert _preset_line("fig4") is None
