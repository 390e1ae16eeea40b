"""The random-init studies' analysis on synthetic run folders with known histories (tests/_fake_runs.py): the reading
table's fractions, its order, locked_position on a constructed record, the locking rate and the escape
map's theory overlay (with a stub in place of rw_sweeps.core.theory.predict). Then the claims register
(docs/claims.md): its rates' Wilson intervals, the plateau table, and the cheap claims re-checked on seeds
and shapes the docs did not use."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import claims, escape, locking
from analysis.__main__ import main
from analysis.load import load_runs
from analysis.phase import add_success, add_success_step, phase_diagram, phase_table
from rw_sweeps.core.config import RunConfig
from rw_sweeps.core.markov import Pi
from rw_sweeps.core.training import Record, locked_position, summary

from ._fake_runs import write_run

K, CHANCE = 6, 1 / 6
EVERY = 10


def history(steps=1000, acc=lambda t: CHANCE, parent=lambda t: 0.01, cos=lambda t: 0.9):
    return [{"step": t, "test_acc": acc(t), "parent_attention": parent(t), "v_pi_cosine": cos(t)}
            for t in range(0, steps + 1, EVERY)]


def step_up(at, low, high):
    return lambda t: high if t >= at else low


def deterministic_snapshots(seed, steps=1000):
    """p = 1 snapshots: V random at step 0, then ∝ 1 through 700; at 1000 Πᵀ (no longer ∝ 1) but for
    seed 3; the variance of X·S ≈ 0 through 700 but for seed 2 at step 400 (and at step 0, outside
    the window, for every seed)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in sorted({0, 100, 200, 400, 700, 1000} & set(range(steps + 1)) | {steps}):
        V = rng.normal(0, 0.01, (K, K)) if t == 0 else 0.1 * np.ones((K, K)) + 1e-6 * rng.normal(size=(K, K))
        if t == 1000 and seed != 3:
            V = Pi(K, 1.0).T
        h_var = np.full(K, 1e-2 if t == 0 else 1e-3 if (t == 400 and seed == 2) else 1e-9)
        out.append({"step": t, "V": V.tolist(), "h_var": h_var.tolist()})
    return out


@pytest.fixture
def readings(tmp_path):
    """fig6_readings: readings C (positional, 50 steps: nothing can be said), B (none), A (whole), in that
    folder order; fig10_readings: the FFN before and after. Built-in fractions in the docstrings below."""
    root, i = tmp_path / "f6", 0

    def run(**kw):
        nonlocal i
        write_run(root / str(i), experiment="fig6_readings", init="gaussian", sigma=0.01, lr=0.01, **kw)
        i += 1

    for seed in range(2):                                   # C: too short for any claim
        run(normalize="positional", p=0.5, seed=seed, steps=50, history=history(50))
        run(normalize="positional", p=1.0, seed=seed, steps=50, history=history(50),
            snapshots=deterministic_snapshots(seed, 50))
    for seed in range(4):                                   # B: fig6a 1/4, fig11 0/4
        acc = step_up(200, CHANCE, 0.49) if seed == 0 else (lambda t: CHANCE)
        run(normalize="none", p=0.5, seed=seed, steps=1000, history=history(acc=acc),
            status="diverged" if seed == 3 else "done")
    run(normalize="none", p=0.5, seed=4, steps=1000, status="failed", history=history())  # says nothing
    for seed in range(4):                                   # A: 6a 3/4, 11 2/4, 6c 3/4, 12 3/4, 13 3/4
        run(normalize="whole", p=0.5, seed=seed, steps=1000,
            history=history(acc=step_up(50 if seed == 3 else 400, CHANCE, 0.49),
                            parent=step_up(900, 0.01, 0.95 if seed < 2 else 0.5), cos=lambda t: 0.95))
        run(normalize="whole", p=1.0, seed=seed, steps=1000,
            history=history(acc=step_up(900, CHANCE, 1.0) if seed == 3 else (lambda t: CHANCE)),
            snapshots=deterministic_snapshots(seed))

    qa = tmp_path / "f10"
    j = 0
    for ffn, maj, pref in (("before", [0.97, 0.97, 0.97, 0.6], [0.5, 0.55, 0.45, 0.7]),   # 10a 3/4, 10c 3/4
                           ("after", [0.5] * 4, [0.5] * 4)):                             # 10a 0/4, 10c 4/4
        for seed in range(4):
            for task, N, acc in (("qa_majority", 17, maj[seed]), ("qa_preference", 19, pref[seed])):
                write_run(qa / str(j), experiment="fig10_readings", data=task, K=19, N=N, init="gaussian",
                          sigma=0.01, lr=0.1, model="transformer_ffn", ffn=ffn, seed=seed, steps=100,
                          history=history(100, acc=step_up(60, 0.5, acc), cos=lambda t: None))
                j += 1
    return [root, qa]


def test_each_claim_holds_for_the_fraction_of_seeds_built_in(readings):
    runs = load_runs(*readings, progress=False)
    table = claims.reading_table(runs)
    assert table.attrs["reading_keys"] == ["model.normalize", "model.ffn"]
    got = {(r["model.normalize"], r["model.ffn"]): r for _, r in table.iterrows()}
    nan = np.nan
    expected = {  # fig6a, fig6c, fig11, fig12, fig13, fig10a, fig10c
        ("whole", "before"): [nan, nan, nan, nan, nan, 0.75, 0.75],
        ("whole", "–"): [0.75, 0.75, 0.5, 0.75, 0.75, nan, nan],
        ("whole", "after"): [nan, nan, nan, nan, nan, 0.0, 1.0],
        ("none", "–"): [0.25, nan, 0.0, nan, nan, nan, nan],
        ("positional", "–"): [nan] * 7,
    }
    assert set(got) == set(expected)
    for key, want in expected.items():
        np.testing.assert_array_equal(got[key][list(claims.CLAIMS)].astype(float), want, err_msg=str(key))
    # the failed run is not scored, the diverged one fails
    assert got[("none", "–")]["n_fig6a"] == 4 and got[("none", "–")]["runs"] == 5
    assert got[("whole", "–")]["seeds"] == 4 and got[("whole", "–")]["n_fig12"] == 4
    # best first: the mean over the claims with data; a reading that can say nothing comes last
    assert [(r["model.normalize"], r["model.ffn"]) for _, r in table.iterrows()] == list(expected)
    assert table["mean"].iloc[:4].tolist() == pytest.approx([0.75, 0.7, 0.5, 0.125])


def test_the_claims_read_the_right_steps(tmp_path):
    """Each threshold, on its edge: reaching at step 100 exactly counts, at 90 does not; a window from
    step 100 (the random V(0) is not judged); a short run says nothing."""
    def score(**kw):
        kw = {"experiment": "fig6_readings", "init": "gaussian", "sigma": 0.01, **kw}
        run = write_run(tmp_path / str(len(list(tmp_path.iterdir()))), **kw)
        df = load_runs(run, progress=False)
        return claims.score_runs(df).iloc[0].to_dict()

    assert score(p=0.5, steps=1000, history=history(acc=step_up(100, CHANCE, 0.47)))["fig6a"] == 1.0
    assert score(p=0.5, steps=1000, history=history(acc=step_up(90, CHANCE, 0.47)))["fig6a"] == 0.0
    assert score(p=0.5, steps=1000, history=history(acc=step_up(100, CHANCE, 0.469)))["fig6a"] == 0.0
    assert np.isnan(score(p=0.5, steps=500, history=history(500))["fig6a"])
    s = score(p=1.0, steps=1000, history=history(acc=lambda t: 0.989), snapshots=deterministic_snapshots(0))
    assert (s["fig6c"], s["fig12"], s["fig13"]) == (1.0, 1.0, 1.0) and np.isnan(s["fig6a"])
    assert score(p=1.0, steps=1000, history=history(acc=step_up(1000, CHANCE, 0.99)))["fig6c"] == 0.0

    def qa(acc):
        return score(experiment="fig10_readings", data="qa_majority", K=19, N=17, model="transformer_ffn",
                     ffn="before", steps=100, history=history(100, acc=acc, cos=lambda t: None))["fig10a"]

    # Fig. 10(a) is a curve that reaches ~100 % and stays: a peak that falls back does not count
    assert qa(step_up(60, 0.5, 0.95)) == 1.0
    assert qa(lambda t: 1.0 if 10 <= t < 30 else 0.5) == 0.0


def test_the_cli_writes_the_reading_table_as_csv_markdown_and_a_report_section(readings, tmp_path):
    out = tmp_path / "out"
    assert main([*map(str, readings), "--out", str(out), "--paper"]) == 0
    csv = pd.read_csv(out / "readings.csv")
    assert csv["model.normalize"].tolist()[:2] == ["whole", "whole"] and csv["fig10a"].iloc[0] == 0.75
    md = (out / "readings.md").read_text().splitlines()
    assert "| whole | before | 4 | – | – | – | – | – | 0.75 | 0.75 | 0.75 |" in md
    page = (out / "index.html").read_text()
    assert "<h2>Reading search</h2>" in page and "Fig. 10(a)" in page


# ---------------------------------------------------------------------------------------------
# locked_position and the locking rate

def _record(attention, status="done", steps=50, snap_step=None):
    rec = Record(RunConfig(), Path("/tmp/h4-never-written"), status=status, steps=steps)
    rec.snapshots = [{"step": snap_step if snap_step is not None else steps, "attention": attention}]
    return rec


def test_locked_position_is_the_wrong_argmax_holding_most_of_the_attention():
    N = 97
    S = np.full(N, 0.3 / (N - 1))
    S[4] = 0.7                                    # x_5 holds 0.7, the parent x_96 almost nothing
    assert locked_position(S.tolist()) == 5
    assert summary(_record(S.tolist()), 0.0)["locked_position"] == 5
    parent = np.full(N, 0.3 / (N - 1))
    parent[N - 2] = 0.7                           # on the parent: not locked
    assert locked_position(parent.tolist()) is None
    spread = np.full(N, 0.6 / (N - 2))
    spread[10] = 0.4                              # the argmax, but not a majority
    assert locked_position(spread.tolist()) is None
    query = np.full(N, 0.1 / (N - 1))
    query[N - 1] = 0.9                            # the query is not a real token
    assert locked_position(query.tolist()) is None
    assert summary(_record(S.tolist(), status="diverged"), 0.0)["locked_position"] is None
    assert summary(_record(S.tolist(), snap_step=40), 0.0)["locked_position"] is None  # not final
    assert summary(Record(RunConfig(), Path("/tmp/h4-x"), status="failed"), 0.0)["locked_position"] is None


def test_the_locking_rate_diagram_counts_locked_seeds(tmp_path):
    locked = {(100, 25): {0, 1}, (100, 97): {0}, (1000, 25): set(), (1000, 97): {3}}
    i = 0
    for (n, N), seeds in locked.items():
        for seed in range(4):
            diverged = (n, N) == (1000, 97) and seed == 2
            write_run(tmp_path / "lock" / str(i), experiment="locking", n_train=n, N=N, seed=seed,
                      status="diverged" if diverged else "done",
                      summary={"locked_position": 7 if seed in seeds else None})
            i += 1
    runs = locking.add_locked(load_runs(tmp_path / "lock", progress=False))
    t = phase_table(runs, "data.n_train", "data.N", "locked").set_index(["data.N", "data.n_train"])
    assert t["value"].to_dict() == pytest.approx({(25, 100): 0.5, (97, 100): 0.25, (25, 1000): 0.0,
                                                 (97, 1000): 1 / 3})
    assert t.loc[(97, 1000), "n_valid"] == 3      # the diverged run has no final attention
    (name, caption, draw), = locking.locking_figures(runs, [])
    assert name == "locking_rate" and "100: 0.375 (8 runs), 1000: 0.143 (7 runs)" in caption
    ax = draw().axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["0.00", "0.25", "0.33", "0.50"]


# ---------------------------------------------------------------------------------------------
# the escape map's theory overlay, with a stub theory

# (σ, η) -> measured break steps of seeds 0 and 1, and the step the stub theory predicts (None: never)
ESCAPE = {(1e-2, 0.1): ((100, 100), 200), (1e-6, 0.1): ((400, 200), 800),
          (1e-2, 0.01): ((None, None), 50), (1e-6, 0.01): ((None, None), None)}


class StubTheory:
    def __init__(self):
        self.calls = []

    def __call__(self, cfgs):
        self.calls.append(len(cfgs))
        return [{"predicted_break_step": ESCAPE[(c.init.sigma, c.optim.lr)][1], "growth": [1.0] * 3,
                 "reason": None, "trap": True} for c in cfgs]


@pytest.fixture
def escape_sweep(tmp_path):
    root, i = tmp_path / "esc", 0
    for (sigma, lr), (measured, _) in ESCAPE.items():
        for seed, m in enumerate(measured):
            write_run(root / str(i), experiment="escape", p=1.0, init="gaussian", sigma=sigma, lr=lr,
                      seed=seed, steps=1000, history=history(), summary={"symmetry_break_step": m})
            i += 1
    return root


def test_the_predictions_are_cached_per_run_and_redone_when_a_config_changes(escape_sweep):
    stub = StubTheory()
    runs = load_runs(escape_sweep, progress=False)
    got = escape.add_predictions(runs, stub)
    want = [ESCAPE[(s, lr)][1] for s, lr in zip(runs["init.sigma"], runs["optim.lr"])]
    assert got["predicted_break_step"].tolist() == [np.inf if w is None else w for w in want]
    assert stub.calls == [8]
    cache = json.loads((escape_sweep / escape.CACHE).read_text())["runs"]
    assert set(cache) == set(runs["run_id"]) and "growth" not in next(iter(cache.values()))
    escape.add_predictions(runs, stub)
    assert stub.calls == [8]                      # all cached
    cfg = yaml.safe_load((escape_sweep / "3" / "config.yaml").read_text())
    cfg["optim"]["eps"] = 0.2
    (escape_sweep / "3" / "config.yaml").write_text(yaml.safe_dump(cfg))
    escape.add_predictions(runs, stub)
    assert stub.calls == [8, 1]                   # only the changed run


def test_the_break_step_diagram_prints_measured_over_predicted(escape_sweep):
    runs = escape.add_predictions(load_runs(escape_sweep, progress=False), StubTheory())
    fig = phase_diagram(runs, "init.sigma", "optim.lr", "symmetry_break_step", agg="median",
                        theory="predicted_break_step")
    t = fig.phase_table
    cells = t.set_index(["init.sigma", "optim.lr"])
    assert cells.loc[(1e-6, 0.1), "value"] == 300 and cells.loc[(1e-6, 0.1), "theory"] == 800
    texts = sorted(x.get_text() for x in fig.axes[0].texts)
    assert texts == ["100 / 200", "300 / 800", "never / 50", "never / never"]
    outlined = [p for p in fig.axes[0].patches if p.get_linestyle() == ":"]
    assert len(outlined) == 1                     # (1e-6, 0.01): theory says never


def test_the_escape_figures_and_the_ratio_of_predicted_to_measured(escape_sweep):
    runs = add_success_step(add_success(load_runs(escape_sweep, progress=False)))
    st = escape.ratio_stats(escape.add_predictions(runs, StubTheory()))
    # ratios 200/100, 200/100, 800/400, 800/200 = 2, 2, 2, 4
    assert (st["n"], st["median"], st["q25"], st["q75"]) == (4, 2.0, 2.0, 2.5)
    assert (st["both_never"], st["measured_never_only"], st["predicted_never_only"]) == (2, 2, 0)
    notes = []
    figs = list(escape.escape_figures(runs, notes, predict=StubTheory()))
    assert [n for n, _, _ in figs] == ["escape_success", "escape_break", "escape_success_step",
                                       "escape_theory"]
    assert "median 2, quartiles 2–2.5" in figs[-1][1] and not notes
    for _, _, draw in figs:
        assert draw().axes
    def broken(cfgs):
        raise ImportError("no rw_sweeps.core.theory")

    (escape_sweep / escape.CACHE).unlink()   # else the cached predictions are drawn
    notes = []
    figs = list(escape.escape_figures(runs, notes, predict=broken))
    assert [n for n, _, _ in figs] == ["escape_success", "escape_break", "escape_success_step"]
    assert "no theory overlay (ImportError: no rw_sweeps.core.theory)" in notes[0]


# ---------------------------------------------------------------------------------------------
# the claims register (docs/claims.md)

def test_the_wilson_interval_is_the_textbook_one_and_keeps_its_properties():
    """Wilson's 95 % score interval: 0 of 10 → (0, 0.2775) and 5 of 10 → (0.2366, 0.7634), the values every
    table of it gives; inside [0, 1], containing k/n, mirrored under k ↦ n − k, narrowing as n grows."""
    assert claims.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert claims.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)
    for n in (1, 8, 16, 300):
        for k in range(n + 1):
            lo, hi = claims.wilson(k, n)
            assert 0 <= lo <= k / n <= hi <= 1
            assert (lo, hi) == pytest.approx(tuple(1 - x for x in claims.wilson(n - k, n)[::-1]), abs=1e-12)
    assert np.diff(claims.wilson(2, 8)) > np.diff(claims.wilson(20, 80)) > np.diff(claims.wilson(200, 800))
    assert claims.rate(1, 8) == "1 of 8 (0.02–0.47)"


def test_the_plateau_table_counts_runs_above_half_the_gap_per_cell_and_step():
    """A run is on the unigram plateau at step t when (test_loss − opt_loss)/(unigram_loss − opt_loss) > 0.5
    at its row of step t; a run whose baselines coincide (p + q = 1) is not counted."""
    rows = []
    runs = {("a", True): (0.9, 1.0), ("b", True): (0.1, 0.9), ("c", True): (0.0, 0.0), ("d", False): (0.0, 0.2),
            ("e", False): (0.6, 0.4)}  # relative loss at step 400, at step 200; opt 0.5, unigram 0.7
    for (path, tie), (end, mid) in runs.items():
        rows += [{"path": path, "model.tie": tie, "step": t, "test_loss": 0.5 + 0.2 * r, "opt_loss": 0.5,
                  "unigram_loss": 0.7} for t, r in ((0, 1.0), (200, mid), (400, end))]
    rows += [{"path": "f", "model.tie": True, "step": t, "test_loss": 0.69, "opt_loss": 0.6931,
              "unigram_loss": 0.6934} for t in (0, 200, 400)]
    t = claims.plateau_table(pd.DataFrame(rows), (200, 400), ["model.tie"]).set_index("model.tie")
    assert t.loc[True, ["on_200", "n_200", "on_400", "n_400"]].tolist() == [2, 3, 1, 3]
    assert t.loc[False, ["on_200", "n_200", "on_400", "n_400"]].tolist() == [0, 2, 1, 2]
    assert (t.loc[True, "lo_400"], t.loc[True, "hi_400"]) == pytest.approx(claims.wilson(1, 3))


def _deep(start, seed, steps=12):
    from rw_sweeps.core import trainer

    from .test_config import composed

    cfg = composed("model=gpt_eq21", "model.residual=true", "model.n_layer=2", "model.M=40", "model.normalize=none",
                   "data.K=4", "data.N=13", "data.p=1", "data.n_train=48", "data.n_test=48", "init=zero",
                   f"optim.steps={steps}", "eval_every=1", f"data.start={start}", f"seed={seed}")
    return trainer.of(cfg).train([cfg], [tmp_run()], progress=False)[0]


def tmp_run():
    import tempfile

    return Path(tempfile.mkdtemp())


def test_register_depth_breaks_the_symmetric_point_only_through_unequal_start_counts():
    """docs/deeper-models.md on a shape and seed it did not use (K = 4, N = 13, M = 40, 48 walks, p = 1, two
    residual eq. 2.1 layers, zero init, seed 21): walks started uniformly at random, whose start counts
    differ, break the symmetric point within 12 steps; the same walks started every node equally often
    (data.start=balanced) keep the attention uniform to rounding (≤ 1e-10) and the accuracy at chance."""
    from rw_sweeps.core import data

    from .test_config import composed

    uniform = composed("data.K=4", "data.N=13", "data.p=1", "data.n_train=48", "seed=21")
    assert len(set(np.bincount(data.make(uniform.data, 21)[0].tokens[:, 0].numpy(), minlength=4))) > 1
    broke = _deep("uniform", 21)
    assert broke.history[-1]["attention_spread"] > 1e-3
    held = _deep("balanced", 21)
    assert max(r["attention_spread"] for r in held.history) <= 1e-10
    assert held.history[-1]["test_acc"] == 0.25
