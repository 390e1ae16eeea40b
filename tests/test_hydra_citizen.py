"""The rw launchers are Hydra launchers: Hydra's own launcher test suite passes for every way of running
them, packing is invisible to what a Hydra user observes (callbacks, env_set, `.hydra/` files, logs,
JobReturns), and every valid Hydra command line works: glob sweeps, ConfigStore launchers, Optuna."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra.test_utils.launcher_common_tests import LauncherTestSuite

from .conftest import ROOT, SMALL, forget_version_base, launch, summaries

QUIET = [*SMALL, "wandb.mode=disabled"]


# -------------------------------------------------------------------- Hydra's own launcher test suite
@pytest.fixture(autouse=True)
def _unset_version_base():
    forget_version_base()

# Each preset is the `rw` launcher plus its deltas (conf/hydra/launcher/*.yaml); Hydra's suite apps have
# their own config folders, so it is selected by its ConfigStore name with the preset's deltas.
@pytest.mark.parametrize("launcher_name, overrides", [
    ("rw", []),                                                                 # packed
    ("rw", ["hydra.launcher.pack=false"]),                                      # unpacked, in this process
    ("rw", ["hydra.launcher.backend=local_gpus", "hydra.launcher.pack=false"]),  # local_gpus (the CPU here)
    ("rw", ["hydra.launcher.backend=local_gpus"]),                              # packed_gpus
], ids=["packed", "unpacked", "local_gpus", "packed_gpus"])
@pytest.mark.e2e
class TestRwLauncher(LauncherTestSuite):
    """Any task but the project's own runs through Hydra's run_job, job by job, as Hydra's launchers do."""

# The same suite on the SLURM backend: tests/test_slurm.py::TestRwLauncherOnSlurm.


# -------------------------------------------------------------------- packing is invisible
def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _callback(path: Path) -> list[str]:
    return ["+hydra.callbacks.record._target_=tests.callbacks.Record", f"+hydra.callbacks.record.path={path}"]


@pytest.mark.e2e
@pytest.mark.parametrize("preset", ["packed", "packed_gpus"])
def test_callbacks_and_env_set_see_every_packed_run_as_its_own_job(preset, tmp_path):
    events = tmp_path / "events.jsonl"
    sweep = tmp_path / "s"
    # runs 1 and 3 fail at run time: a directory stands where their history must be written
    for n in ("1", "3"):
        (sweep / n / "history.jsonl").mkdir(parents=True)
    r = launch("-m", f"hydra/launcher={preset}", "data.p=0.3,0.5", "seed=0,1", *QUIET,
               "+hydra.job.env_set.RW_TEST_ENV=hello", *_callback(events), f"hydra.sweep.dir={sweep}")
    assert r.returncode == 1, r.stdout + r.stderr  # a run failed: non-zero, after on_multirun_end
    ev = _events(events)
    kinds = [e["event"] for e in ev]
    assert kinds[0] == "multirun_start" and kinds[-1] == "multirun_end"
    starts = sorted(e["num"] for e in ev if e["event"] == "job_start")
    ends = {e["num"]: e for e in ev if e["event"] == "job_end"}
    assert starts == [0, 1, 2, 3] and sorted(ends) == [0, 1, 2, 3]  # once per run
    assert all(e["env"] == "hello" for e in ev if e["event"] == "job_start")  # env_set applies
    assert all(e["output_dir"] == str(sweep / str(e["num"])) for e in ev if e["event"] == "job_start")
    runs = summaries(sweep)
    for num, e in ends.items():
        assert e["working_dir"] == str(sweep / str(num)) and e["task_name"] == "rw" and e["hydra_num"] == num
        assert e["overrides"] == yaml.safe_load((sweep / str(num) / ".hydra" / "overrides.yaml").read_text())
        assert e["cfg_p"] == runs[str(num)]["p"]
        if runs[str(num)]["status"] == "done":
            assert e["status"] == "COMPLETED" and e["value"] == runs[str(num)]["test_acc"]
        else:
            assert e["status"] == "FAILED" and "history.jsonl" in e["value"]
    assert [runs[str(i)]["status"] for i in range(4)] == ["done", "failed", "done", "failed"]


@pytest.mark.e2e
def test_packing_follows_the_declaration_and_the_launcher_says_how_the_sweep_runs(tmp_path):
    """A task that drops `@batched(train_batch)` runs job by job through run_job, with its edit, and the
    launcher says `not packed` and why; the declared task is packed, and the line says so."""
    src = (ROOT / "launch.py").read_text()
    edited = src.replace("    return train(cfg)", "    print('edited task ran', flush=True)\n    return train(cfg)")
    edited = edited.replace("@batched(train_batch)\n", "")
    assert edited.count("edited task ran") == 1 and "\n@batched(train_batch)\n" not in edited
    script = tmp_path / "launch_edited.py"
    script.write_text(edited.replace('config_path="conf"', f'config_path="{ROOT / "conf"}"')
                      .replace('__file__, "conf")', f'__file__, "{ROOT / "conf"}")'))
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(script), "-m", "data.p=0.3,0.5", *QUIET, f"hydra.sweep.dir={tmp_path / 's'}"],
                       capture_output=True, text=True, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("edited task ran") == 2  # once per job, through run_job
    assert "not packed: 2 runs as 2 job(s) on cpu: the task declares no batched twin" in r.stdout + r.stderr
    assert [s["status"] for s in summaries(tmp_path / "s").values()] == ["done", "done"]

    r = launch("-m", "data.p=0.3,0.5", *QUIET, f"hydra.sweep.dir={tmp_path / 'p'}")
    assert r.returncode == 0 and "packed: 2 runs in 1 job(s) on cpu" in r.stdout + r.stderr
    r = launch("-m", "data.p=0.3,0.5", *QUIET, "hydra.launcher.pack=false", f"hydra.sweep.dir={tmp_path / 'u'}")
    assert r.returncode == 0 and "not packed: 2 runs as 2 job(s) on cpu: hydra.launcher.pack=false" in r.stdout + r.stderr

    from rw_sweeps.sweeps.app import batch_function
    import functools
    import importlib.util

    spec = importlib.util.spec_from_file_location("launch_mod", ROOT / "launch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    task = mod.main.__wrapped__  # what hydra.main hands to the launcher
    assert batch_function(task) is not None

    @functools.wraps(task)
    def wrapped(cfg):
        return task(cfg)

    assert batch_function(wrapped) is None  # the copied declaration does not make a wrapper the task


# -------------------------------------------------------------------- every valid command line
@pytest.mark.e2e
def test_glob_runs_every_experiment_preset(tmp_path):
    sweep = tmp_path / "s"
    r = launch("-m", "experiment=glob(*)", "optim.steps=2", "data.n_train=64", "data.n_test=64", "model.M=200",
               "eval_every=1", "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = summaries(sweep)
    assert sorted(s["data"] + "/" + str((sweep / n / "config.yaml").read_text().split("experiment: ")[1].split()[0])
                  for n, s in runs.items()) == sorted(
        ["qa_majority/fig10", "random_walk/fig4", "random_walk/fig5", "random_walk/fig6", "qa_majority/fig7",
         "random_walk/fig8", "random_walk/fig9", "random_walk/fig6_readings", "qa_majority/fig10_readings",
         "random_walk/escape", "random_walk/locking", "binary_chain/makkuva_pq", "lazy_walk/lazy",
         "graph_walk/graphs", "kth_order/kth_order", "icl_markov/icl", "random_walk/deep_trap",
         "binary_chain/makkuva", "binary_chain/makkuva_small", "icl_markov/edelman_icl", "bayes_net/bayes_net",
         "random_walk/escape_adaptive", "binary_chain/makkuva_pq_adaptive"])
    assert all(s["status"] == "done" and s["steps"] == 2 for s in runs.values())


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_hydra_s_own_launchers_run_the_app(launcher, tmp_path):
    sweep = tmp_path / "s"
    extra = ["hydra.launcher.timeout_min=10", "hydra.launcher.gpus_per_node=0"] if launcher == "submitit_local" else []
    r = launch("-m", f"hydra/launcher={launcher}", *extra, "data.p=0.5,1", *QUIET, f"hydra.sweep.dir={sweep}",
               cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 2 done, 0 skipped, 0 failed, 0 diverged"
    runs = {s["p"]: s for s in summaries(sweep).values()}
    assert abs(runs[0.5]["test_acc"] - 0.5) < 0.05 and runs[0.5]["parent_attention"] > 0.99
    assert runs[1.0]["attention_spread"] == 0.0  # Thm 4.1's symmetric point, exactly
    assert all((sweep / n / ".hydra" / "hydra.yaml").exists() for n in ("0", "1"))


@pytest.mark.e2e
def test_interpolated_and_plus_overrides_are_checked_when_resolved(tmp_path):
    sweep = tmp_path / "s"
    r = launch("-m", "data.p=0.3,0.5", "optim.lr=${data.p}", *QUIET, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    cfgs = [yaml.safe_load((sweep / n / "config.yaml").read_text()) for n in ("0", "1")]
    assert [c["optim"]["lr"] for c in cfgs] == [0.3, 0.5]
    r = launch("-m", "data.p=0.3,7", "optim.lr=${data.p}", *QUIET, f"hydra.sweep.dir={tmp_path / 'bad'}", cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "data.p=7" in lines[0] and not (tmp_path / "bad").exists()
    for bad, key in (("~data.p", "data.p"), ("+data.r=1", "data.r"), ("++model.depth=2", "model.depth")):
        r = launch("-m", "seed=0,1", bad, *QUIET, f"hydra.sweep.dir={tmp_path / 'bad'}", cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and key in lines[0], r.stderr
        assert not (tmp_path / "bad").exists()


@pytest.mark.e2e
def test_an_experiment_from_config_dir_runs(tmp_path):
    extra = tmp_path / "more" / "experiment"
    extra.mkdir(parents=True)
    (extra / "mine.yaml").write_text("# @package _global_\nexperiment: mine\ndata:\n  p: 0.7\n")
    r = launch("--config-dir", str(tmp_path / "more"), "experiment=mine", *QUIET, f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["p"] == 0.7 and abs(s["test_acc"] - 0.7) < 0.07


@pytest.mark.e2e
def test_an_optuna_search_without_an_objective_is_refused_before_any_trial(tmp_path):
    """Without `objective` the task returns the run's summary, a dict, which Optuna would reject trial after trial
    and the study end with no value: the launcher refuses it in one line before any job starts."""
    sweep = tmp_path / "s"
    r = launch("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "optim.lr=choice(0.5,1.0)", *QUIET,
               f"hydra.sweep.dir={sweep}")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("error: invalid config: objective=None: OptunaSweeper optimises"), r.stderr
    assert "test_acc" in last and "Traceback" not in r.stderr and not list(sweep.glob("*/summary.json"))


@pytest.mark.e2e
def test_optuna_searches_two_parameters_under_the_packed_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "s"
    r = launch("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=6", "hydra.sweeper.n_jobs=3",
               "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
               "data.p=interval(0.55,0.95)", "optim.lr=choice(0.5,1.0)", "objective=test_acc", *QUIET,
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "packed: 3 runs in 1 job(s) on cpu" in r.stdout + r.stderr  # each batch of parallel trials is one packed job
    # Hydra's own lines, and the sweeper's, as in any Hydra app; not the libraries optuna imports (alembic)
    hydra_lines = [ln.split("][HYDRA] ", 1)[1] for ln in r.stdout.splitlines() if "][HYDRA] " in ln]
    assert [ln.split(":")[0] for ln in hydra_lines[:4]] == ["Study name", "Storage", "Sampler", "Directions"]
    assert hydra_lines[-2].startswith("Best parameters: ") and hydra_lines[-1].startswith("Best value: ")
    assert "alembic" not in r.stdout + r.stderr
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    runs = summaries(sweep)
    assert len(runs) == 6 and all(s["status"] == "done" for s in runs.values())
    assert best["best_value"] == max(s["test_acc"] for s in runs.values())
    assert 0.55 <= best["best_params"]["data.p"] <= 0.95 and best["best_params"]["optim.lr"] in (0.5, 1.0)
    assert best["best_value"] > 0.5  # p > 0.55: the optimum max(p, 1 − p) is above chance


@pytest.mark.e2e
def test_choice_range_and_tag_sweeps_run(tmp_path):
    sweep = tmp_path / "s"
    r = launch("-m", "data.p=choice(0.3,0.7)", "seed=tag(fast,range(0,2))", *QUIET,
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = summaries(sweep)
    assert sorted((s["p"], s["seed"]) for s in runs.values()) == [(0.3, 0), (0.3, 1), (0.7, 0), (0.7, 1)]


# -------------------------------------------------------------------- packaging
def test_the_installed_commands_work_from_any_folder(tmp_path):
    import shutil
    import subprocess
    import sys

    bindir = Path(sys.executable).parent
    launch_cmd, status_cmd = shutil.which("rw-launch", path=str(bindir)), shutil.which("rw-status", path=str(bindir))
    assert launch_cmd and status_cmd and shutil.which("rw-analysis", path=str(bindir)), "pip install -e . (make install)"
    r = subprocess.run([launch_cmd, "-m", "data.p=0.5,1", *QUIET, "hydra.sweep.dir=s"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {s["p"]: s for s in summaries(tmp_path / "s").values()}
    assert runs[0.5]["parent_attention"] > 0.99 and runs[1.0]["attention_spread"] == 0.0
    st = subprocess.run([status_cmd, "s"], cwd=tmp_path, capture_output=True, text=True)
    assert st.returncode == 0 and "2 runs: 2 done" in st.stdout, st.stdout + st.stderr


@pytest.mark.e2e
def test_the_wheel_carries_the_configs(tmp_path):
    import subprocess
    import sys
    import zipfile

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("rw_sweeps-*.whl"))).namelist()
    conf = sorted(str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml"))
    assert sorted(n[len("rw_sweeps_conf/"):] for n in names if n.startswith("rw_sweeps_conf/") and n.endswith(".yaml")) == conf
    assert "hydra_plugins/rw_sweeps_plugins/launcher.py" in names
    kernels = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rw_sweeps").rglob("*.c"))  # compiled on first use
    assert "rw_sweeps/core/fused.c" in kernels and set(kernels) <= set(names), set(kernels) - set(names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(next(tmp_path.glob("rw_sweeps-*.whl"))).read(entry).decode()
    assert "rw-launch = rw_sweeps.sweeps.app:cli" in text


def test_the_planners_quick_parse_of_an_integer_override_is_hydras_own():
    """`key=<int>` skips Hydra's parser only where the result is the same Override; all else goes to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rw_sweeps.sweeps.planner import quick_override

    parser = OverridesParser.create()
    for line in ["seed=17", "seed=0", "seed=-3", "data.K=12", "a_b.c_d=4294967295"]:
        quick, hydra = quick_override(line), parser.parse_overrides([line])[0]
        assert quick == hydra and type(quick.value()) is type(hydra.value()) is int, line
    for line in ["seed=007", "seed=1_000", "seed=+5", "data.p=0.5", "seed=1e3", "~seed", "+seed=1", "seed=1,2",
                 "data=random_walk", "seed= 1", "seed=range(0,3)", "hydra/launcher=slurm"]:
        assert quick_override(line) is None, line


# ------------------------------------------------------------------------------------------ presets and habits
@pytest.mark.e2e
def test_the_debug_preset_is_a_tiny_run_named_rw(tmp_path):
    r = launch("debug=default", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert (cfg["optim"]["steps"], cfg["model"]["M"], cfg["data"]["n_train"]) == (5, 200, 64)
    assert (tmp_path / "r" / "rw.log").exists()  # one job name under every entry point
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 5


@pytest.mark.e2e
def test_the_shipped_optuna_search_preset_runs_its_study(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "s"
    r = launch("-m", "hparams_search=lr_p", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2", *QUIET,
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    runs = summaries(sweep)
    assert len(runs) == 4 and best["best_value"] == min(s["test_kl"] for s in runs.values())
    assert len({s["test_kl"] for s in runs.values()}) == 4  # a search over something that varies
    assert {"optim.lr", "optim.eps"} == set(best["best_params"]) and all(s["p"] == 0.8 for s in runs.values())


@pytest.mark.e2e
def test_a_users_own_preset_that_overrides_the_sweeper_is_obeyed(tmp_path):
    """A preset's `override /hydra/sweeper: optuna` works as in any Hydra app: the primary config names no
    sweeper of its own (`conf/sweep/rw.yaml` does, earlier in the defaults list)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    mine = tmp_path / "myconf" / "hparams_search"
    mine.mkdir(parents=True)
    (mine / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /hydra/sweeper: optuna\n"
                                    "objective: test_acc\nhydra:\n  sweeper:\n    direction: maximize\n"
                                    "    n_trials: 2\n    n_jobs: 2\n    params:\n      data.p: interval(0.6, 0.9)\n")
    sweep = tmp_path / "s"
    r = launch("-m", "--config-dir", str(tmp_path / "myconf"), "hparams_search=mine", *QUIET,
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (sweep / "optimization_results.yaml").exists() and len(summaries(sweep)) == 2


@pytest.mark.e2e
def test_help_says_what_the_app_is_and_lists_the_groups_and_every_keys_comment(tmp_path):
    r = launch("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("rw-sweeps: ") and "powered by Hydra" not in out
    groups = dict(line.split(": ", 1) for line in out.split("== Groups")[1].split("== Keys")[0].splitlines()[1:]
                  if ": " in line)
    assert "random_walk" in groups["data"] and "_schema" not in out.split("== Keys")[0]
    assert {"debug", "hparams_search", "experiment"} <= set(groups)
    assert "  data.p=0.5  # " in out and "init=zero: V(0) = 0" in out and "init: gaussian, gpt2, zero*" in out
    assert "  optim.lr=1.0" in out and "wandb.entity=null  # " in out
    other = launch("--help", "init=gaussian", cwd=tmp_path).stdout  # another option's keys: named on the line
    assert "init=gaussian: V_ij(0), W_ij(0)" in other and "  init.sigma=0.01" in other and "init=zero:" not in other


def test_a_missing_extras_plugin_names_the_extra_to_install():
    from hydra.errors import MissingConfigException

    from rw_sweeps.sweeps.hydra_errors import from_hydra_error

    text = ("In 'hydra/config': Could not find 'hydra/sweeper/optuna'\n\nAvailable options in 'hydra/sweeper':"
            "\n\tbasic\n\trw\nConfig search path:\n\tprovider=hydra, path=pkg://hydra.conf")
    e = from_hydra_error(MissingConfigException(text, "hydra/sweeper/optuna"))
    assert str(e) == ("invalid config: hydra/sweeper='optuna': unknown option; allowed: basic, rw (optuna is in "
                      "the 'optuna' extra: pip install 'rw-sweeps[optuna]')")


@pytest.mark.e2e
def test_whole_numbers_in_a_transition_matrix_are_numbers(tmp_path):
    r = launch("data=markov_matrix", "data.K=2", "data.Pi=[[0,1],[1,0]]", *QUIET, f"hydra.run.dir={tmp_path / 'r'}",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["data"]["Pi"] == [[0.0, 1.0], [1.0, 0.0]]
    r = launch("data=markov_matrix", "data.K=2", "data.Pi=[[0,1],[1,x]]", *QUIET, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: invalid config: data.Pi=[[0, 1], [1, 'x']]: must be a list of rows of numbers, e.g. [[0.9,0.1],[0.2,0.8]]")
