"""Errors and console lines that keep what helps: a YAML typo's file, line and column; Hydra's own hint for a
comma list without -m; a did-you-mean for keys, groups and launcher keys, with the value as typed; one line for
flags Hydra cannot combine; what was not finite when a run diverged; a diverged run's outcome final on a
relaunch unless `hydra.launcher.retry` names it; `null` (never `None`) and `1 run` in the run and sweep lines;
a repeated grid point as typed; `--tol` in its range; `--help` with each group's choice marked."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode

from analysis.__main__ import main as analysis_main
from .conftest import ROOT, launch, one_error_line, summaries
from hydra_plugins.rw_sweeps_plugins.sweeper import typed_grid
from rw_sweeps.core import contract, keys
from rw_sweeps.core.errors import Refused, one_line
from rw_sweeps.sweeps import placement, run
from rw_sweeps.sweeps.app import preflight
from rw_sweeps.sweeps.planner import Planner
from rw_sweeps.sweeps.status import summary_line

TINY = ["optim.steps=5", "data.n_train=60", "data.n_test=60", "wandb.mode=disabled"]


def refusal(*argv: str, conf_dir: Path | None = None) -> str:
    """The one line the front door prints for a command refused by the pre-check (in process)."""
    args = [*argv, *(["--config-dir", str(conf_dir)] if conf_dir else [])]
    with pytest.raises(Exception) as err:
        preflight(args, str(ROOT / "launch.py"), "conf")
    return one_line(err.value)


# ------------------------------------------------------------------------------------------ the front door
def test_a_yaml_typo_in_a_config_dir_file_names_its_file_line_and_column(tmp_path):
    (tmp_path / "experiment").mkdir()
    bad = tmp_path / "experiment" / "bad.yaml"
    bad.write_text("data: {p: [0.1, 0.5}\n")
    line = refusal("experiment=bad", conf_dir=tmp_path)
    assert line == (f"ParserError: {bad}, line 1, column 20: expected ',' or ']', but got '}}' "
                    "(while parsing a flow sequence from line 1, column 11)")


def test_a_yaml_error_without_a_context_is_its_problem_where_it_is():
    with pytest.raises(yaml.YAMLError) as err:
        yaml.safe_load("data:\n  p: 0.5\n   K: 3\n")
    assert one_line(err.value) == "ScannerError: <unicode string>, line 3, column 5: mapping values are not allowed here"


@pytest.mark.e2e
def test_a_comma_list_without_multirun_keeps_hydra_s_hint_in_one_line(tmp_path):
    line = one_error_line(launch("data.p=0.1,0.5", *TINY, cwd=tmp_path))
    assert line == ("error: invalid config: data.p=0.1,0.5: a comma list in a single run: to sweep over it, add "
                    "--multirun (-m) to your command line")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("argv,want", [
    (["daat.p=0.5"], "invalid config: daat.p=0.5: unknown key daat (did you mean data?); allowed: seed, "),
    (["dat.p=null"], "invalid config: dat.p=null: unknown key dat (did you mean data?); allowed: seed, "),
    (["daat=5"], "invalid config: daat=5: unknown key (did you mean data?); allowed: seed, "),
    (["optim.lrr=0.1"], "invalid config: optim.lrr=0.1: unknown key for optim=gd (did you mean optim.lr?); "),
    (["init=gausian"], "invalid config: init='gausian': unknown option (did you mean gaussian?); allowed: "),
    (["hydra.launcher.ovewrite=true"], "invalid config: hydra.launcher.ovewrite=true: unknown launcher key (did "
                                       "you mean hydra.launcher.overwrite?); "),
    (["-m", "hydra.sweeper.max_run=1"], "invalid config: hydra.sweeper.max_run=1: unknown sweeper key (did you "
                                        "mean hydra.sweeper.max_runs?); "),
])
def test_a_mistyped_key_or_option_is_refused_as_typed_with_the_closest_real_one(argv, want):
    line = refusal(*argv)
    assert line.startswith(want), line


def test_a_key_of_another_option_names_that_option_not_a_lookalike():
    line = refusal("data=binary_chain", "data.stay=0.2")
    assert "did you mean" not in line and "(data.stay is a key of data=lazy_walk)" in line, line


def test_a_key_nothing_resembles_gets_no_guess():
    line = refusal("zzzz=1")
    assert line.startswith("invalid config: zzzz=1: unknown key; allowed: seed, "), line


@pytest.mark.parametrize("flags", [["-m", "--cfg", "job"], ["--cfg", "job", "--multirun"], ["-m", "--info", "config"]])
def test_multirun_with_cfg_or_info_is_one_line_saying_what_to_do(flags):
    with pytest.raises(Refused) as err:
        preflight([*flags, "seed=0,1"], str(ROOT / "launch.py"), "conf")
    line = str(err.value)
    assert "\n" not in line and "cannot be combined" in line and "drop -m" in line, line


# ------------------------------------------------------------------------------------------ divergence
@pytest.mark.e2e
def test_a_run_whose_loss_overflows_names_the_loss_and_its_step(tmp_path):
    r = launch("optim.lr=1e200", *TINY, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "diverged" and s["error"] == f"non-finite training loss at step {s['steps']}", s
    assert f"diverged: p=0.5 init=zero seed=0: non-finite training loss at step {s['steps']}" in r.stdout
    # after the first step V is ~1e200: ‖V‖ overflows, so cos(V, Πᵀ) and pred_dist are null, never 0 and 1
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert rows[1]["step"] == 1 and rows[1]["v_pi_cosine"] is None and rows[1]["pred_dist"] is None, rows[1]


@pytest.mark.e2e
def test_a_run_whose_update_overflows_names_the_parameters_and_the_step(tmp_path):
    r = launch("optim.lr=1e308", *TINY, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "diverged" and s["steps"] == 0, s
    assert s["error"] == "non-finite parameters after the update of step 0 (its training loss was finite)", r.stdout


@pytest.mark.e2e
def test_a_gpt_run_names_the_non_finite_quantity(tmp_path):
    launch("model=gpt", "init=gaussian", "optim.lr=1e200", *TINY, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "diverged" and s["error"] == f"non-finite training loss at step {s['steps']}", s


# ------------------------------------------------------------------------------------------ final outcomes
@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """A sweep of one done and one diverged run, launched twice: (its folder, the second launch)."""
    sweep = tmp_path_factory.mktemp("ended") / "sweep"
    grid = ["-m", "optim.lr=1,1e200", *TINY, f"hydra.sweep.dir={sweep}"]
    first = launch(*grid, cwd=sweep.parent)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 1 done, 0 skipped, 0 failed, 1 diverged"
    return sweep, grid, launch(*grid, cwd=sweep.parent)


@pytest.mark.e2e
def test_a_diverged_run_is_kept_on_a_relaunch_and_counted_diverged(ended):
    sweep, _, again = ended
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "run(s): step" not in out, out  # nothing trained
    assert "skipped (diverged): p=0.5 init=zero seed=0: non-finite training loss" in out
    assert ("kept 1 run(s) as they ended (1 diverged): an ended run's outcome is final; "
            "'hydra.launcher.retry=[diverged,failed]' trains them again") in out
    assert again.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 0 done, 1 skipped, 0 failed, 1 diverged"


@pytest.mark.e2e
def test_retry_diverged_trains_a_diverged_run_again(ended):
    sweep, grid, _ = ended
    r = launch(*grid, "hydra.launcher.retry=[failed,diverged]", cwd=sweep.parent)
    assert "training 1 run(s)" in r.stdout and "\ndiverged: p=0.5" in r.stdout, r.stdout
    assert r.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 runs: 0 done, 1 skipped, 0 failed, 1 diverged"


@pytest.mark.e2e
def test_a_failed_run_is_retried_by_default_and_kept_with_an_empty_retry(ended, tmp_path):
    sweep, grid, _ = ended
    name = next(n for n, s in summaries(sweep).items() if s["status"] == "diverged")
    failed = tmp_path / "sweep"
    launch(*grid[:-1], f"hydra.sweep.dir={failed}", "hydra.launcher.retry=[]", cwd=tmp_path)
    path = failed / name / "summary.json"   # as a run killed by a full disk ends: failed, with its message
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "failed", "error": "No space left on device"}))
    assert contract.judge(failed / name).state == "failed"
    specs = placement_specs(failed)
    assert placement.place(specs, failed, True).kept == {}
    assert list(placement.place(placement_specs(failed), failed, True, retry=()).kept.values())[0]["status"] == "failed"


def placement_specs(sweep: Path) -> list:
    """The specs a relaunch of the sweep's own grid plans (its folders by their config)."""
    overrides = ["optim.lr=1,1e200", *TINY, f"hydra.sweep.dir={sweep}"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        cfg = loader.load_configuration("config", overrides=overrides, run_mode=RunMode.MULTIRUN)
        jobs = typed_grid(OverridesParser.create(config_loader=loader).parse_overrides(overrides))
        return Planner(loader, cfg).plan(jobs)


@pytest.mark.e2e
def test_retry_names_only_outcomes(tmp_path):
    line = one_error_line(launch("-m", "hydra.launcher.retry=[done]", *TINY, cwd=tmp_path))
    assert not (tmp_path / "multirun").exists()
    assert line == ("error: invalid config: hydra.launcher.retry=['done']: must be a list of outcomes a relaunch trains "
                    "again, of failed, diverged (e.g. 'hydra.launcher.retry=[failed,diverged]', or [] to keep every run "
                    "as it ended)")


# ------------------------------------------------------------------------------------------ smaller
def test_a_run_line_says_null_as_summary_json_does():
    summary = {"status": "done", "data": "random_walk", "p": None, "K": 6, "N": 97, "init": "zero", "seed": 0,
               "steps": 5, "test_acc": 0.5, "opt_acc": 0.5, "parent_attention": None, "v_pi_cosine": 0.1,
               "test_kl": 0.2, "symmetry_break_step": None}
    line = run.run_line(summary)
    assert "None" not in line and "p=null" in line and line.endswith("break_step=null"), line


def test_a_sweep_of_one_run_says_one_run():
    assert summary_line("s", Counter(done=1)) == "sweep s: 1 run: 1 done, 0 skipped, 0 failed, 0 diverged"
    assert summary_line("s", Counter(done=2)).startswith("sweep s: 2 runs: ")


def test_a_grid_is_listed_with_each_comma_list_value_as_typed():
    parsed = OverridesParser.create().parse_overrides(["optim.lr=0.5,5e-1", "data.p=0.50", "seed=range(0,2)"])
    assert typed_grid(parsed) == [["optim.lr=0.5", "data.p=0.5", f"seed={s}"] for s in (0, 1)] + \
        [["optim.lr=5e-1", "data.p=0.5", f"seed={s}"] for s in (0, 1)]


@pytest.mark.parametrize("tol", ["2", "1", "-0.1", "nan"])
def test_analysis_refuses_a_tolerance_outside_its_range(tol, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        analysis_main([str(tmp_path), "--out", str(tmp_path / "report"), "--tol", tol])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and err.endswith(f"error: --tol {float(tol):g}: must be in [0, 1) (success is "
                                                  "test_acc >= OPT - tol; e.g. 0.02)"), err


def test_help_keys_are_those_of_the_chosen_options_and_the_choice_is_marked():
    chosen = {"data": "random_walk", "init": "zero", "model": "transformer", "optim": "gd"}
    text = keys.describe(tuple(sorted(chosen.items())))
    assert "init=zero:" in text and "init=gaussian:" not in text and "data=lazy_walk:" not in text
    assert len(text.splitlines()) < len(keys.describe().splitlines()) / 3
    marked = dict(line.split(": ", 1) for line in keys.groups(str(ROOT / "conf"), chosen).splitlines())
    assert marked["init"] == "gaussian, gpt2, zero*" and marked["optim"] == "adam, adamw, gd*, sgd"


@pytest.mark.e2e
def test_help_is_short_and_marks_the_defaults(tmp_path):
    r = launch("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) < 100 and "init: gaussian, gpt2, zero*" in r.stdout
    assert "data: " in r.stdout and "random_walk*" in r.stdout
    assert "Another option's keys: name it (python launch.py --help init=gaussian)." in r.stdout
