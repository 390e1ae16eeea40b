"""The options' schemas are stored outside the option groups (`schema/<group>/<name>`, `schema/run`), so they
are no choice of anything: `glob(*)`, "Available options", `--help`, `--info` and shell completion list only
the real options (conf/<group>/*.yaml), and `init=zero_schema` is refused in one line, while each option's
YAML still merges into its typed node (an unknown key is refused as before)."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from rw_sweeps.core.config import GROUPS, OPTIONS, RunConfig, from_dict
from rw_sweeps.sweeps.planner import plan_overrides

from .conftest import ROOT, launch, summaries

CONF = ROOT / "conf"
TINY = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=2", "wandb.mode=disabled"]
YAMLS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml")) for g in GROUPS}
SERVE_ENGINES = ("init", "optim")  # the groups whose options implement a model's engine (`ENGINES`)


def _loader():
    GlobalHydra.instance().clear()
    initialize_config_dir(config_dir=str(CONF), version_base="1.3")
    return GlobalHydra.instance().config_loader()


@pytest.fixture
def loader():
    try:
        yield _loader()
    finally:
        GlobalHydra.instance().clear()


def _all_groups(loader, parent: str = ""):
    for g in loader.get_group_options(parent, results_filter=ObjectType.GROUP):
        name = f"{parent}/{g}" if parent else g
        yield name
        yield from _all_groups(loader, name)


def _complete(line: str) -> list[str]:
    r = launch("-sc", "query=bash", env={"COMP_LINE": line, "COMP_POINT": str(len(line))})
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


# ------------------------------------------------------------------------------------------ the registry
def test_each_option_group_lists_exactly_its_yaml_files_and_the_registry(loader):
    for group in GROUPS:
        assert loader.get_group_options(group, results_filter=ObjectType.CONFIG) == YAMLS[group] == sorted(OPTIONS[group])


def test_no_choice_of_any_group_nor_of_the_root_is_a_schema(loader):
    groups = list(_all_groups(loader))
    assert set(GROUPS) <= set(groups) and "hydra/launcher" in groups
    for group in ["", *groups]:
        for choice in loader.get_group_options(group, results_filter=ObjectType.CONFIG):
            assert not choice.endswith("_schema"), f"{group}={choice}"
    assert "run_schema" not in loader.get_group_options("", results_filter=ObjectType.CONFIG)


@pytest.mark.parametrize("group,name", [(g, n) for g in GROUPS for n in OPTIONS[g]])
def test_every_registered_option_composes_typed_by_its_schema(group, name):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={name}"])
    node = cfg[group]
    assert node.name == name and OmegaConf.get_type(node) is OPTIONS[group][name]
    assert OmegaConf.is_struct(node)  # another option's key is refused, not added
    plain = OmegaConf.to_container(cfg, resolve=True)
    served = _served_by(group, name) if group in SERVE_ENGINES else plain["model"]["name"]
    if served != plain["model"]["name"]:  # an init or optimiser of another model's engine only: with that model
        plain["model"] = OmegaConf.to_container(_composed_model(served), resolve=True)
    run = from_dict(plain)
    assert getattr(run, group).name == name and type(getattr(run, group)) is OPTIONS[group][name]


def _composed_model(name: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"model={name}"]).model


def _served_by(group: str, name: str) -> str:
    """The default model where the init or optimiser serves its engine, else the first model whose engine it
    serves."""
    engines = OPTIONS[group][name].ENGINES
    models = OPTIONS["model"]
    default = RunConfig().model.name
    if models[default].ENGINE in engines:
        return default
    return next(m for m, c in models.items() if c.ENGINE in engines)


def _most_served(group: str) -> tuple[str, list[str]]:
    """The model whose engine most options of `group` serve, and the options that do not serve it."""
    def left_out(model: str) -> list[str]:
        engine = OPTIONS["model"][model].ENGINE
        return sorted(n for n, c in OPTIONS[group].items() if group in SERVE_ENGINES and engine not in c.ENGINES)
    model = min(OPTIONS["model"], key=lambda m: len(left_out(m)))
    return model, left_out(model)


# ------------------------------------------------------------------------------------------ glob(*)
@pytest.mark.parametrize("group", GROUPS)
def test_glob_star_sweeps_exactly_the_real_options_of_each_group(group):
    # with the model most of the group's options serve; the others (of another engine only) left out by name
    model, others = _most_served(group)
    star = f"glob(*,exclude=[{','.join(others)}])" if others else "glob(*)"
    specs = plan_overrides(["-m", f"{group}={star}", *([f"model={model}"] if group != "model" else [])])
    assert sorted(getattr(s.cfg, group).name for s in specs) == [n for n in YAMLS[group] if n not in others]
    assert len(others) < len(YAMLS[group]) - 1  # glob(*) itself chose the many


@pytest.mark.e2e
def test_glob_with_an_exclusion_launches_exactly_the_other_real_inits(tmp_path):
    sweep = tmp_path / "s"
    # left out: the inits the default model's engine has no implementation of (init=gpt2: model=gpt's)
    engine = OPTIONS["model"][RunConfig().model.name].ENGINE
    others = sorted(n for n, c in OPTIONS["init"].items() if engine not in c.ENGINES)
    assert others
    r = launch("-m", f"init=glob(*,exclude=[{','.join(others)}])", *TINY, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    inits = sorted((sweep / n / "config.yaml").read_text().split("\ninit:\n  name: ")[1].split()[0]
                   for n in summaries(sweep))
    assert inits == [n for n in YAMLS["init"] if n not in others] and {"gaussian", "zero"} <= set(inits)
    assert "_schema" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ not a choice
@pytest.mark.parametrize("override,group", [("init=zero_schema", "init"), ("data=random_walk_schema", "data"),
                                            ("model=gpt_schema", "model"), ("optim=gd_schema", "optim")])
@pytest.mark.e2e
def test_a_schema_name_as_an_option_is_refused_in_one_line_naming_the_real_options(override, group, tmp_path):
    r = launch(override, *TINY, cwd=tmp_path)
    assert r.returncode != 0 and r.stdout == ""
    typed = override.split('=')[1]
    close = f" (did you mean {typed[:-len('_schema')]}?)" if typed == "random_walk_schema" else ""  # a typo's look
    assert r.stderr.strip() == (f"error: invalid config: {group}='{typed}': unknown option{close}; "
                                f"allowed: {', '.join(YAMLS[group])}")
    assert not (tmp_path / "outputs").exists()


def test_hydra_s_own_available_options_have_no_schema(loader):
    with pytest.raises(MissingConfigException) as e:
        loader.load_configuration("config", overrides=["init=zero_schema"], run_mode=None)
    listed = str(e.value).split("Available options in 'init':")[1].split()
    assert listed[:len(YAMLS["init"])] == YAMLS["init"] and not any(o.endswith("_schema") for o in listed)


@pytest.mark.e2e
def test_the_schema_still_types_the_option_so_another_option_s_key_is_refused(tmp_path):
    r = launch("data=random_walk", "data.q=0.3", *TINY, cwd=tmp_path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: invalid config: data.q=0.3: unknown key for data=random_walk; "
                               "allowed: name, K, N, n_train, n_test, target, online, batch, p")


# ------------------------------------------------------------------------------------------ what users see
@pytest.mark.e2e
def test_help_lists_no_schema(tmp_path):
    r = launch("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "_schema" not in r.stdout and "schema/" not in r.stdout
    groups = dict(line.split(": ", 1) for line in r.stdout.split("== Groups")[1].split("== Keys")[0].splitlines()
                  if ": " in line)
    for group in GROUPS:
        assert groups[group].replace("*", "").split(", ") == YAMLS[group]  # `*`: this command's choice


@pytest.mark.e2e
@pytest.mark.parametrize("info", ["defaults", "defaults-tree", "searchpath", "all"])
def test_info_names_no_schema_choice(info, tmp_path):
    r = launch("--info", info, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "_schema" not in r.stdout


@pytest.mark.e2e
def test_info_defaults_shows_each_option_merged_into_its_own_node(tmp_path):
    r = launch("--info", "defaults", "init=gaussian", cwd=tmp_path)
    rows = [[c.strip() for c in line.strip("| ").split("|")] for line in r.stdout.splitlines() if line.startswith("|")]
    assert ["schema/init/gaussian", "init", "False", "init/gaussian"] in rows
    assert ["schema/run", "", "False", "config"] in rows


@pytest.mark.e2e
@pytest.mark.parametrize("group", GROUPS)
def test_shell_completion_offers_exactly_the_real_options(group):
    assert _complete(f"launch.py {group}=") == [f"{group}={n}" for n in YAMLS[group]]
    assert _complete(f"launch.py -m data.p=0.5 {group}=") == [f"{group}={n}" for n in YAMLS[group]]


@pytest.mark.e2e
def test_shell_completion_of_the_groups_offers_no_schema_name():
    words = _complete("launch.py ")
    assert {"data=", "model=", "init=", "optim=", "experiment="} <= set(words)
    assert not any("_schema" in w for w in words)
    assert not any("_schema" in w for w in _complete("launch.py init=z"))
    assert _complete("launch.py init=z") == ["init=zero"]
