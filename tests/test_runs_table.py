"""The runs table states what the run folders say: one column per quantity, a config key only in the runs
whose option has it, integers as (nullable) integers; and the report's config table follows it."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import yaml

from analysis import add_success, load_runs
from analysis.report import sweep_config
from rw_sweeps.core.config import canonical
from rw_sweeps.core.registry import OPTIONS
from rw_sweeps.core.summary_fields import ECHOES

from ._fake_runs import write_run
from .conftest import launch

OPTION_OF = {"data": "data.name", "model": "model.name", "init": "init", "optim": "optim.name"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One real sweep over models with and without layers or an FFN, and optimisers with and without Adam's keys."""
    d = tmp_path_factory.mktemp("sweeps") / "mixed"
    r = launch("-m", "model=transformer,transformer_ffn,gpt", "optim=gd,adam", "data.N=13", "model.M=20",
               "optim.steps=2", "data.n_train=24", "data.n_test=24", "wandb.mode=disabled",
               f"hydra.sweep.dir={d}", cwd=d.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def dotted(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from dotted(v, f"{prefix}{k}.")
        else:
            yield ("init" if f"{prefix}{k}" == "init.name" else f"{prefix}{k}"), v


@pytest.mark.e2e  # the module sweep `mixed` is a real launch
def test_each_run_has_exactly_its_options_keys_as_the_folder_says(mixed):
    df = load_runs(mixed, progress=False)
    assert len(df) == 6 and set(df["model.name"]) == {"transformer", "transformer_ffn", "gpt"}
    config_cols = df.attrs["config_keys"]
    for _, row in df.iterrows():
        folder = dict(dotted(canonical(yaml.safe_load(open(f"{row['path']}/config.yaml")))))
        # a column with a value in this run is a key of its config.yaml, and every key of it is a column
        there = {k for k in config_cols if not pd.isna(row[k])}
        assert there == {k for k, v in folder.items() if v is not None}, (row["path"], there ^ set(folder))
        for k in there:   # and the run's option has it
            group, _, field = k.partition(".")
            if field and group in OPTIONS and k != OPTION_OF.get(group):
                assert field in {f.name for f in dataclasses.fields(OPTIONS[group][row[OPTION_OF[group]]])}, k
    gd = df[df["optim.name"] == "gd"]
    assert gd["optim.beta1"].isna().all() and (df.loc[df["optim.name"] == "adam", "optim.beta1"] == 0.9).all()
    assert df.loc[df["model.name"] != "transformer_ffn", "model.ffn"].isna().all()


@pytest.mark.e2e  # the module sweep `mixed` is a real launch
def test_integers_stay_integers_beside_runs_that_lack_the_key(mixed):
    df = load_runs(mixed, progress=False)
    gpt = df[df["model.name"] == "gpt"]
    assert str(df["model.n_layer"].dtype) == "Int64" and gpt["model.n_layer"].tolist() == [1, 1]
    assert df.loc[df["model.name"] != "gpt", "model.n_layer"].isna().all()
    assert "1.0" not in gpt["model.n_layer"].astype(str).tolist()
    # every config column holding integers (bools) in the YAML is a nullable integer (boolean) column
    for _, row in df.iterrows():
        for k, v in dotted(yaml.safe_load(open(f"{row['path']}/config.yaml"))):
            if k in df.columns and type(v) in (int, bool):
                assert str(df[k].dtype) == ("boolean" if type(v) is bool else "Int64"), (k, df[k].dtype)
    # quantities computed from integer keys stay plain floats (NaN, not <NA>): acc_norm divides by data.K
    assert str(add_success(df)["acc_norm"].dtype) == "float64"
    warm = load_runs(mixed, progress=False)   # the same table from the sweep's Parquet cache
    pd.testing.assert_frame_equal(warm, df)


@pytest.mark.e2e  # the module sweep `mixed` is a real launch
def test_a_summarys_copies_of_config_keys_are_not_second_columns(mixed):
    df = load_runs(mixed, progress=False)
    column = {k: d.replace("init.name", "init") for k, d in ECHOES.items()}   # seed and init are their own name
    assert not ({k for k, c in column.items() if c != k} | {"sigma"}) & set(df.columns)
    for _, row in df.iterrows():
        summary = json.load(open(f"{row['path']}/summary.json"))
        for k, v in summary.items():
            if k in ECHOES:   # the config's own column says it
                assert v is None or row[column[k]] == v, (k, v)
            elif k == "sigma":   # the init's scale: its σ key, and 0 for zero init, which has none
                assert v == (0 if row["init"] == "zero" else row["init.sigma"]), (row["init"], v)
            elif not isinstance(v, (list, dict)):
                assert (pd.isna(row[k]) if v is None else row[k] == v), k


@pytest.mark.e2e  # the module sweep `mixed` is a real launch
def test_the_config_table_names_each_keys_options_and_marks_only_swept_keys_swept(mixed, tmp_path):
    table = sweep_config(load_runs(mixed, progress=False)).set_index("key")
    assert table.loc["optim.beta1"].to_dict() == {"value": "0.9", "of": "optim=adam", "role": ""}
    assert table.loc["model.ffn", "of"] == "model=transformer_ffn" and table.loc["model.ffn", "role"] == ""
    assert table.loc["model.n_layer"].to_dict() == {"value": "1", "of": "model=gpt", "role": ""}
    assert table.loc["optim.name", "role"] == "swept" and table.loc["model.name", "role"] == "swept"
    assert table.loc["optim.lr"].to_dict() == {"value": "1.0", "of": "", "role": ""}
    # init=zero,gaussian: the init is the swept key; σ is the Gaussian's one value, normalisation follows
    for i, (p, init) in enumerate([(p, i) for p in (0.0, 1.0) for i in ("zero", "gaussian")]):
        write_run(tmp_path / "demo" / str(i), p=p, init=init, sigma=0.01)
    demo = sweep_config(load_runs(tmp_path / "demo", progress=False)).set_index("key")
    assert demo.loc["init", "role"] == "swept" and demo.loc["data.p", "role"] == "swept"
    assert demo.loc["init.sigma"].to_dict() == {"value": "0.01", "of": "init=gaussian", "role": ""}
    assert demo.loc["model.normalize", "role"] == "derived"
