"""Sentences and refusals that say only what is true: the way to write init=zero on the σ axis names the
model.normalize that makes it init=zero; a forgotten -m on a number key offers only -m; the retry switch is
quoted for the shell and its allowed values named; every paper caption ends in a verdict from the run's numbers;
a matrix panel never shows "-0.00"; the attention key names only the bars drawn; the report says which field
finds no run leaving the symmetric point, with the step counted in its number."""
from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from analysis import load_runs
from analysis.__main__ import unbroken
from analysis.figures import paper_figures, verdict
from hydra_plugins.rw_sweeps_plugins.launcher import kept_line
from rw_sweeps.core import trainer
from rw_sweeps.core.config import describe_unknown
from rw_sweeps.core.registry import OPTIONS

from ._fake_runs import write_run
from .test_config import composed
from .test_errors_keep_what_helps import refusal


# ------------------------------------------------------------------------------------------ init=zero on σ's axis
def test_the_way_to_sweep_sigma_with_zero_init_names_model_normalize_none():
    text = describe_unknown(OPTIONS["init"]["zero"], "init.", "sigma")
    assert text.endswith("; to sweep init.sigma with init=zero, write init=gaussian init.sigma=0,… "
                         "model.normalize=none (init.sigma = 0 with model.normalize=none is init=zero; model.normalize=auto is whole under "
                         "init=gaussian)"), text


def _history(*overrides: str) -> list[dict]:
    cfg = composed("hydra.mode=RUN", "data.n_train=40", "data.n_test=40", "optim.steps=6", "seed=0", *overrides)
    return trainer.of(cfg).train([cfg], [Path(tempfile.mkdtemp())], progress=False)[0].history


def test_sigma_zero_with_normalize_none_trains_as_zero_init_and_with_auto_does_not():
    """What the refusal says, measured: σ = 0 with model.normalize=none is init=zero step for step; with the
    default auto (whole under a Gaussian init) the attention stays at the symmetric point where zero init's
    leaves it."""
    zero = _history("init=zero")
    assert _history("init=gaussian", "init.sigma=0", "model.normalize=none") == zero
    auto = _history("init=gaussian", "init.sigma=0")
    assert max(h["attention_spread"] for h in zero) > 0.5 and max(h["attention_spread"] for h in auto) < 1e-3


# ------------------------------------------------------------------------------------------ a forgotten -m
def test_a_comma_list_on_a_number_key_offers_only_multirun():
    assert refusal("data.p=0,0.5") == ("invalid config: data.p=0,0.5: a comma list in a single run: to sweep over "
                                       "it, add --multirun (-m) to your command line")


def test_a_comma_list_on_a_string_key_still_offers_quoting_and_not_a_list():
    assert refusal("model.normalize=none,whole") == (
        "invalid config: model.normalize=none,whole: a comma list in a single run: to sweep over it, add --multirun "
        "(-m) to your command line; for a string quote it: \"model.normalize='none,whole'\"")


# ------------------------------------------------------------------------------------------ the retry switch
def test_the_kept_line_quotes_the_retry_switch_for_the_shell():
    line = kept_line([{"status": "diverged"}], ("failed",))
    assert line.endswith("; 'hydra.launcher.retry=[diverged,failed]' trains them again"), line


def test_a_retry_that_is_not_a_list_is_refused_with_its_allowed_values():
    assert refusal("-m", "hydra.launcher.retry=diverged") == (
        "invalid config: hydra.launcher.retry='diverged': must be a list of outcomes a relaunch trains again, of "
        "failed, diverged (e.g. 'hydra.launcher.retry=[failed,diverged]', or [] to keep every run as it ended)")


# ------------------------------------------------------------------------------------------ paper captions
def _captions(root: Path) -> dict[str, str]:
    return {name: caption for name, caption, _ in paper_figures(load_runs(root, progress=False), [])}


def test_a_fig_4_run_at_p_1_is_not_called_the_papers_picture(tmp_path):
    """The tester's run: p = 1, OPT 1, parent attention 0.0104, cos(V, Πᵀ) 0.408, test_acc 0.162."""
    write_run(tmp_path / "s" / "0", p=1.0, steps=50, experiment="fig4", acc=0.162,
              summary={"parent_attention": 0.0104, "v_pi_cosine": 0.408})
    caption = _captions(tmp_path / "s")["fig4_run0"]
    assert caption.endswith(": not the paper's picture (not met: test_acc ≥ OPT − 0.03; parent attention ≥ 0.9; "
                            "cos(V, Πᵀ) ≥ 0.9)."), caption


def test_a_fig_5_run_at_chance_with_symmetric_attention_is_the_papers_picture(tmp_path):
    write_run(tmp_path / "s" / "0", p=1.0, steps=50, experiment="fig5")
    assert _captions(tmp_path / "s")["fig5_run0"].endswith(": the paper's picture.")


def test_fig_6_at_chance_through_step_1000_is_not_the_papers_picture_and_fig_12_cannot_say_without_its_window(
        tmp_path):
    for i, (p, acc) in enumerate(((0.5, 0.17), (1.0, 0.16))):
        write_run(tmp_path / "s" / str(i), p=p, init="gaussian", sigma=0.01, lr=0.01, steps=1000, experiment="fig6",
                  acc=acc, history=[{"step": 0}, {"step": 1000}], snapshots=[{"step": 0}, {"step": 1000}])
    caps = _captions(tmp_path / "s")
    assert ": not the paper's picture (not met: p = 0.5 first reaches OPT − 0.03 at a step in [100, 1000], every "
    "run; met: p = 1 stays below 0.99 test accuracy through step 1000, every run)." in caps["fig6_curves"]
    assert caps["fig12"].endswith(": cannot say whether it is the paper's picture (not measured: p = 1: cos(V, 1) "
                                  "≥ 0.99 at every snapshot in steps 100–700, < 0.99 at step 1000).")
    assert "cannot say whether it is the paper's picture" in caps["fig13"]


def test_every_paper_caption_ends_in_a_verdict(tmp_path):
    for i, (exp, p) in enumerate((("fig4", 0.5), ("fig5", 1.0), ("fig6", 0.5), ("fig6", 1.0))):
        write_run(tmp_path / "s" / str(i), p=p, steps=20, experiment=exp)
    caps = {n: c for n, c in _captions(tmp_path / "s").items() if not n.startswith("fig2_")}
    assert sorted(caps) == ["fig11", "fig12", "fig13", "fig4_run0", "fig5_run0", "fig6_curves"]
    assert all("the paper's picture" in c for c in caps.values()), caps


@pytest.mark.parametrize("checks,want", [
    ({"a ≥ 1": True, "b ≥ 2": True}, "the paper's picture"),
    ({"a ≥ 1": True, "b ≥ 2": False}, "not the paper's picture (not met: b ≥ 2; met: a ≥ 1)"),
    ({"a ≥ 1": None, "b ≥ 2": True}, "cannot say whether it is the paper's picture (met: b ≥ 2; not measured: a ≥ 1)"),
    ({}, "cannot say whether it is the paper's picture ()"),
])
def test_the_verdict_is_the_papers_picture_only_where_every_check_holds(checks, want):
    assert verdict(checks) == want


# ------------------------------------------------------------------------------------------ panels
def _fig_4(root: Path, V: np.ndarray):
    """Fig. 4 of a p = 0.5 run whose last snapshot holds V, its attention all on the parent (the query's 0)."""
    write_run(root / "0", p=0.5, steps=5, experiment="fig4", snapshots=[{"step": 5, "V": V.tolist()}])
    (_, _, draw), = [f for f in paper_figures(load_runs(root, progress=False), []) if f[0] == "fig4_run0"]
    return {ax.get_title(): ax for ax in draw().axes}


def test_a_matrix_panel_never_shows_minus_zero_nor_a_tick_mark_beside_its_numbers(tmp_path):
    V = np.full((6, 6), -0.001)
    V[0, 0] = 0.5
    axes = _fig_4(tmp_path / "s", V)
    v = axes["(b) V at step 5"]
    assert [t.get_text() for t in v.texts] == ["0.50"] + ["0.00"] * 35
    assert all(t.get_text() in ("0.00", "0.50") for t in axes["Πᵀ"].texts)
    assert v.yaxis.get_tick_params()["length"] == 0 and axes["Πᵀ"].yaxis.get_tick_params()["length"] == 0
    plt.close("all")


def test_the_attention_key_names_no_query_bar_of_height_zero(tmp_path):
    axes = _fig_4(tmp_path / "s", np.eye(6))
    label = axes["(c) mean attention S_j, step 5"].get_xlabel()
    assert label == "position j  (red: position N−1, a walk's parent)", label
    plt.close("all")


# ------------------------------------------------------------------------------------------ the report
def test_the_unbroken_row_names_its_field_counts_one_step_and_says_where_predictions_broke():
    runs = pd.DataFrame({"init.sigma": [0.01, 0.01, 0.01], "init": "gaussian", "data.name": "random_walk",
                         "data.p": [0.1, 0.5, 1.0],
                         "data.K": 6, "data.N": 97, "optim.steps": 1, "status": "done", "trap": False,
                         "symmetry_break_step": pd.array([None] * 3, dtype="Int64"),
                         "prediction_break_step": pd.array([0, 0, None], dtype="Int64")})
    assert unbroken(runs, "init.sigma") == (
        ". σ = 1e-2: no run's attention left the symmetric point (symmetry_break_step: attention spread > 1e-3) "
        "within its 1 step, though 2 of 3 runs' predictions left the symmetric point's (prediction_break_step 0), "
        "so its cells measure only that horizon")
