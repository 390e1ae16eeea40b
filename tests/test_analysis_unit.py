"""analysis on synthetic run folders (tests/_fake_runs.py, the README's results contract to the letter): fast checks
of loading, caching, success, the phase table and the CLI's errors. The end-to-end checks on real
sweeps made by launch.py are in test_analysis.py."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import load as load_mod
from analysis.__main__ import main
from rw_sweeps.core.markov import Pi
from analysis.load import CACHE_NAME, load_history, load_runs, load_snapshots
from analysis.phase import (add_success, add_success_step, phase_table, swept_keys,
                            theory_fails)

from ._fake_runs import make_sweep, set_result, write_run

GRID = {"data.p": [0.0, 0.5, 1.0], "init": ["zero"]}


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    make_sweep(root, GRID, seeds=(0, 1))
    return root


def test_Pi_is_the_cyclic_walk_of_paper_section_1():
    P = Pi(6, 0.7)
    assert np.allclose(P.sum(1), 1)
    assert P[0, 1] == 0.7 and np.isclose(P[0, 5], 0.3) and P[5, 0] == 0.7 and P[0, 2] == 0
    assert np.array_equal(Pi(2, 0.3), [[0, 1], [1, 0]])   # K = 2: i+1 ≡ i−1, both moves land there


def test_one_row_per_run_with_dotted_config_init_name_summary_and_path(sweep):
    df = load_runs(sweep, progress=False)
    assert len(df) == 6 and df["path"].is_unique
    assert {"data.p", "data.K", "optim.lr", "model.M", "wandb.group", "init",
            "status", "test_acc", "opt_acc", "symmetry_break_step", "run_id", "path"} <= set(df)
    assert "init.name" not in df and set(df["init"]) == {"zero"}
    assert "init.sigma" not in df   # zero init has no σ (a legacy config.yaml wrote σ = 0 for it)
    cfg = yaml.safe_load((sweep / "3" / "config.yaml").read_text())
    row = df[df["run"] == "3"].iloc[0]
    assert row["data.p"] == cfg["data"]["p"] and row["seed"] == cfg["seed"]
    assert json.loads(row["snapshot_steps"]) == cfg["snapshot_steps"]   # lists kept as JSON text
    assert df["run"].tolist() == [str(i) for i in range(6)]
    assert "data.p" in df.attrs["config_keys"] and "test_acc" not in df.attrs["config_keys"]


def test_warm_load_reads_only_what_changed(sweep, monkeypatch):
    first = load_runs(sweep, progress=False)
    assert (sweep / CACHE_NAME).exists()
    reads = []
    real = load_mod._read_run
    monkeypatch.setattr(load_mod, "_read_run", lambda p: reads.append(p.name) or real(p))
    stamp = (sweep / CACHE_NAME).stat().st_mtime_ns
    again = load_runs(sweep, progress=False)
    assert reads == [] and (sweep / CACHE_NAME).stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(first, again)

    set_result(sweep / "2", test_acc=0.123456)   # a run rewritten (e.g. rerun)...
    write_run(sweep / "6", p=0.5, seed=9)        # ...and one added
    df = load_runs(sweep, progress=False)
    assert sorted(reads) == ["2", "6"] and len(df) == 7
    assert df.loc[df["run"] == "2", "test_acc"].item() == 0.123456
    shutil.rmtree(sweep / "6")                   # a run removed leaves the table too
    assert len(load_runs(sweep, progress=False)) == 6


def test_partial_sweep_skips_unfinished_and_corrupt_folders_and_lists_them(sweep):
    (sweep / "0" / "summary.json").write_text('{"status": "done", "test_ac')   # torn write
    (sweep / "1" / "summary.json").unlink()                                     # still running
    (sweep / "2" / "config.yaml").write_text("data: [unclosed\n")
    (sweep / "7").mkdir()                        # a job folder Hydra made, nothing in it yet
    (sweep / ".submitit").mkdir()                # launcher files: not runs
    (sweep / "logs").mkdir()
    df = load_runs(sweep, progress=False)
    assert sorted(df["run"]) == ["3", "4", "5"]
    skipped = {os.path.basename(s["path"]): s["status"] for s in df.attrs["skipped"]}
    assert skipped == {"0": "corrupt", "1": "unfinished", "2": "corrupt", "7": "unfinished"}
    # the cache does not hide them on the next (warm) load
    assert len(load_runs(sweep, progress=False).attrs["skipped"]) == 4


def test_run_folders_sweeps_and_duplicates(sweep, tmp_path):
    single = write_run(tmp_path / "single", p=0.1)
    df = load_runs(sweep, sweep / "0", single, progress=False)
    assert len(df) == 7                           # run 0 given twice counts once
    assert df.loc[df["path"] == str(single), "sweep"].item() == str(single)
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path / "nope")


def test_a_key_that_changes_type_between_runs_still_caches(tmp_path):
    root = tmp_path / "sweep"
    for i, note in enumerate(["M", 1001]):  # a summary field of a later version, text in one run, a number in another
        write_run(root / str(i), seed=i, summary={"note": note})
    load_runs(root, progress=False)
    assert sorted(map(str, load_runs(root, progress=False)["note"])) == ["1001", "M"]


def test_success_is_acc_at_least_opt_minus_tol_and_done():
    df = pd.DataFrame({"status": ["done", "done", "done", "failed", "diverged"],
                       "test_acc": [0.52, 0.479, 0.481, 0.5, 0.9],   # 0.52 > OPT: finite test set
                       "opt_acc": [0.5, 0.5, 0.5, 0.5, 0.9], "data.K": [6] * 5})
    out = add_success(df, tol=0.02)
    assert out["success"].tolist() == [True, False, True, False, False]
    assert add_success(df, tol=0.0)["success"].tolist() == [True, False, False, False, False]
    assert np.isclose(out["acc_norm"][2], (0.481 - 1 / 6) / (0.5 - 1 / 6))
    chance = add_success(pd.DataFrame({"status": ["done"], "test_acc": [0.5], "opt_acc": [0.5],
                                       "data.K": [2]}))
    assert chance["acc_norm"].isna().all()        # OPT = 1/K: nothing to normalise by


def test_theory_marks_only_zero_init_on_deterministic_walks_with_N_eq_rK_plus_1():
    df = pd.DataFrame({"init": ["zero", "zero", "zero", "gaussian", "zero", "zero"],
                       "data.p": [0.0, 1.0, 0.5, 1.0, 1.0, 0.5],
                       "data.K": [6, 6, 6, 6, 6, 19], "data.N": [97, 97, 97, 97, 98, 17],
                       "data.name": ["random_walk"] * 5 + ["qa_majority"]})
    assert theory_fails(df).tolist() == [True, True, False, False, False, False]


def test_swept_keys_skip_seed_and_keys_riding_on_others(tmp_path):
    root = tmp_path / "s"
    make_sweep(root, {"init": ["zero", "gaussian"], "optim.lr": [0.1, 1.0], "data.p": [0.5, 1.0]},
               seeds=(0, 1), sigma=0.01)
    df = load_runs(root, progress=False)
    # model.normalize varies too, but only with init: no axis of its own; init itself is the
    # zero column of the σ axis (every gaussian run here has σ = 0.01)
    assert df["model.normalize"].nunique() == 2 and df.loc[df["init"] == "gaussian", "init.sigma"].nunique() == 1
    assert swept_keys(df) == ["data.p", "init.sigma", "optim.lr"]
    assert swept_keys(df[df["init"] == "zero"]) == ["data.p", "optim.lr"]


def test_phase_table_is_the_success_rate_per_cell_with_zero_init_as_its_own_sigma_column(tmp_path):
    root = tmp_path / "s"
    make_sweep(root, {"data.p": [0.5, 1.0], "init": ["zero"]}, seeds=(0, 1, 2))
    make_sweep(tmp_path / "g", {"data.p": [0.5, 1.0], "init.sigma": [0.01, 0.1]}, seeds=(0, 1),
               init="gaussian")
    # seed 1 at p = 0.5 (zero init) just misses OPT
    set_result(root / "1", test_acc=0.47)
    df = add_success(load_runs(root, tmp_path / "g", progress=False))
    t = phase_table(df, "data.p", "init.sigma").set_index(["init.sigma", "data.p"])
    assert t.loc[("zero", 0.5), "value"] == pytest.approx(2 / 3) and t.loc[("zero", 0.5), "n"] == 3
    assert t.loc[("zero", 1.0), "value"] == 0 and t.loc[("zero", 1.0), "theory_fail"]
    assert t.loc[(0.01, 1.0), "n"] == 2 and not t.loc[(0.01, 1.0), "theory_fail"]
    assert len(t) == 6


def test_history_and_snapshots_in_long_form(sweep):
    df = load_runs(sweep, progress=False)
    h = load_history(df, columns=["data.p", "seed"])
    assert len(h) == 6 * 11 and {"step", "test_acc", "test_kl", "data.p", "seed", "path"} <= set(h)
    s = load_snapshots(df.head(2))
    assert s["step"].tolist() == [0, 1, 2, 5, 10] * 2 and s["V"].iloc[0].shape == (6, 6)
    with open(sweep / "0" / "history.jsonl", "a") as f:
        f.write('{"step": 11, "test_a')        # a torn last line is skipped
    assert len(load_history([sweep / "0"])) == 11


def test_first_success_step_comes_from_the_history(sweep):
    df = add_success_step(add_success(load_runs(sweep, progress=False)))
    hist = load_history(df[df["data.p"] == 0.5].head(1))
    opt = 0.5
    expected = hist.loc[hist["test_acc"] >= opt - 0.02, "step"].min()
    assert df.loc[(df["data.p"] == 0.5), "success_step"].iloc[0] == expected
    assert df.loc[df["data.p"] == 1.0, "success_step"].isna().all()


@pytest.mark.parametrize("argv, message", [
    (["{nope}", "--out", "{out}"], "not a folder"),
    (["{sweep}", "--out", "{out}", "--tol", "-1"], "--tol -1: must be in [0, 1)"),
    (["{sweep}", "--out", "{out}", "--x", "data.q"], "--x data.q: no such key"),
    (["{sweep}", "--out", "{out}", "--x", "data.p", "--y", "data.p"], "must be different keys"),
    (["{sweep}", "--out", "{out}", "--metric", "status"], "--metric status: not a numeric"),
    (["{sweep}", "--out", "{sweep}"], "is a sweep folder"),
    (["{sweep}", "--out", "{file}"], "is a file, not a folder"),
    (["{sweep}", "--out", "{file}/report"], "is a file, not a folder"),
])
def test_cli_rejects_bad_input_in_one_line(sweep, tmp_path, capsys, argv, message):
    (tmp_path / "afile").write_text("a user's file, never to be replaced by a report")
    fill = {"sweep": str(sweep), "out": str(tmp_path / "out"), "nope": str(tmp_path / "nope"),
            "file": str(tmp_path / "afile")}
    with pytest.raises(SystemExit) as e:
        main([a.format(**fill) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("python -m analysis: error:")


def test_cli_on_a_sweep_with_no_finished_run_says_so(tmp_path, capsys):
    (tmp_path / "empty" / "0").mkdir(parents=True)
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no finished runs" in capsys.readouterr().err
    assert "unfinished" in (tmp_path / "out" / "index.html").read_text()


@pytest.mark.parametrize("text", [
    "a: 1\nb:\n  c: x\n  d:\n  - 1\n  - -2.5\n  e: null\nf: []\ng: {}\nh:\n",
    "a:\n  b:\n    c: 1.0e-05\n  d: 0.001\ne: M\nf: true\ng: ~\nh: 1e-3\n",
    "seed: 0\nsnapshot_steps:\n- 0\n- 1000\nwandb:\n  tags: []\n  group: tmp/x\n",
    "a: 'quoted'\n", "a: [1, 2]\n", "a:\n- b: 1\n", "a: x # comment\n", "a: -x\n",
    "a: 2025-01-01\n", "- 1\n- 2\n",
])
def test_fast_config_reader_agrees_with_pyyaml(text):
    from rw_sweeps.core.readers import yaml_value
    assert yaml_value(text, "config.yaml") == yaml.safe_load(text)


def test_fast_config_reader_agrees_with_pyyaml_on_every_fake_config(sweep):
    from rw_sweeps.core.readers import block_yaml as _block_yaml
    for f in sweep.glob("*/config.yaml"):
        assert _block_yaml(f.read_text()) == yaml.safe_load(f.read_text())   # no fallback


def test_old_run_folders_read_as_what_they_trained(tmp_path):
    """model.normalize was a bool, and optim.name did not exist: an old folder reads as whole/none and the
    defaults, so that it sits in one table with new ones, no false axis."""
    root = tmp_path / "s"
    for i, (init, old) in enumerate([("zero", True), ("gaussian", True), ("gaussian", False)]):
        run = write_run(root / str(i), init=init, sigma=0.01 if init == "gaussian" else 0.0, seed=i)
        if old:
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            cfg["model"]["normalize"] = init == "gaussian"
            del cfg["model"]["ffn"], cfg["optim"]["name"], cfg["optim"]["beta1"]
            (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    df = load_runs(root, progress=False)
    assert df["model.normalize"].tolist() == ["none", "whole", "whole"]
    assert set(df["optim.name"]) == {"gd"}
    # keys of other options (the FFN's, Adam's) are no column: these runs' options have none
    assert "model.ffn" not in df and "optim.beta1" not in df
    assert swept_keys(df) == ["init.sigma"]


def test_a_p_by_q_diagram_draws_makkuvas_p_plus_q_equals_1_line_and_no_circle_opt():
    import itertools as it

    from analysis.phase import phase_diagram

    rows = [{"data.p": p, "data.q": q, "data.name": "binary_chain", "data.K": 2, "data.N": 97, "init": "zero",
             "success": p + q < 1, "status": "done", "seed": 0} for p, q in it.product((0.1, 0.5, 0.9), repeat=2)]
    fig = phase_diagram(pd.DataFrame(rows), "data.p", "data.q")
    table = fig.phase_table
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.lines if ln.get_label() == "p + q = 1"]
    x, y = line.get_data()
    # cell centres: p = 0.1 is column 0 (x 0.5); q runs from the top row (0.9, y 0.5) down
    assert (x[0], y[0]) == pytest.approx((0.5, 0.5)) and (x[-1], y[-1]) == pytest.approx((2.5, 2.5))
    from matplotlib.text import Text

    assert not any("OPT" in t.get_text() for t in fig.findobj(Text))  # max(p, 1−p) is the circle's
    assert sorted(table["value"].tolist()) == [0.0] * 6 + [1.0] * 3


def test_sweeps_of_several_data_families_get_phase_diagrams_per_family(tmp_path):
    # a circle sweep over p and a QA sweep over seeds share no axis: one set of diagrams each, on its own keys
    root = tmp_path / "mixed"
    for i, p in enumerate((0.1, 0.5, 0.9)):
        write_run(root / str(i), p=p)
    for i in range(2):
        write_run(root / str(3 + i), data="qa_majority", K=19, N=17, seed=i, init="gaussian", sigma=0.01)
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    pngs = sorted(p.name for p in (tmp_path / "out").glob("phase_success_*.png"))
    assert pngs == ["phase_success_qa_majority.png", "phase_success_random_walk.png",
                    "phase_success_step_qa_majority.png", "phase_success_step_random_walk.png"]
    html = (tmp_path / "out" / "index.html").read_text()
    assert "success over data.p (random_walk)" in html


@pytest.mark.parametrize("cache", [False, True])
def test_a_summary_bool_that_some_runs_lack_is_a_nullable_boolean_column(tmp_path, cache):
    """`trap` is in eq. 2.1's summaries, not model=gpt's: in a mixed sweep its column is pandas' `boolean`
    (True, False, <NA>), as the README's nullable keys are, so `df[df.trap]` and `~df.trap` mean what they
    say (an object column of True/False/NaN makes the mask raise and `~True` -2)."""
    write_run(tmp_path / "0", p=1.0)
    write_run(tmp_path / "1", seed=1)
    write_run(tmp_path / "2", seed=2)   # a summary without `trap`, as a model=gpt run's
    set_result(tmp_path / "0", trap=True)
    set_result(tmp_path / "1", trap=False)
    for _ in range(2 if cache else 1):   # the second read comes from the sealed runs.parquet
        df = load_runs(tmp_path, cache=cache)
    assert str(df["trap"].dtype) == "boolean"
    assert df["trap"].tolist() == [True, False, pd.NA]
    assert df[df["trap"].fillna(False)]["run"].tolist() == ["0"]
    assert (~df["trap"]).tolist() == [False, True, pd.NA]


@pytest.mark.parametrize("cache", [False, True])
def test_a_summary_text_field_null_in_every_run_is_still_a_text_column(tmp_path, cache):
    """`error` (null in every done run) and `relative_loss_null` (null wherever relative_loss is a number) are
    text: their columns are pandas' `str` even when no run of the load has a value, so that
    `df[df.relative_loss_null.str.startswith("model.readout")]` works on any sweep, not only on one with a reason."""
    write_run(tmp_path / "0")
    write_run(tmp_path / "1", seed=1)
    for run in ("0", "1"):
        set_result(tmp_path / run, relative_loss_null=None)
    for _ in range(2 if cache else 1):   # the second read comes from the sealed runs.parquet
        df = load_runs(tmp_path, cache=cache)
    for col in ("error", "relative_loss_null"):
        assert str(df[col].dtype) == "str", (col, df[col].dtype)
        assert df[col].isna().all()
    assert df[df["relative_loss_null"].str.startswith("model.readout")].empty
