"""analysis end to end, on real small sweeps made by launch.py.

Each sweep is made once per session. Expected values are computed here straight from the run
files (config.yaml, summary.json, history.jsonl, snapshots.jsonl), not through `analysis`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import figures, load_runs
from rw_sweeps.core.readers import block_yaml as _block_yaml
from analysis.phase import add_success, phase_diagram

from .conftest import ROOT, launch, python
from .wandb_files import read_run

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

TOL = 0.02
# a few seconds per sweep; with n_train < 1000 some p = 0.5 seeds fail, which the phase cells
# are meant to show anyway
TINY = ["data.n_train=200", "data.n_test=200", "optim.steps=10", "model.M=200",
        "wandb.mode=disabled"]
PAPER_PNGS = {"fig2_pi_K6", "fig2_pi_K20", "fig4_run0", "fig5_run0", "fig8_run0", "fig9_run0",
              "fig6_curves", "fig7_curves", "fig10_curves", "fig11", "fig12", "fig13"}


def sweep(tmp_path_factory, name, *overrides):
    d = tmp_path_factory.mktemp("sweeps") / name
    r = launch("-m", *overrides, f"hydra.sweep.dir={d}", cwd=d.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def analyse(*args, env=None):
    """The CLI as users run it: `python -m analysis ARGS`, a process of its own (`conftest.python`)."""
    e = {**os.environ, "WANDB_SILENT": "true", "MPLBACKEND": "Agg", **(env or {})}
    return python("-m", "analysis", *map(str, args), cwd=ROOT, env=e)


def run_files(sweep_dir):
    """{run folder: (config, summary)} read by hand."""
    out = {}
    for d in sorted(Path(sweep_dir).iterdir()):
        if (d / "summary.json").exists():
            out[d] = (yaml.safe_load((d / "config.yaml").read_text()),
                      json.loads((d / "summary.json").read_text()))
    return out


def succeeded(summary):
    acc = summary["test_acc"]
    return summary["status"] == "done" and acc is not None and acc >= summary["opt_acc"] - TOL


def html_tables(page: str) -> list[list[list[str]]]:
    return [[re.findall(r"<t[dh]>(.*?)</t[dh]>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", t)]
            for t in re.findall(r"<table>(.*?)</table>", page, flags=re.S)]


# ---------------------------------------------------------------------------------------------
# sweeps, made once

@pytest.fixture(scope="session")
def done_when(tmp_path_factory):
    """The issue's own command (paper-size data, 10 steps)."""
    return sweep(tmp_path_factory, "done_when", "data.p=0,0.1,0.5,1", "init=zero", "seed=0,1",
                 "optim.steps=10", "wandb.mode=disabled")


@pytest.fixture(scope="session")
def done_when_report(done_when, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "done_when"
    r = analyse(done_when, "--out", out, "--wandb")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def grid(tmp_path_factory):
    """p × σ ∈ {0 (zero init), 0.01, 0.1} × 3 seeds = 27 runs: mixed success rates, and some
    diverged runs (σ = 0.1 without normalisation)."""
    return sweep(tmp_path_factory, "grid", "data.p=0,0.5,1", "init=gaussian",
                 "init.sigma=0,0.01,0.1", "seed=0,1,2", "model.normalize=none", *TINY)


@pytest.fixture(scope="session")
def experiments(tmp_path_factory):
    """Every experiment preset, shrunk: fig4/5/8/9 as one sweep, fig6, fig7, fig10."""
    return [sweep(tmp_path_factory, "fig4589", "experiment=fig4,fig5,fig8,fig9", *TINY),
            *(sweep(tmp_path_factory, e, f"experiment={e}", *TINY)
              for e in ("fig6", "fig7", "fig10"))]


@pytest.fixture(scope="session")
def random_init_sweeps(tmp_path_factory):
    """The random-init presets, shrunk: fig10_readings keeps its 100 steps (Fig. 10's claims are about them),
    the others run a few dozen steps."""
    small = ["data.n_train=200", "data.n_test=200", "model.M=200", "wandb.mode=disabled"]
    return [sweep(tmp_path_factory, "fig6_readings", "experiment=fig6_readings", "seed=0",
                  "optim.steps=20", "eval_every=5", *small),
            sweep(tmp_path_factory, "fig10_readings", "experiment=fig10_readings", "seed=0,1", *small),
            sweep(tmp_path_factory, "escape", "experiment=escape", "data.p=0.0,0.9",
                  "init.sigma=1e-6,1e-2", "optim.lr=0.1,1.0", "precision=float64", "seed=0,1",
                  "optim.steps=30", "eval_every=5", *small),
            sweep(tmp_path_factory, "locking", "experiment=locking", "data.n_train=100,300", "data.N=25",
                  "seed=range(0,4)", *small)]


@pytest.fixture(scope="session")
def random_init_report(random_init_sweeps, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "random_init"
    r = analyse(*random_init_sweeps, "--out", out, "--paper")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def chains_report(tmp_path_factory):
    """The chain families' presets, shrunk, in one report: the binary chain's p × q grid, the lazy walk, the graphs,
    order-k and in-context chains."""
    small = ["data.n_train=100", "data.n_test=100", "model.M=200", "optim.steps=5", "seed=0", "wandb.mode=disabled"]
    sweeps = [sweep(tmp_path_factory, "makkuva_pq", "experiment=makkuva_pq", "data.p=0.2,0.8", "data.q=0.2,0.8",
                    "init=zero", *small),
              sweep(tmp_path_factory, "lazy", "experiment=lazy", "data.stay=0.0,0.5", "data.p=0.5,1.0", *small),
              sweep(tmp_path_factory, "graphs", "experiment=graphs", *small),
              sweep(tmp_path_factory, "kth_order", "experiment=kth_order", "data.N=17", *small),
              sweep(tmp_path_factory, "icl", "experiment=icl", "data.N=9,17", "init=zero", *small)]
    out = tmp_path_factory.mktemp("reports") / "chains"
    r = analyse(*sweeps, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="session")
def paper_report(experiments, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "paper"
    r = analyse(*experiments, "--out", out, "--paper")
    assert r.returncode == 0, r.stderr
    return out


# ---------------------------------------------------------------------------------------------
# the table

def test_the_table_has_one_row_per_run_one_column_per_quantity_and_every_config_and_summary_field(grid):
    files = run_files(grid)
    df = load_runs(grid, progress=False)
    assert len(df) == len(files) == 27 and df["path"].is_unique
    config, summary = next(iter(files.values()))

    def dotted(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from dotted(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    # summary.json's copies of config keys (p, lr, sigma, …) are the config's columns, once
    echoed = {"p", "K", "N", "M", "model", "data", "sigma", "lr", "eps"}
    expected = {"init" if k == "init.name" else k for k in dotted(config)} | (set(summary) - echoed) | {"path"}
    assert expected <= set(df.columns), expected - set(df.columns)
    assert not echoed & set(df.columns)
    for k in ("symmetry_break_step", "steps", "eval_step"):  # nullable integers, never floats or objects
        assert str(df[k].dtype) == "Int64", (k, df[k].dtype)
    rows = df.set_index("path")
    for d, (cfg, s) in files.items():
        assert _block_yaml((d / "config.yaml").read_text()) == cfg   # the fast path, no fallback
        row = rows.loc[str(d)]
        assert (row["data.p"], row["init"], row["init.sigma"], row["seed"]) == (
            cfg["data"]["p"], cfg["init"]["name"], cfg["init"]["sigma"], cfg["seed"])
        assert row["status"] == s["status"] and row["run_id"] == s["run_id"]
        assert (np.isnan(row["test_acc"]) if s["test_acc"] is None
                else row["test_acc"] == s["test_acc"])


def test_phase_cells_equal_the_success_rates_computed_by_hand(grid):
    by_hand: dict[tuple, list[bool]] = {}
    for cfg, s in run_files(grid).values():
        sigma = "zero" if cfg["init"]["sigma"] == 0 else cfg["init"]["sigma"]
        by_hand.setdefault((cfg["data"]["p"], sigma), []).append(succeeded(s))
    rates = {k: np.mean(v) for k, v in by_hand.items()}
    assert 0 < np.mean(list(rates.values())) < 1      # the grid really mixes success and failure

    df = add_success(load_runs(grid, progress=False), TOL)
    fig = phase_diagram(df, "data.p", "init.sigma")
    table = fig.phase_table
    got = {(r["data.p"], r["init.sigma"]): r["value"] for _, r in table.iterrows()}
    assert got.keys() == rates.keys()
    assert all(got[k] == pytest.approx(rates[k]) for k in rates)
    assert dict(zip(zip(table["data.p"], table["init.sigma"]), table["n"])) == {
        k: len(v) for k, v in by_hand.items()}

    # ...and the numbers printed in the drawn cells are the same
    ax = fig.axes[0]
    xs = [t.get_text() for t in ax.get_xticklabels()]
    ys = [t.get_text() for t in ax.get_yticklabels()]
    label = {0.01: "1e-2", 0.1: "1e-1", "zero": "zero"}
    printed = {(xs[int(t.get_position()[0])], ys[int(t.get_position()[1])]): t.get_text()
               for t in ax.texts}
    assert printed == {(f"{p:g}", label[s]): f"{r:.2f}" for (p, s), r in rates.items()}
    # theory: the two zero-init cells at p ∈ {0, 1} are outlined (Thm 4.1), no others
    outlined = sorted((xs[int(r.get_x())], ys[int(r.get_y())]) for r in ax.patches
                      if r.get_linestyle() == "--")
    assert outlined == [("0", "zero"), ("1", "zero")]


def test_the_issue_command_gives_zero_init_success_inside_and_failure_on_the_edge(
        done_when, done_when_report):
    runs = pd.read_parquet(done_when_report / "runs.parquet")
    assert len(runs) == 8
    ok = runs.groupby("data.p")["success"].agg(["all", "any"])
    assert ok.loc[[0.1, 0.5], "all"].all() and not ok.loc[[0.0, 1.0], "any"].any()
    assert (runs["success"] == [succeeded(s) for _, s in
                                (run_files(done_when)[Path(p)] for p in runs["path"])]).all()
    assert {"phase_success.png", "phase_symmetry_break_step.png", "phase_success_step.png",
            "index.html"} <= {f.name for f in done_when_report.iterdir()}


def test_corrupt_and_missing_summaries_are_skipped_and_counted(grid, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(grid, partial)
    expected = [s for d, (_, s) in run_files(partial).items() if d.name not in ("0", "1")]
    (partial / "0" / "summary.json").write_text('{"status": "done", "test_acc": 0.')
    (partial / "1" / "summary.json").unlink()
    r = analyse(partial, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert len(pd.read_parquet(tmp_path / "out" / "runs.parquet")) == 25

    page = (tmp_path / "out" / "index.html").read_text()
    head, row = html_tables(page)[0]
    counts = dict(zip(head, row))
    assert counts["runs"] == "25" and counts["unfinished"] == "1" and counts["corrupt"] == "1"
    for status in ("done", "failed", "diverged"):
        assert counts[status] == str(sum(s["status"] == status for s in expected)), status
    assert int(counts["diverged"]) > 0                 # σ = 0.1 without normalisation diverges
    assert str(partial / "0") in page and str(partial / "1") in page
    assert "runs 25, done" in r.stdout and "unfinished 1, corrupt 1" in r.stdout


# ---------------------------------------------------------------------------------------------
# the paper's figures

def test_every_paper_figure_renders_from_the_experiment_sweeps(paper_report):
    pngs = {p.stem: p for p in paper_report.glob("*.png")}
    assert PAPER_PNGS <= set(pngs), PAPER_PNGS - set(pngs)
    page = (paper_report / "index.html").read_text()
    for name in PAPER_PNGS:
        img = mpimg.imread(pngs[name])
        assert img.shape[0] > 200 and img.shape[1] > 300 and img[..., :3].std() > 0.05, name
        assert f"src='{name}.png'" in page


def test_the_per_run_figure_shows_the_stored_V_and_Pi_transposed(experiments):
    df = load_runs(experiments[0], progress=False)
    run = df[df["experiment"] == "fig4"].iloc[0]
    snaps = [json.loads(line) for line in open(Path(run["path"]) / "snapshots.jsonl")]
    fig = figures.fig_run(run)
    V_panel, Pi_panel = (np.asarray(ax.collections[0].get_array()).reshape(6, 6)
                         for ax in fig.axes if ax.get_title().startswith(("(b)", "Πᵀ")))
    assert np.allclose(V_panel, snaps[-1]["V"])
    p = run["data.p"]
    Pi_T = np.zeros((6, 6))
    for i in range(6):                           # π_{i,i+1} = p, π_{i,i−1} = 1 − p, cyclic
        Pi_T[(i + 1) % 6, i] += p
        Pi_T[(i - 1) % 6, i] += 1 - p
    assert np.allclose(Pi_panel, Pi_T)


def test_the_curves_are_the_mean_and_range_over_seeds(experiments):
    df = load_runs(experiments[2], progress=False)      # fig7: two QA tasks × 3 seeds
    fig = figures.fig_curves(df, ["data.name"])
    acc_axes = [ax for ax in fig.axes if ax.get_title().startswith("test accuracy")]
    assert len(acc_axes) == 2
    for ax in acc_axes:
        task = re.search(r"data.name = (\w+)", ax.get_title()).group(1)
        hists = [[json.loads(line)["test_acc"] for line in open(Path(p) / "history.jsonl")]
                 for p in df.loc[df["data.name"] == task, "path"]]
        assert len(hists) == 3
        line = ax.get_lines()[0]
        assert np.allclose(line.get_ydata(), np.mean(hists, axis=0))
        band = ax.collections[0].get_paths()[0].vertices[:, 1]
        assert np.isclose(band.min(), np.min(hists)) and np.isclose(band.max(), np.max(hists))


# ---------------------------------------------------------------------------------------------
# the report, in a real browser; wandb

def chromium_dom(out: Path, tmp_path: Path, script: str = "") -> str:
    """The report's DOM once loaded in headless Chromium, with `IMAGES ok/total` appended: how many of
    its images loaded; `script` runs first, on load (a reader's clicks)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    page = (out / "index.html").read_text()
    # the same page, plus a script that reports each image once the page has loaded
    probe = out / "_probe.html"
    probe.write_text(page.replace("</body>", """<script>
window.addEventListener('load', () => {
  SCRIPT
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.insertAdjacentHTML('beforeend', `<pre id=probe>IMAGES ${ok}/${imgs.length}</pre>`);
});</script></body>""".replace("SCRIPT", script)))
    try:
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            "--disable-quic", "--no-first-run", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={tmp_path / 'profile'}",
                            "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                           capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert re.search(r"IMAGES (\d+)/(\d+)", r.stdout), f"no probe result; chromium said: {r.stderr[-2000:]}"
    return r.stdout


@pytest.mark.parametrize("report", ["done_when_report", "paper_report", "random_init_report", "chains_report"])
def test_the_report_opens_in_headless_chromium_and_every_image_loads(report, request, tmp_path):
    out = request.getfixturevalue(report)
    m = re.search(r"IMAGES (\d+)/(\d+)", chromium_dom(out, tmp_path))
    assert int(m.group(1)) == int(m.group(2)) == len(list(out.glob("*.png"))) > 0


def test_the_report_a_reader_sees_first_every_run_sortable_and_linked_curves_and_the_config(
        done_when_report, done_when, tmp_path):
    """One row per run linked to its folder; a click on a column sorts by it; the learning curves of every
    cell; the config table marks swept keys apart and lists no other option's keys."""
    click = """const t = document.getElementById('runs'); const heads = [...t.tHead.rows[0].cells];
  const i = heads.findIndex(h => h.textContent === 'test_acc'); heads[i].click();
  const col = [...t.tBodies[0].rows].map(r => r.cells[i].textContent).filter(x => x !== '').map(Number);
  document.body.insertAdjacentHTML('beforeend', `<pre id=sorted>SORTED ${col.join(',')}</pre>`);"""
    dom = chromium_dom(done_when_report, tmp_path, click)
    accs = [float(x) for x in re.search(r'<pre id="sorted">SORTED ([0-9.,]*)</pre>', dom).group(1).split(",")]
    assert len(accs) == 8 and accs == sorted(accs)
    links = re.findall(r"<a href=\"([^\"]+)/\">(\d+)</a>", dom)
    assert len(links) == 8 and all((done_when_report / h).resolve() == (done_when / n).resolve() for h, n in links)
    assert 'src="curves_test_acc.png"' in dom and "one panel per cell of data.p" in dom
    config = dom.split("Config of")[1]
    assert "<td>data.p</td><td>0.0, 0.1, 0.5, 1.0</td><td></td><td>swept</td>" in config
    assert "data.q" not in config and "init.sigma" not in config  # another option's keys are not this sweep's


def test_the_browser_shows_a_phase_diagram_per_data_family(chains_report, tmp_path):
    dom = chromium_dom(chains_report, tmp_path)
    for family in ("binary_chain", "lazy_walk", "graph_walk", "kth_order", "icl_markov"):
        assert f'src="phase_success_{family}.png"' in dom, family
    assert "success over data.p × data.q (binary_chain)" in dom and "data.graph" in dom
    m = re.search(r"IMAGES (\d+)/(\d+)", dom)
    assert int(m.group(1)) == int(m.group(2)) == len(list(chains_report.glob("*.png")))


def test_the_browser_shows_the_reading_table_escape_map_and_locking_diagram(random_init_sweeps, random_init_report,
                                                                             tmp_path):
    dom = chromium_dom(random_init_report, tmp_path)
    for section in ("Reading search", "Escape map (beyond the paper)",
                    "Wrong-position locking (beyond the paper)"):
        assert f"<h2>{section}</h2>" in dom
    for name in ("escape_success", "escape_break", "escape_success_step", "escape_theory", "locking_rate"):
        assert f'src="{name}.png"' in dom, name
    # the reading table: one row per reading, its Fig. 10 cells the fractions counted here from the files
    head, *rows = next(t for t in html_tables(dom) if "Fig. 10(a)" in t[0])
    keys = ["model.normalize", "model.ffn", "optim.reduction", "optim.name"]
    assert head[:4] == keys
    readings = {}
    for d, (cfg, s) in {**run_files(random_init_sweeps[0]), **run_files(random_init_sweeps[1])}.items():
        m, o = cfg["model"], cfg["optim"]
        key = (m["normalize"], m["ffn"] if m["name"] == "transformer_ffn" else "–", o["reduction"], o["name"])
        hist = [json.loads(line) for line in open(d / "history.jsonl")]
        if cfg["data"]["name"] == "qa_majority":
            at_100 = [h["test_acc"] for h in hist if h["step"] <= 100][-1]  # where the curve is at step 100
            readings.setdefault(key, []).append(at_100 >= 0.95)
        else:
            readings.setdefault(key, [])
    assert len(rows) == len(readings) == 12 + 16
    col = head.index("Fig. 10(a)")
    shown = {tuple(r[:4]): r[col] for r in rows}
    assert shown == {k: f"{np.mean(v):.2f}" if v else "–" for k, v in readings.items()}


def test_wandb_gets_the_figures_in_an_analysis_run_of_the_sweeps_group(done_when,
                                                                      done_when_report):
    wb = read_run(done_when_report)
    group = yaml.safe_load((done_when / "0" / "config.yaml").read_text())["wandb"]["group"]
    assert wb["job_type"] == "analysis" and wb["group"] == group
    logged = {k.split("/")[0] for h in wb["history"] for k in h}   # images: "name/path", ...
    assert {p.stem for p in done_when_report.glob("*.png")} <= logged
    assert wb["summary"]["runs_done"] == 8
    media = list(done_when_report.glob("wandb/offline-run-*/files/media/images/*.png"))
    assert len(media) == len(list(done_when_report.glob("*.png")))


# ---------------------------------------------------------------------------------------------
# model=gpt sweeps: the loss against both baselines, Edelman et al.'s three strategies, attention maps

@pytest.fixture(scope="session")
def gpt_sweep(tmp_path_factory):
    return sweep(tmp_path_factory, "edelman_icl", "experiment=edelman_icl", "data.N=17", "data.batch=8",
                 "data.n_test=32", "optim.steps=30", "eval_every=10", "seed=0", "wandb.mode=disabled")


@pytest.fixture(scope="session")
def gpt_report(gpt_sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "gpt"
    r = analyse(gpt_sweep, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def test_the_strategy_curves_are_the_runs_own_kl_values(gpt_sweep):
    from analysis.models import _strategy_kl

    runs = load_runs(gpt_sweep)
    settings = runs.sort_values("model.n_layer")
    fig = _strategy_kl(runs, settings, ["model.n_layer"])
    for ax, (_, run) in zip(fig.axes, settings.iterrows()):
        lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
        assert set(lines) == {"uniform", "unigram", "bigram"}
        for name in lines:  # one seed: the curve's last point is the summary's value at the last step
            assert np.isclose(lines[name][-1], run[f"kl_{name}"], rtol=1e-12)


def test_the_browser_shows_the_model_figures(gpt_report, tmp_path):
    dom = chromium_dom(gpt_report, tmp_path)
    assert "<h2>Models: loss against the baselines, strategies, attention</h2>" in dom
    for name in ("loss_curves", "strategy_kl", "attention_maps"):
        assert f'src="{name}.png"' in dom, name
    m = re.search(r"IMAGES (\d+)/(\d+)", dom)
    assert int(m.group(1)) == int(m.group(2)) == len(list(gpt_report.glob("*.png")))
