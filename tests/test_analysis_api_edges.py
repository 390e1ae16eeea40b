"""The analysis Python API at its edges: success where it cannot be told from chance, one clear line for a
misused argument, and captions that say what a figure pooled or left out. Synthetic run folders
(tests/_fake_runs.py), no training."""
from __future__ import annotations

import math
import warnings

import matplotlib
import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.curves import curve_figures
from analysis.load import load_history, load_runs
from analysis.phase import add_success, add_success_step, phase_diagram, tol_problem

from ._fake_runs import make_sweep, write_run

matplotlib.use("Agg")


def _table(**cols) -> pd.DataFrame:
    return pd.DataFrame({"status": ["done"] * len(cols["test_acc"]), **cols})


def test_success_is_na_where_opt_is_within_tol_of_chance():
    # the complete graph K16: OPT 1/15, chance 1/16, within 0.02 of each other; a circle at p = 0.5, K = 6 is not
    df = _table(test_acc=[0.0625, 0.5, 0.30], opt_acc=[1 / 15, 0.5, 0.5], **{"data.K": [16, 6, 6]})
    out = add_success(df, tol=0.02)
    assert str(out["success"].dtype) == "boolean"
    assert out["success"].isna().tolist() == [True, False, False]
    assert out["success"].dropna().tolist() == [True, False]
    # a smaller tolerance tells success from chance again there
    assert add_success(df, tol=0.001)["success"].tolist() == [False, True, False]


@pytest.fixture
def chance_grid(tmp_path):
    """Two runs at K = 6 (OPT 0.5) and two at K = 3 whose OPT, 0.35, is within 0.02 of chance 1/3 (as the
    complete graph's 1/15 is of 1/16), at chance: success undefined there."""
    root = tmp_path / "s"
    make_sweep(root, {"data.K": [6]}, seeds=(0, 1), p=0.5)
    for i in (2, 3):
        write_run(root / str(i), K=3, p=0.5, seed=i, acc=0.34, summary={"opt_acc": 0.35})
    return root


def test_the_diagrams_draw_no_success_where_it_cannot_be_told_from_chance(chance_grid):
    runs = add_success_step(add_success(load_runs(chance_grid, progress=False)))
    assert runs.loc[runs["data.K"] == 3, "success"].isna().all()
    assert runs.loc[runs["data.K"] == 3, "success_step"].isna().all()   # not step 0: undefined
    for metric in ("success", "success_step"):
        fig = phase_diagram(runs, "data.K", metric=metric)
        cells = fig.phase_table.set_index("data.K")
        assert math.isnan(cells.loc[3, "value"]) and cells.loc[3, "n_undefined"] == 2
        assert cells.loc[6, "n_undefined"] == 0 and cells.loc[6, "n_valid"] == 2
        title = fig._suptitle.get_text().replace("\n", " ")
        assert "1 cell where OPT is within tol 0.02 of chance 1/K (2 runs): success undefined, not drawn" in title
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert texts.count("undefined") == 1


def test_the_report_says_where_success_is_undefined(chance_grid, tmp_path, capsys):
    assert main([str(chance_grid), "--out", str(tmp_path / "rep")]) == 0
    err = capsys.readouterr().err
    assert "note: 2 run(s) where OPT is within tol 0.02 of chance 1/K: success undefined" in err
    table = pd.read_parquet(tmp_path / "rep" / "runs.parquet")
    assert table.loc[table["data.K"] == 3, "success"].isna().all()
    assert table.loc[table["data.K"] == 6, "success"].notna().all()


@pytest.mark.parametrize("tol", [2, 1, -0.1, float("nan"), "0.1", True])
def test_add_success_refuses_the_tols_the_cli_refuses(tol):
    df = _table(test_acc=[0.5], opt_acc=[0.5], **{"data.K": [6]})
    with pytest.raises(ValueError, match=r"^add_success: tol=.*: must be in \[0, 1\)") as e:
        add_success(df, tol=tol)
    assert "\n" not in str(e.value)
    assert tol_problem(0.02) is None and tol_problem(0) is None and tol_problem(tol) is not None


def test_the_cli_tol_rule_is_add_successs(tmp_path, capsys):
    make_sweep(tmp_path / "s", {"data.p": [0.5]})
    with pytest.raises(SystemExit):
        main([str(tmp_path / "s"), "--out", str(tmp_path / "rep"), "--tol", "2"])
    assert f"--tol 2: {tol_problem(2)}" in capsys.readouterr().err


@pytest.fixture
def grid(tmp_path):
    root = tmp_path / "g"
    make_sweep(root, {"data.p": [0.5, 1.0], "init": ["zero"]}, seeds=(0, 1))
    return root


@pytest.mark.parametrize("kw, said", [
    ({"x": "p"}, "phase_diagram: x 'p': no such column (did you mean data.p?); swept keys: data.p"),
    ({"x": "data.p", "y": "sigma"}, "phase_diagram: y 'sigma': no such column"),
    ({"x": "data.p", "metric": "accuracy"}, "phase_diagram: metric 'accuracy': no such column (try success,"),
    ({"x": "data.p", "metric": "success_step"},
     "phase_diagram: metric 'success_step': not in the table; call add_success_step(runs) first"),
])
def test_phase_diagram_names_a_column_it_lacks_in_one_line(grid, kw, said):
    with pytest.raises(ValueError) as e:
        phase_diagram(load_runs(grid, progress=False), **kw)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_an_empty_folder_is_a_warning_and_its_diagram_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match=r"^load_runs: no finished runs in .*empty \(0 folders skipped"):
        runs = load_runs(tmp_path / "empty", progress=False)
    with pytest.raises(ValueError, match="^phase_diagram: the table has no runs"):
        phase_diagram(runs, "data.p")


def test_load_history_takes_a_sweep_folder_as_load_runs_does(grid):
    whole = load_history(load_runs(grid, progress=False))
    assert len(whole) == 4 * 11
    for given in (str(grid), grid, [str(grid)], [grid / "0", grid / "1"]):
        got = load_history(given)
        assert len(got) == (22 if isinstance(given, list) and len(given) == 2 else 44)
    with pytest.raises(FileNotFoundError, match=r"^load_history: no such run or sweep folder: .*nope$"):
        load_history([grid / "nope"])
    with pytest.raises(TypeError, match="^load_history: runs=5: give load_runs' table"):
        load_history(5)


def test_columns_no_run_has_are_a_warning_naming_them(grid):
    runs = load_runs(grid, progress=False)
    with pytest.warns(UserWarning, match=r"load_history: columns= .*'data.pp' \(did you mean 'data.p'\?\)"):
        hist = load_history(runs, columns=["data.pp", "seed"])
    assert "seed" in hist and "data.pp" not in hist
    with pytest.warns(UserWarning, match=r"load_runs: columns= names no column of the runs, left out: 'bogus'"):
        some = load_runs(grid, columns=["data.p", "bogus"], progress=False)
    assert "data.p" in some and "bogus" not in some
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every name there: no warning
        load_history(runs, columns=["data.p"])


def test_a_diagram_across_protocols_names_the_keys_that_differ_with_its_axes(tmp_path):
    make_sweep(tmp_path / "a", {"data.p": [0.5, 1.0]}, init="zero", lr=1.0, steps=10)
    make_sweep(tmp_path / "b", {"data.p": [0.5, 1.0]}, init="gaussian", sigma=0.01, lr=0.01, steps=20)
    runs = load_runs(tmp_path / "a", tmp_path / "b", progress=False)
    title = phase_diagram(runs, "data.p", "init.sigma")._suptitle.get_text().replace("\n", " ")
    assert "the cells also differ in model.normalize, optim.lr, optim.steps (they change with the axes)" in title
    one = phase_diagram(load_runs(tmp_path / "a", progress=False), "data.p")._suptitle.get_text()
    assert "differ" not in one


def test_the_curves_caption_counts_the_runs_it_leaves_out(tmp_path):
    make_sweep(tmp_path / "s", {"data.p": [0.5]}, seeds=(0, 1))
    write_run(tmp_path / "s" / "2", p=0.5, seed=2, status="failed")
    runs = load_runs(tmp_path / "s", progress=False)
    assert (runs["status"] == "failed").sum() == 1
    (_, caption, _), = curve_figures(runs, [])
    assert "every finished run of the cell; not drawn: 1 failed run" in caption
    (_, whole, _), = curve_figures(runs[runs["status"] == "done"], [])
    assert "not drawn" not in whole
