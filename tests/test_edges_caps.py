"""What is written is readable: every file a valid run writes fits its reader's cap
(`contract.written` bounds them from the config, `contract.too_large` refuses the rest before any job), and
the largest config each option allows round-trips through the writer and the contract's judgement."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from rw_sweeps.core import contract, results
from rw_sweeps.core.config import RunConfig, from_dict, option_config
from rw_sweeps.core.contract import CONFIG, HISTORY, SNAPSHOTS, SUMMARY
from rw_sweeps.core.errors import ConfigError
from rw_sweeps.core.registry import OPTIONS, typed
from rw_sweeps.core.summary_fields import ECHOES

from .conftest import launch, one_error_line, status_here

WORST = -2.2250738585072014e-308  # the longest a float's text is (24 characters): what a bound must hold


def _valid(d: dict) -> RunConfig | None:
    try:
        return from_dict(d)
    except ConfigError:
        return None


def _config(data: str, model: str, K: int, **more) -> dict:
    """A config dict of this family and model at K (a K×K Π where the family records one), its other keys the
    option's own but a short run on few sequences."""
    d = RunConfig(data=option_config("data", data), model=option_config("model", model)).to_dict()
    d["data"].update(K=K, n_train=8, n_test=8)
    if "Pi" in OPTIONS["data"][data].MATRICES:
        d["data"]["Pi"] = [[1.0 / K] * K for _ in range(K)]
    d["optim"]["steps"] = 1
    for key, value in more.items():
        group, _, name = key.rpartition(".")
        (d[group] if group else d)[name] = value
    return d


SEARCHED = 2048  # the largest K searched: above every limit the caps set (1,113), where a model records no K²


def _largest_k(data: str, model: str) -> int | None:
    """The largest K of this family and model whose config is valid and not refused (`too_large`), searched
    up from the family's own K: the edge where validity or the refusal stops."""
    def ok(k: int) -> bool:
        if "Pi" in OPTIONS["data"][data].MATRICES:  # Π is counted from K (`written`): a 2×2 one stands in
            cfg = _valid(_config(data, model, 2))
            return cfg is not None and contract.too_large(_with_k(cfg, k)) is None
        cfg = _valid(_config(data, model, k))
        return cfg is not None and contract.too_large(cfg) is None

    lo, hi = OPTIONS["data"][data]().K, SEARCHED
    if not ok(lo):
        return None
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _with_k(cfg: RunConfig, K: int) -> RunConfig:
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, K=K))


def _rows(cfg: RunConfig) -> tuple[list, list, dict]:
    """History rows, snapshot rows and a done summary of the size a run of `cfg` writes (`recorded`'s numbers,
    each the longest a float's text is), judged done by the contract."""
    n_history, n_snapshot = cfg.model.recorded(cfg)
    T, K = cfg.optim.steps, cfg.data.K
    steps = sorted({0, *range(0, T + 1, cfg.eval_every), T})
    history = [{"step": s, "train_loss": WORST, "values": [WORST] * (n_history - 2)} for s in steps]
    want = sorted({s for s in cfg.snapshot_steps if s <= T and s % cfg.eval_every == 0} | {T})
    full, rest = divmod(n_snapshot - 1, K)
    snapshot = [[WORST] * K for _ in range(full)] + [[WORST] * rest]
    snapshots = [{"step": s, "V": snapshot} for s in want]
    d = cfg.to_dict()
    summary = {"status": "done", "steps": T, "eval_step": T, "train_loss": WORST, "wall_s": 1.0,
               "parent_positions": cfg.data.parents(cfg.seed), **cfg.data.echoed()}
    for key, dotted in ECHOES.items():
        node = d
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            summary[key] = node
    heads = [[WORST] * getattr(cfg.model, "n_head", 0) for _ in range(getattr(cfg.model, "n_layer", 0))]
    if heads:
        summary.update(attn_parent=heads, induction=heads)
    return history, snapshots, summary


def _round_trip(cfg: RunConfig, folder: Path) -> contract.Verdict:
    """Write a run of `cfg` of the size it writes through the project's writer; the contract's judgement; each
    file within `written`'s bound."""
    history, snapshots, summary = _rows(cfg)
    results.write_run(folder, cfg.to_dict(), history, snapshots)
    results.write_summary(folder, summary)
    bounds = contract.written(cfg)
    for name in (CONFIG, SUMMARY, HISTORY, SNAPSHOTS):
        size = (folder / name).stat().st_size
        assert size <= bounds[(name, "file")], (name, size, bounds[(name, "file")])
    for name in (HISTORY, SNAPSHOTS):
        longest = max(len(line) for line in (folder / name).read_bytes().splitlines())
        assert longest <= bounds[(name, "line")], (name, longest, bounds[(name, "line")])
    return contract.judge(folder)


@pytest.fixture
def small_caps(monkeypatch):
    """The contract's caps scaled down (the readers and `written` read them when called): the property over
    every option is the same at any scale, and small files keep it to seconds."""
    monkeypatch.setitem(contract.CAPS, CONFIG, 1 << 20)
    monkeypatch.setitem(contract.CAPS, SUMMARY, 64 << 10)
    monkeypatch.setitem(contract.LINE_CAPS, SNAPSHOTS, 256 << 10)
    monkeypatch.setitem(contract.LINE_CAPS, HISTORY, 16 << 10)
    monkeypatch.setitem(contract.FILE_CAPS, HISTORY, 256 << 10)
    monkeypatch.setitem(contract.FILE_CAPS, SNAPSHOTS, 1 << 20)


@pytest.mark.parametrize("model", sorted(OPTIONS["model"]))
@pytest.mark.parametrize("data", sorted(OPTIONS["data"]))
def test_the_largest_config_each_option_allows_round_trips(tmp_path, small_caps, data, model):
    """For every registered family and model: the largest K its schema allows and `too_large` does not refuse
    is written, read and judged done; one more is refused (where the schema allows it), in one line naming
    data.K or the key that fits it and the limit."""
    K = _largest_k(data, model)
    if K is None:
        pytest.skip(f"data={data} model={model}: no valid config of this shape")
    d = _config(data, model, K)
    cfg = from_dict(d)
    verdict = _round_trip(cfg, tmp_path / "run")
    assert verdict.state == "done", verdict.why
    beyond = _valid(_config(data, model, K + 1))
    if beyond is not None and K < SEARCHED:
        problem = contract.too_large(beyond)
        assert problem is not None and "\n" not in str(problem)
        assert str(problem).startswith(f"invalid config: data.K={K + 1}: data={data} model={model} writes ")
        assert f"data.K <= {K:,} fits" in str(problem)


@pytest.mark.slow  # ~35 MB of YAML written and read: ~1 min on a quiet 2-core machine
def test_markov_matrix_at_its_largest_k_round_trips_under_the_real_caps(tmp_path):
    """The heaviest config any option allows, at the real caps: data=markov_matrix at the K the snapshot line
    allows (its Π: ~34 MB of config.yaml, above the 16 MiB cap it had before) is written and judged done."""
    K = _largest_k("markov_matrix", "transformer")
    assert K == 1113  # V's K² numbers fill a 32 MiB snapshot line; Π's fit the 64 MiB config
    rng = np.random.default_rng(0)
    d = _config("markov_matrix", "transformer", K, snapshot_steps=[])
    d["data"]["Pi"] = rng.dirichlet(np.ones(K), size=K).tolist()
    cfg = from_dict(d)
    verdict = _round_trip(cfg, tmp_path / "run")
    assert verdict.state == "done", verdict.why
    assert (tmp_path / "run" / CONFIG).stat().st_size > 16 << 20
    assert contract.too_large(_with_k(cfg, K + 1)) is not None


def test_the_history_file_at_its_longest_round_trips_and_one_more_evaluation_is_refused(tmp_path, small_caps):
    """A history of as many evaluations as its file's cap holds is done; a run with more is refused naming
    eval_every and the one that fits."""
    d = _config("random_walk", "transformer", 6, snapshot_steps=[])
    cfg = from_dict(d)
    steps = max(s for s in range(1, 4000) if contract.too_large(
        dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, steps=s))) is None)
    longest = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, steps=steps))
    verdict = _round_trip(longest, tmp_path / "run")
    assert verdict.state == "done", verdict.why
    over = contract.too_large(dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, steps=steps + 2)))
    assert str(over).startswith(f"invalid config: eval_every=1: data=random_walk model=transformer writes a "
                                f"history.jsonl of up to ")
    assert str(over).endswith("eval_every >= 2 fits")


def test_a_ten_million_step_run_evaluated_every_step_is_refused_naming_eval_every():
    cfg = from_dict(_config("random_walk", "transformer", 6, **{"optim.steps": 10**7}))
    assert str(contract.too_large(cfg)) == (
        "invalid config: eval_every=1: data=random_walk model=transformer writes a history.jsonl of up to "
        f"{contract.written(cfg)[(HISTORY, 'file')] / 1e6:,.1f} MB, above the 1 GiB its reader allows; "
        "eval_every >= 9 fits")


@pytest.mark.parametrize("model, more", [("transformer", {}), ("transformer_ffn", {"model.m": 7}),
                                         ("gpt", {"model.n_layer": 2, "model.n_head": 2}),
                                         ("gpt_eq21", {"model.n_layer": 2, "model.n_head": 2})])
def test_the_bounds_hold_what_each_model_really_writes(tmp_path, model, more):
    """A real run of each model: each of its history and snapshot rows holds at most the numbers its model's
    `recorded` says, and every file is within `written`'s bound."""
    from rw_sweeps.sweeps import run

    d = _config("random_walk", model, 5, **{"optim.steps": 3, "snapshot_steps": [0, 2], "wandb.mode": "disabled",
                                            **more})
    cfg = from_dict(d)
    folder = tmp_path / "run"
    summary = run.execute([cfg], [folder], progress=False)[0]
    assert summary["status"] == "done", summary
    n_history, n_snapshot = cfg.model.recorded(cfg)

    def numbers(x) -> int:
        return sum(numbers(v) for v in (x.values() if isinstance(x, dict) else x)) if isinstance(x, (dict, list)) \
            else 1

    hist = [r for r in contract.rows(folder, HISTORY)]
    snaps = [r for r in contract.rows(folder, SNAPSHOTS)]
    assert len(snaps) == 3 and len(hist) == 4
    assert max(numbers(r) for r in hist) <= n_history
    assert max(numbers(r) for r in snaps) <= n_snapshot
    bounds = contract.written(cfg)
    for name in (CONFIG, SUMMARY, HISTORY, SNAPSHOTS):
        assert (folder / name).stat().st_size <= bounds[(name, "file")], name


def test_a_matrix_of_numbers_is_typed_as_omegaconf_types_it():
    """registry.typed's fast path for data.Pi (a node per number took ~90 s of every read of a 900×900 Π) gives
    what OmegaConf gives: whole numbers stay ints (validate makes them floats), and a non-number is refused."""
    from rw_sweeps.core.families.markov_matrix import MarkovMatrix
    from rw_sweeps.core.registry import node

    value = [[0, 1], [0.5, 0.5]]
    scratch = node(MarkovMatrix)
    scratch["Pi"] = value
    from omegaconf import OmegaConf
    assert typed(MarkovMatrix, "Pi", value, "data.Pi") == OmegaConf.to_container(scratch["Pi"]) == value
    assert typed(MarkovMatrix, "Pi", value, "data.Pi") is not value
    big = [[1.0 / 900] * 900 for _ in range(900)]
    t = time.process_time()
    assert typed(MarkovMatrix, "Pi", big, "data.Pi") == big
    assert time.process_time() - t < 2


# ------------------------------------------------------------------------------------------ the cases found
@pytest.mark.e2e
def test_markov_matrix_K900_round_trips_status_and_analysis_say_done_and_a_relaunch_skips_it(tmp_path):
    """`data=markov_matrix data.K=900` wrote a 22.7 MB config.yaml over its reader's 16 MiB
    cap (done for the launcher, corrupt for rw-status, absent for analysis, retrained by every relaunch). Now
    the launch writes it, rw-status and analysis find it done, and a relaunch skips it."""
    pi = tmp_path / "pi.npy"
    np.save(pi, np.random.default_rng(0).dirichlet(np.ones(900), size=900))
    sweep = tmp_path / "sweep"
    args = ("-m", "data=markov_matrix", "data.K=900", f"data.Pi_file={pi}", "optim.steps=1", "data.n_train=10",
            "data.n_test=10", "data.N=9", "model.M=10", f"hydra.sweep.dir={sweep}")
    r = launch(*args)
    assert r.returncode == 0, r.stderr
    assert (sweep / "0" / CONFIG).stat().st_size > 16 << 20  # above the cap that made it unreadable
    assert contract.judge(sweep / "0").state == "done"
    s = status_here(str(sweep))
    assert s.returncode == 0 and "1 done" in s.stdout, s.stdout + s.stderr
    from analysis import load_runs

    runs = load_runs(sweep, cache=False, progress=False)
    assert len(runs) == 1 and runs.iloc[0]["status"] == "done" and not runs.attrs["skipped"]
    again = launch(*args)
    assert again.returncode == 0, again.stderr
    assert "1 skipped" in again.stdout and "skipped (done)" in again.stdout, again.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("multirun", [True, False])
def test_a_run_whose_files_its_readers_would_refuse_is_refused_in_one_line_before_any_folder(tmp_path, multirun):
    """data.K=1200: V's K² numbers would make snapshots.jsonl lines above the 32 MiB a line may hold. A grid and
    a single run are refused in one line naming data.K, the file and the K that fits; no folder is made."""
    folder = tmp_path / "out"
    where = f"hydra.sweep.dir={folder}" if multirun else f"hydra.run.dir={folder}"
    r = launch(*(["-m"] if multirun else []), "data.K=1200", "optim.steps=1", "data.n_train=10", where)
    assert r.returncode == 2
    line = one_error_line(r)
    assert line.startswith("error: invalid config: data.K=1200: data=random_walk model=transformer writes "
                           "snapshots.jsonl lines of up to "), line
    assert line.endswith("above the 32 MiB its reader allows; data.K <= 1,113 fits"), line
    assert not folder.exists()
