"""Every config composes and validates; every bad value is one line, a non-zero exit, and no files."""
from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rw_sweeps.core import config
from rw_sweeps.core.config import ConfigError, RunConfig, from_dict, stored

from .conftest import ROOT, launch

CONF = ROOT / "conf"
GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml")) for g in ("data", "model", "init", "optim", "experiment")}


def composed(*overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return from_dict(OmegaConf.to_container(cfg, resolve=True))


def serving(group: str, name: str) -> list[str]:
    """The overrides a run of option `name` needs: for an init or optimiser, a model whose engine it serves
    (the default model where it serves that), read from the registry."""
    engines = config.OPTIONS[group][name].ENGINES if group in ("init", "optim") else None  # what implements an engine
    default = config.OPTIONS["model"][RunConfig().model.name]
    if engines is None or default.ENGINE in engines:
        return []
    return [f"model={next(m for m, c in config.OPTIONS['model'].items() if c.ENGINE in engines)}"]


def test_every_option_has_its_yaml_file_and_every_yaml_file_its_option():
    for group in config.GROUPS:
        assert GROUPS[group] == sorted(config.OPTIONS[group]), group
    # the paper's models, families, inits and optimisers are among them
    assert {"transformer", "transformer_ffn", "gpt"} <= set(GROUPS["model"])
    assert {"random_walk", "qa_majority", "qa_preference"} <= set(GROUPS["data"])
    assert {"zero", "gaussian"} <= set(GROUPS["init"]) and {"gd", "adam"} <= set(GROUPS["optim"])


def test_every_figure_has_its_experiment_preset():
    assert GROUPS["experiment"] == sorted([f"fig{i}" for i in (10, 4, 5, 6, 7, 8, 9)]
                                          + ["escape", "fig10_readings", "fig6_readings", "locking",
                                             "lazy", "makkuva_pq", "graphs", "kth_order", "icl", "deep_trap",
                                             "makkuva", "makkuva_small", "edelman_icl", "bayes_net",
                                             "escape_adaptive", "makkuva_pq_adaptive"])


@pytest.mark.parametrize("group,option", [(g, o) for g in config.GROUPS for o in config.OPTIONS[g]])
def test_every_option_composes(group, option):
    # an init or optimiser of another model's engine composes with that model (the default refuses it in one line)
    c = composed(f"{group}={option}", *serving(group, option))
    assert getattr(c, group).name == option


def test_defaults_are_the_paper_section_5():
    c = composed()
    assert (c.data.name, c.data.K, c.data.N, c.data.p, c.data.n_train, c.data.n_test) == ("random_walk", 6, 97, 0.5, 1000, 1000)
    assert (c.model.name, c.model.M, c.model.normalize, c.model.pos, c.model.pos_denom) == ("transformer", 1000, "none", "sine", "M")
    assert (c.init.name, c.optim.lr, c.optim.steps, c.optim.eps, c.optim.reduction) == ("zero", 1.0, 50, 0.1, "mean")
    assert (c.seed, c.precision, c.wandb.mode, c.wandb.project) == (0, "float64", "offline", "rw-sweeps")
    assert composed("init=gaussian").init.sigma == 0.01
    assert composed("model=transformer_ffn").model.m == 19


EXPECTED = {  # the paper's settings each preset must produce (single values; sweeps checked below)
    "fig4": dict(p=0.5, K=6, N=97, init="zero", lr=1.0, steps=50, normalize="none"),
    "fig5": dict(p=1.0, K=6, N=97, init="zero", lr=1.0, steps=50, normalize="none"),
    "fig6": dict(K=6, N=97, init="gaussian", sigma=0.01, lr=0.01, steps=1000, normalize="whole"),
    "fig7": dict(K=19, init="gaussian", sigma=0.01, lr=0.1, eps=0.1, M=1000),
    "fig8": dict(p=0.5, K=20, N=101, init="zero", lr=1.0, steps=50),
    "fig9": dict(p=1.0, K=20, N=101, init="zero", lr=1.0, steps=50),
    "fig10": dict(K=19, model="transformer_ffn", m=19, init="gaussian", sigma=0.01, lr=0.1, n_train=1024, n_test=1024),
    # the reading searches keep the paper's stated settings; normalize=auto is the paper's protocol
    "fig6_readings": dict(K=6, N=97, init="gaussian", sigma=0.01, lr=0.01, steps=1000, normalize="whole"),
    "fig10_readings": dict(K=19, model="transformer_ffn", m=19, init="gaussian", sigma=0.01, lr=0.1, steps=100,
                           n_train=1024, n_test=1024, normalize="whole"),
    "escape": dict(K=6, N=97, init="gaussian", steps=1000),
    "locking": dict(p=0.5, K=6, N=97, init="zero", lr=1.0, steps=50, normalize="none"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_experiment_presets_compose_to_the_paper_settings(name):
    c = composed(f"experiment={name}")
    assert c.experiment == name
    flat = {"p": getattr(c.data, "p", None), "K": c.data.K, "N": c.data.N, "init": c.init.name, "sigma": c.init.scale(), "lr": c.optim.lr,
            "steps": c.optim.steps, "eps": c.optim.eps, "M": c.model.M, "normalize": c.model.normalize,
            "model": c.model.name, "m": c.model.m, "n_train": c.data.n_train, "n_test": c.data.n_test}
    assert {k: flat[k] for k in EXPECTED[name]} == EXPECTED[name]


@pytest.mark.parametrize("name,sweep", [
    ("fig6", {"data.p": "0.5,1.0"}), ("fig7", {"data": "qa_majority,qa_preference"}),
    ("fig10", {"data": "qa_majority,qa_preference"}),
    ("fig6_readings", {"data.p": "0.5,1.0", "model.normalize": "none,whole,positional", "optim.reduction": "mean,sum",
                       "optim": "gd,adam"}),
    ("fig10_readings", {"data": "qa_majority,qa_preference", "model.ffn": "after,before", "optim": "gd,adam"}),
    ("escape", {"data.p": "0.0,1.0,0.9,0.95,0.99", "model.normalize": "none,whole", "precision": "float64,float32",
                "seed": "range(0,8)"}),
    ("locking", {"data.n_train": "100,300,1000,3000", "data.N": "25,49,97", "model.M": "200,1000",
                 "seed": "range(0,50)"}),
    ("escape_adaptive", {"init.sigma": "tag(log,interval(1e-8,1e-1))", "optim.lr": "tag(log,interval(0.01,10))",
                         "model.normalize": "none,whole", "seed": "range(0,4)"}),
    ("makkuva_pq_adaptive", {"data.p": "interval(0.05,0.95)", "data.q": "interval(0.05,0.95)",
                             "init": "zero,gaussian", "seed": "range(0,4)"})])
def test_multirun_presets_declare_their_sweep(name, sweep):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    assert str(cfg.hydra.mode).endswith("MULTIRUN")
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    if name.endswith("_adaptive"):  # its own sweeper, with a budget of points
        assert cfg.hydra.sweeper._target_.endswith("AdaptiveSweeper") and cfg.hydra.sweeper.n_points >= 48
    for k, v in sweep.items():
        assert params[k] == v
    for task in ("qa_majority", "qa_preference"):
        if "data" in sweep:  # the preset's deltas survive the swept data group
            c = composed(f"experiment={name}", f"data={task}")
            assert (c.data.K, c.data.N) == {"qa_majority": (19, 17), "qa_preference": (19, 19)}[task]


BAD = [
    ("wandb.per_run_limit=-1", "wandb.per_run_limit", ">= 0"),
    ("data.p=1.5", "data.p", "[0, 1]"), ("data.p=-0.1", "data.p", "[0, 1]"), ("data.p=abc", "data.p", "number"),
    ("data.K=2", "data.K", ">= 3"), ("data.N=1", "data.N", ">= 2"), ("data.n_train=0", "data.n_train", ">= 1"),
    ("data.n_test=0", "data.n_test", ">= 1"), ("model.M=50", "model.M", "data.N"), ("init=gaussian init.sigma=-1", "init.sigma", ">= 0"),
    ("optim.lr=0", "optim.lr", "> 0"), ("optim.lr=-1", "optim.lr", "> 0"), ("optim.eps=0", "optim.eps", "> 0"),
    ("optim.steps=0", "optim.steps", ">= 1"), ("precision=float16", "precision", "float64"),
    ("data.K=3.5", "data.K", "integer"), ("model.normalize=maybe", "model.normalize", "must be one of none, whole, positional, token"),
    ("optim.reduction=max", "optim.reduction", "mean"), ("wandb.mode=loud", "wandb.mode", "offline"),
    ("data.r=1", "data.r", "unknown key"), ("init=no_such_init", "init", ", ".join(sorted(config.OPTIONS["init"]))),
    ("~data.p", "data.p", "cannot be removed"), ("+data.r=1", "data.r", "unknown key"),
    ("objective=foo", "objective", "test_acc"), ("seed=abc", "seed", "integer"),
    ("snapshot_steps=[a]", "snapshot_steps", "list of integers"), ("init=gaussian init.sigma=0 optim.lr=${init.sigma}", "optim.lr", "> 0"),
    ("data=qa_majority data.N=20", "data.N", "17"), ("model=transformer_ffn model.m=0", "model.m", ">= 1"),
    ("init=gaussian init.draw=sparse", "init.draw", "compact, dense"),
    ("model.normalize=unit", "model.normalize", "none, whole, positional, token"),
    ("model.ffn=before", "model.ffn", "unknown key for model=transformer; allowed: name, M, normalize"), ("model=transformer_ffn model.ffn=inside", "model.ffn", "after, before"),
    ("optim.name=no_such_optim", "optim.name", ", ".join(config.OPTIONS["optim"])), ("optim=adam optim.beta1=1", "optim.beta1", "[0, 1)"),
    ("optim=adam optim.beta2=-0.1", "optim.beta2", "[0, 1)"), ("optim=adam optim.adam_eps=0", "optim.adam_eps", "> 0"),
    # one schema per option: a key of another option is refused, naming the keys this one allows
    ("data=random_walk data.q=0.3", "data.q", "unknown key for data=random_walk; allowed: name, K, N, n_train, n_test, target, online, batch, p"),
    ("data=binary_chain data.stay=0.2", "data.stay", "unknown key for data=binary_chain; allowed: name, K, N, n_train, n_test, target, online, batch, p, q, start"),
    ("data=random_walk data.stay=0.7 data.order=3 data.graph=torus", "data.stay", "unknown key for data=random_walk"),
    ("init=zero init.sigma=0.1", "init.sigma", "unknown key for init=zero; allowed: name"),
    ("optim.beta1=0.5", "optim.beta1", "unknown key for optim=gd; allowed: name, lr, steps, eps, reduction"),
    ("model.m=4", "model.m", "unknown key for model=transformer"),
    # the first-order chains beyond the circle: K per family, probabilities, Π's shape and rows
    ("data=binary_chain data.K=3", "data.K", "must be 2"), ("data=binary_chain data.q=1.5", "data.q", "[0, 1]"),
    ("data=binary_chain data.q=abc", "data.q", "number"), ("data=lazy_walk data.stay=-0.1", "data.stay", "[0, 1]"),
    ("data=lazy_walk data.K=2", "data.K", ">= 3"),
    ("data=markov_matrix data.K=2 data.Pi=[[0.9,0.2],[0.2,0.8]]", "data.Pi", "row 0 sums to 1.1"),
    ("data=markov_matrix data.K=2 data.Pi=[[0.9,0.1],[-0.2,1.2]]", "data.Pi", "row 1 has a negative"),
    ("data=markov_matrix data.K=2 data.Pi=[[0.5,0.5],[1.0]]", "data.Pi", "square"),
    ("data=markov_matrix data.Pi=[[0.5,0.5],[0.5,0.5]]", "data.Pi", "data.K×data.K (3×3)"),
    ("data=markov_matrix data.Pi=null", "data.Pi", "row-stochastic"),
    ("data=markov_matrix data.Pi=abc", "data.Pi", "list of rows"),
    ("data.Pi=[[1.0]]", "data.Pi", "unknown key for data=random_walk"),
    # jump_walk's probabilities and graph_walk's graphs
    ("data=jump_walk data.jumps=[0.5,0.6]", "data.jumps", "sums to 1.1"),
    ("data=jump_walk data.jumps=[1.2,-0.2]", "data.jumps", "entry 1 (P(-1)) is -0.2"),
    ("data=jump_walk data.jumps=[0.5,0.25,0.25]", "data.jumps", "even-length"),
    ("data=jump_walk data.jumps=abc", "data.jumps", "list of numbers"),
    ("data=jump_walk data.K=2", "data.K", ">= 3"),
    ("data.jumps=[0.5,0.5]", "data.jumps", "unknown key for data=random_walk"),
    ("data=graph_walk data.graph=star", "data.graph", "cycle, path, complete, grid, torus, hypercube, random_regular"),
    ("data=graph_walk data.graph=grid data.side=4", "data.K", "side² = 16 for data.graph=grid"),
    ("data=graph_walk data.graph=torus data.side=2 data.K=4", "data.side", ">= 3"),
    ("data=graph_walk data.graph=hypercube data.dim=4", "data.K", "2^dim = 16 for data.graph=hypercube"),
    ("data=graph_walk data.graph=cycle data.K=2", "data.K", ">= 3"),
    ("data=graph_walk data.graph=random_regular data.degree=0", "data.degree", "not connected"),
    ("data=graph_walk data.graph=random_regular data.K=4 data.degree=1", "data.degree", "not connected"),
    ("data=graph_walk data.graph=random_regular data.K=7 data.degree=3", "data.degree", "K·degree even"),
    ("data=graph_walk data.graph=random_regular data.degree=6", "data.degree", "[1, K−1]"),
    # the chains that are not first order: order, alpha, K, T's size
    ("data=kth_order data.order=0", "data.order", "[1, data.N − 1]"),
    ("data=kth_order data.N=3 data.order=3 model.M=10", "data.order", "[1, 2]"),
    ("data=kth_order data.K=10 data.order=7", "data.order", "too large"),
    ("data=kth_order data.order=1.5", "data.order", "integer"),
    ("data=kth_order data.alpha=0", "data.alpha", "> 0"), ("data=icl_markov data.alpha=-1", "data.alpha", "> 0"),
    ("data=icl_markov data.alpha=inf", "data.alpha", "finite"), ("data=icl_markov data.alpha=abc", "data.alpha", "number"),
    ("data=icl_markov data.K=1", "data.K", ">= 2"), ("data=kth_order data.K=1", "data.K", ">= 2"),
]


def checked(*args: str) -> None:
    """What `python launch.py ARGS` checks before any job starts, in process: the pre-check (Hydra's own
    composition, every value in single-run mode), then in multirun mode the rw sweeper's grid validation."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    from rw_sweeps.sweeps.app import preflight
    from rw_sweeps.sweeps.planner import Planner

    preflight(list(args), str(ROOT / "launch.py"), "conf")
    if args and args[0] == "-m":
        overrides = list(args[1:])
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            cfg = loader.load_configuration("config", overrides=overrides, run_mode=RunMode.MULTIRUN)
            parser = OverridesParser.create(config_loader=loader)
            jobs = [j for b in BasicSweeper.split_arguments(parser.parse_overrides(overrides), None) for j in b]
            Planner(loader, cfg).plan(jobs)


@pytest.mark.parametrize("mode", ["run", "multirun"])
@pytest.mark.parametrize("override,key,allowed", BAD)
def test_bad_input_is_one_config_error(override, key, allowed, mode):
    args = override.split()
    if mode == "multirun":  # the bad value hides behind a good one in a grid
        args = ["-m", "seed=0,1"] + args
    with pytest.raises(ConfigError) as err:
        checked(*args)
    line = str(err.value)
    assert "\n" not in line and key in line and allowed in line, line


UNREADABLE = [  # overrides Hydra's parser or OmegaConf's resolver cannot read: the override named, and why
    ("optim.lr=${optim.steps", "invalid config: optim.lr='${optim.steps': an interpolation opened with ${ is not "
                               "closed (write ${key}, and quote the override in a shell)"),
    ("data.p=０.５", "invalid config: data.p='０.５': the override grammar does not read '０' (FULLWIDTH DIGIT ZERO, "
                   "U+FF10), '５' (FULLWIDTH DIGIT FIVE, U+FF15); write data.p=0.5"),
    ("data.p=${init.sigma}", "invalid config: data.p='${init.sigma}': its interpolation names init.sigma, which this "
                             "run's config does not have (init.sigma is a key of init=gaussian)"),
    ("data.p=${nope}", "invalid config: data.p='${nope}': its interpolation names nope, which this run's config "
                       "does not have"),
    ("data.p=0.5)", "invalid config: data.p='0.5)': Hydra's override grammar cannot parse it: extraneous input ')' "
                    "expecting <EOF> (see https://hydra.cc/docs/advanced/override_grammar/basic/)"),
    ("+data.foo=“x”", "invalid config: data.foo='“x”': the override grammar does not read '“' (LEFT DOUBLE "
                      "QUOTATION MARK, U+201C), '”' (RIGHT DOUBLE QUOTATION MARK, U+201D); write +data.foo=\"x\""),
]


@pytest.mark.parametrize("mode", ["run", "multirun"])
@pytest.mark.parametrize("override,line", UNREADABLE)
def test_an_override_that_cannot_be_read_is_one_line_naming_it(override, line, mode):
    with pytest.raises(ConfigError) as err:
        checked(*(["-m", "seed=0,1", override] if mode == "multirun" else [override]))
    assert str(err.value) == line


@pytest.mark.parametrize("override,tail", [
    ("data.K=٣", "(ARABIC-INDIC DIGIT THREE, U+0663); write data.K=3"),          # any script's decimal digit
    ("data.K=३", "(DEVANAGARI DIGIT THREE, U+0969); write data.K=3"),
    ("wandb.name=“x”", "(RIGHT DOUBLE QUOTATION MARK, U+201D); write wandb.name=\"x\""),  # a pasted smart quote
    ("wandb.name=σ", "(GREEK SMALL LETTER SIGMA, U+03C3); the grammar reads any character quoted, inside the "
                     "shell's quotes: \"wandb.name='σ'\""),
])
def test_an_unreadable_character_says_what_to_write_instead(override, tail):
    """Every refusal of a character the grammar does not read says what to write: its ASCII spelling where it
    has one (a digit of any script, a typographic quote), else the quoted value, which the grammar reads
    whatever its characters (`wandb.name='σ sweep'` names a run)."""
    with pytest.raises(ConfigError) as err:
        checked(override)
    assert str(err.value).endswith(tail), str(err.value)


@pytest.mark.parametrize("digit", "0123456789")
def test_a_full_width_digit_anywhere_says_its_ascii_spelling(digit):
    wide = chr(0xFF10 + int(digit))
    with pytest.raises(ConfigError) as err:
        checked(f"seed=1{wide}")
    assert str(err.value).endswith(f"U+{0xFF10 + int(digit):04X}); write seed=1{digit}")


@pytest.mark.e2e
@pytest.mark.parametrize("args", [["data.p=1.5"], ["-m", "seed=0,1", "data.p=abc"], ["data.p=${init.sigma}"],
                                  ["-m", "seed=0,1", "data.p=０.５"]], ids=["run", "multirun", "resolve", "parse"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args):
    """The real front door, as users run it: one line on stderr, exit 2, no folder."""
    out = tmp_path / "out"
    r = launch(*args, f"hydra.run.dir={out}", f"hydra.sweep.dir={out}", cwd=tmp_path)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: invalid config: data.p="), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not out.exists() and not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.e2e
def test_bad_value_inside_a_grid_is_caught_before_any_job(tmp_path):
    r = launch("-m", "data.p=0.5,0.7,7", "optim.steps=1", f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
    assert r.returncode == 2 and "data.p=7" in r.stderr and not (tmp_path / "s").exists()


def test_config_error_names_key_value_and_rule():
    with pytest.raises(ConfigError, match=r"^invalid config: optim\.eps=-0\.5: must be > 0$"):
        from_dict({"optim": {"eps": -0.5}})
    assert from_dict({"data": {"p": 0}}).data.p == 0.0  # `data.p=0` arrives as an int from the command line


@pytest.mark.e2e
def test_bad_launcher_settings_are_one_line_too(tmp_path):
    for override, key in [("hydra.launcher.backend=moon", "hydra.launcher.backend"),
                          ("hydra.launcher.memory_gb=0", "hydra.launcher.memory_gb"),
                          ("hydra.launcher.memory_gb=lots", "hydra.launcher.memory_gb"),
                          ("hydra/launcher=packed_slurm hydra.launcher.gres=gpu:1 hydra.launcher.gpus_per_node=1",
                           "hydra.launcher.gres")]:
        r = launch("-m", "seed=0,1", *override.split(), f"hydra.sweep.dir={tmp_path / 's'}", cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and key in lines[0], r.stderr
        assert not (tmp_path / "s").exists()


def test_normalize_auto_is_the_papers_protocol():
    # §4: unit-length x̃_i in the attention with random init; the theory (zero init) has none
    assert composed().model.normalize == "none"
    assert composed("init=gaussian").model.normalize == "whole"
    assert composed("init=gaussian", "model.normalize=none").model.normalize == "none"
    assert composed("model.normalize=positional").model.normalize == "positional"
    # the key's old boolean form still reads as it did
    assert composed("model.normalize=true").model.normalize == "whole"
    assert composed("init=gaussian", "model.normalize=false").model.normalize == "none"
    assert from_dict({"model": {"normalize": True}}).model.normalize == "whole"


def test_help_spells_every_default_as_the_command_line_reads_it():
    """Every `key=value` line `--help` prints (rw_sweeps.core.keys.describe), typed back as a Hydra override, is
    that key's schema default: YAML's `null`, `true` and `[0, 1]`, never Python's `None`, `True`."""
    import dataclasses

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rw_sweeps.core import keys
    from rw_sweeps.core.config import GROUPS, OPTIONS, RunConfig, WandbConfig

    defaults = {f.name: f for f in dataclasses.fields(RunConfig)}
    defaults |= {f"wandb.{f.name}": f for f in dataclasses.fields(WandbConfig)}
    schemas = {f"{g}={n}": {f"{g}.{f.name}": f for f in dataclasses.fields(c)} for g in GROUPS
               for n, c in OPTIONS[g].items()}
    parser, seen, option = OverridesParser.create(), 0, None
    for line in keys.describe().splitlines():
        if line and not line.startswith(" "):
            option = line.split(":")[0]
            continue
        if not line.startswith("  "):
            continue
        setting = line.strip().split("  # ")[0]
        key, text = setting.split("=", 1)
        assert not re.search(r"\b(None|True|False)\b", text), line
        f = (schemas.get(option) or defaults)[key]
        want = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        got = parser.parse_overrides([setting])[0].value()
        assert got == want and (type(got) is type(want) or isinstance(want, float)), (line, got, want)
        seen += 1
    assert seen > 100


def test_help_lists_every_key_a_user_can_set_and_no_option_name():
    """`--help` (rw_sweeps.core.keys.describe) has a line for every key of the run, of wandb and of every
    option, `wandb.name` included (a key, not an option's name); an option's `name` is its group's choice
    (`data=lazy_walk`), never a `data.name=` line."""
    import dataclasses

    from rw_sweeps.core import keys
    from rw_sweeps.core.config import GROUPS, OPTIONS, RunConfig, WandbConfig

    listed = {line.strip().split("=", 1)[0] for line in keys.describe().splitlines() if line.startswith("  ")}
    want = {f.name for f in dataclasses.fields(RunConfig) if f.name not in (*GROUPS, "wandb")}
    want |= {f"wandb.{f.name}" for f in dataclasses.fields(WandbConfig)}
    want |= {f"{g}.{f.name}" for g in GROUPS for c in OPTIONS[g].values() for f in dataclasses.fields(c)
             if f.name != "name"}
    assert "wandb.name" in want
    assert listed == want, (want - listed, listed - want)


def test_precision_auto_is_each_models_own_and_recorded_resolved():
    """precision=auto (the default) is the model's PRECISION: float32 for model=gpt (peers' practice), float64 for
    eq. 2.1's models; the config says what was trained; an explicit value wins; a bad one is one line."""
    assert {m: composed(f"model={m}").precision for m in ("transformer", "gpt", "gpt_eq21")} == \
        {"transformer": "float64", "gpt": "float32", "gpt_eq21": "float64"}
    assert composed("model=gpt", "precision=float64").precision == "float64"
    assert composed("model=gpt").to_dict()["precision"] == "float32"
    with pytest.raises(ConfigError, match=r"precision='float16': must be one of auto, float64, float32"):
        composed("precision=float16")


def test_a_stored_config_without_precision_reads_as_float64_what_every_version_before_auto_trained():
    """A config.yaml (or a dict) that lacks `precision` predates `auto`: float64, for model=gpt too; one that
    records it keeps it."""
    gpt = composed("model=gpt").to_dict()
    bare = {k: v for k, v in gpt.items() if k != "precision"}
    assert stored(bare).precision == "float64" and from_dict(bare).precision == "float64"
    assert stored({**bare, "precision": "float32"}).precision == "float32"
