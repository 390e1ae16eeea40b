"""The front door end to end: real Hydra processes, real run folders, real offline wandb files."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from . import _forked
from .conftest import ROOT, SMALL, launch, summaries
from .wandb_files import read_run

SUMMARY_KEYS = {"status", "error", "test_acc", "opt_acc", "test_kl", "parent_attention", "v_pi_cosine",
                "attention_spread", "symmetry_break_step", "train_loss", "steps", "wall_s", "p", "K", "N", "M",
                "init", "sigma", "lr", "eps", "seed", "precision"}
HISTORY_KEYS = {"step", "train_loss", "test_loss", "test_acc", "test_kl", "parent_attention", "attention_spread",
                "v_pi_cosine", "pred_dist"}


@pytest.mark.e2e
def test_the_default_run_prints_one_line(tmp_path):
    r = launch(f"hydra.run.dir={tmp_path / 'run'}", "wandb.mode=disabled", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("done:")]
    assert len(lines) == 1 and "p=0.5" in lines[0] and "init=zero" in lines[0]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "done" and abs(s["test_acc"] - 0.5) < 0.05 and s["parent_attention"] > 0.99
    assert f"test_acc={s['test_acc']:.4f}" in lines[0]


@pytest.mark.e2e
def test_the_8_run_grid_writes_the_results_contract_and_wandb_files(tmp_path):
    sweep = tmp_path / "sweep"
    # wandb.mode=offline is the default, named: the helper disables wandb in launches that do not name it
    r = launch("-m", "data.p=0,0.1,0.5,1", "init=zero,gaussian", *SMALL, "wandb.mode=offline",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"sweep {sweep}: 8 runs: 8 done, 0 skipped, 0 failed, 0 diverged" in r.stdout
    runs = summaries(sweep)
    assert sorted(runs) == [str(i) for i in range(8)]
    assert (sweep / "multirun.yaml").exists()
    grid = {(s["p"], s["init"]) for s in runs.values()}
    assert grid == {(p, i) for p in (0.0, 0.1, 0.5, 1.0) for i in ("zero", "gaussian")}
    for name, s in runs.items():
        run_dir = sweep / name
        assert SUMMARY_KEYS <= set(s) and s["status"] == "done" and s["error"] is None
        assert s["opt_acc"] == max(s["p"], 1 - s["p"]) and s["steps"] == 10
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert cfg["data"]["p"] == s["p"] and cfg["init"]["name"] == s["init"] and cfg["optim"]["steps"] == 10
        hist = [json.loads(ln) for ln in (run_dir / "history.jsonl").read_text().splitlines()]
        assert [h["step"] for h in hist] == list(range(11)) and HISTORY_KEYS <= set(hist[0])
        assert hist[-1]["test_acc"] == s["test_acc"]
        snaps = [json.loads(ln) for ln in (run_dir / "snapshots.jsonl").read_text().splitlines()]
        assert [x["step"] for x in snaps] == [0, 1, 2, 5, 10]
        assert len(snaps[-1]["V"]) == 6 and len(snaps[-1]["attention"]) == 97 and len(snaps[-1]["h_var"]) == 6
        assert not list(run_dir.glob(".*.tmp"))  # atomic writes leave no temporaries
        # one real offline wandb run per training run
        wb = read_run(run_dir)
        assert wb["id"] == s["run_id"] and wb["job_type"] == "train" and wb["group"] == "/".join(sweep.parts[-2:])
        assert wb["config"]["data"]["p"] == s["p"] and wb["config"]["init"]["name"] == s["init"]
        assert len(wb["history"]) == 11 and wb["summary"]["status"] == "done"
        assert abs(wb["summary"]["test_acc"] - s["test_acc"]) < 1e-12
    # the theory, visible already at this small size: zero init fails at p ∈ {0, 1}, learns at p = 0.1, 0.5
    zero = {s["p"]: s for s in runs.values() if s["init"] == "zero"}
    assert zero[1.0]["symmetry_break_step"] is None and zero[1.0]["attention_spread"] == 0.0
    assert zero[0.0]["symmetry_break_step"] is None and zero[0.0]["test_acc"] < 0.4
    assert zero[0.5]["parent_attention"] > 0.99 and zero[0.1]["parent_attention"] > 0.99


@pytest.mark.e2e
def test_rerunning_a_sweep_skips_finished_runs(tmp_path):
    sweep = tmp_path / "s"
    args = ["-m", "data.p=0.3,0.7", *SMALL, "wandb.mode=disabled", f"hydra.sweep.dir={sweep}"]
    assert launch(*args, cwd=tmp_path).returncode == 0
    before = {k: v["wall_s"] for k, v in summaries(sweep).items()}
    r = launch(*args, cwd=tmp_path)
    assert r.returncode == 0 and "2 runs: 0 done, 2 skipped, 0 failed, 0 diverged" in r.stdout
    assert {k: v["wall_s"] for k, v in summaries(sweep).items()} == before  # untouched
    # a changed config whose folder holds a finished run is refused, unless the user asks to train over it
    r = launch("-m", "data.p=0.3,0.9", *SMALL, "wandb.mode=disabled", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 2 and "holds a run of another config (data.p=0.7 there, 0.9 here)" in r.stderr
    r = launch("-m", "data.p=0.3,0.9", *SMALL, "wandb.mode=disabled", f"hydra.sweep.dir={sweep}",
               "hydra.launcher.overwrite=true", cwd=tmp_path)
    assert "2 runs: 1 done, 1 skipped" in r.stdout
    assert summaries(sweep)["1"]["p"] == 0.9


@pytest.mark.e2e
def test_failed_and_diverged_runs_do_not_stop_the_sweep(tmp_path):
    sweep = tmp_path / "s"
    # runs 2 and 3 fail at run time (a directory where their history goes); sigma=1 makes f_y + eps negative:
    # the loss is not finite
    for n in ("2", "3"):
        (sweep / n / "history.jsonl").mkdir(parents=True)
    r = launch("-m", "seed=0,1", "init=gaussian", "init.sigma=0.01,1", *SMALL, "wandb.mode=disabled",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 1
    assert "4 runs: 1 done, 0 skipped, 2 failed, 1 diverged" in r.stdout, r.stdout
    by = {v["status"]: v for v in summaries(sweep).values()}
    assert by["done"]["sigma"] == 0.01 and by["diverged"]["sigma"] == 1.0
    assert "step 0" in by["diverged"]["error"]
    diverged_dir = next(sweep / k for k, v in summaries(sweep).items() if v["status"] == "diverged")
    assert (diverged_dir / "history.jsonl").read_text().count("\n") == 1  # its history is kept
    failed = [v for v in summaries(sweep).values() if v["status"] == "failed"]
    assert len(failed) == 2 and all("history.jsonl" in v["error"] for v in failed)
    assert len(summaries(sweep)) == 4


# ------------------------------------------------------------------------------------------ what the console says
TINY_RUN = ["debug=default"]


@pytest.mark.e2e
def test_a_grid_that_names_a_run_twice_trains_it_once_and_says_so(tmp_path):
    sweep = tmp_path / "s"
    r = launch("-m", "optim.lr=1,1.0", "seed=0,1", *TINY_RUN, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "grid: 2 point(s) name a run already in it, each trained once: optim.lr=1.0 = optim.lr=1" in r.stdout
    runs = summaries(sweep)
    assert sorted(runs) == ["0", "1"] and sorted(s["seed"] for s in runs.values()) == [0, 1]
    assert "sweep " + str(sweep) + ": 2 runs: 2 done" in r.stdout


@pytest.mark.e2e
def test_zero_init_with_a_sigma_axis_is_refused_with_the_way_to_write_it(tmp_path):
    r = launch("-m", "init=zero,gaussian", "init.sigma=1e-4,1e-2", *TINY_RUN, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: invalid config: init.sigma=0.0001: unknown key for init=zero; allowed: name (init.sigma is a key of "
        "init=gaussian); to sweep init.sigma with init=zero, write init=gaussian init.sigma=0,… model.normalize=none "
        "(init.sigma = 0 with model.normalize=none is init=zero; model.normalize=auto is whole under init=gaussian)")
    sweep = tmp_path / "s"
    r = launch("-m", "init=gaussian", "init.sigma=0,1e-2", *TINY_RUN, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    zero = next(d for d, s in summaries(sweep).items() if s["sigma"] == 0.0)
    first = json.loads((sweep / zero / "history.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["attention_spread"] == 0.0  # V = W = 0: uniform attention, zero init
    assert abs(first["parent_attention"] - 1 / 97) < 1e-15  # over the N = 97 columns of X


@pytest.mark.e2e
@pytest.mark.parametrize("var,value,allowed", [
    ("RW_SWEEPS_THREADS", "abc", "must be a whole number of threads, at least 1 (0 or unset: torch's count)"),
    ("RW_SWEEPS_THREADS", "-2", "must be a whole number of threads, at least 1 (0 or unset: torch's count)"),
    ("RW_SWEEPS_BACKEND", "cuda", "must be one of auto, torch, fused"),
    ("RW_SWEEPS_THREADS", "٣", "must be a whole number of threads, at least 1 (0 or unset: torch's count)"),
    ("RW_SWEEPS_BACKEND", " Cuda ", "must be one of auto, torch, fused"),
    ("RW_SWEEPS_FUSED_ISA", "avx9", "must be one of native, generic"),
    ("RW_SWEEPS_DATA_WORKERS", "two", "must be a whole number of threads, at least 1 (0 or unset: the box's cores)"),
    ("RW_SWEEPS_PROGRESS_S", "soon", "must be a number of seconds, at least 0 (unset: 30)"),
    ("RW_SWEEPS_PROGRESS_S", "nan", "must be a number of seconds, at least 0 (unset: 30)")])
@pytest.mark.parametrize("where", ["environment", "env_set"])
def test_a_bad_variable_is_one_line_before_any_job(tmp_path, var, value, allowed, where):
    """The RW_SWEEPS_* variables the jobs read are checked at the front door, set in the environment or by
    `hydra.job.env_set` for the jobs: one line with the value as set, exit 2, no folder."""
    sweep = tmp_path / "s"
    how = {"env": {var: value}} if where == "environment" else {}
    extra = [] if where == "environment" else [f"+hydra.job.env_set.{var}='{value}'"]
    r = launch("-m", "model=gpt", "data=binary_chain", *TINY_RUN, *extra, f"hydra.sweep.dir={sweep}", cwd=tmp_path,
               **how)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"error: invalid config: {var}='{value}': {allowed}"]
    assert not sweep.exists()


@pytest.mark.e2e
def test_an_env_set_that_interpolates_is_resolved_and_checked_as_each_job_will_have_it(tmp_path):
    """Hydra's run_job resolves hydra.job.env_set against the job's `hydra` node alone: `${hydra:job.num}` is each
    job's own, a task key such as `${data.p}` cannot be resolved (Hydra's job fails on it). Both, and a resolved
    value no job may have, are one line before any folder; one every job may have trains."""
    for value, line in (
            ("${data.p}", "error: invalid config: hydra.job.env_set.RW_SWEEPS_THREADS='${data.p}': cannot be resolved: "
                          "Hydra resolves env_set against the job's hydra node alone (${hydra:job.num} is there, a task key "
                          "is not): Interpolation key 'data.p' not found"),
            ("x${hydra:job.num}", "error: invalid config: RW_SWEEPS_THREADS='x0': must be a whole number of threads, at "
                                  "least 1 (0 or unset: torch's count)")):
        bad = tmp_path / "bad"
        r = launch("-m", "data.p=0.5", *TINY_RUN, f"+hydra.job.env_set.RW_SWEEPS_THREADS={value}",
                   f"hydra.sweep.dir={bad}", cwd=tmp_path)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.strip().startswith(line), r.stderr
        assert not bad.exists()
    good = tmp_path / "good"
    r = launch("-m", "data.p=0.5", "seed=1,2", *TINY_RUN, "+hydra.job.env_set.RW_SWEEPS_THREADS=${hydra:job.num}",
               "+hydra.job.env_set.RW_SWEEPS_PROGRESS_S=${oc.env:RW_SWEEPS_NO_SUCH_VARIABLE,0.5}",
               f"hydra.sweep.dir={good}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(s["status"] for s in summaries(good).values()) == ["done", "done"]


def test_every_variable_a_run_reads_has_one_reader_that_the_front_door_checks():
    """Each RW_SWEEPS_* name in the package's code is read by `env_vars` (whose `check` the front door runs) or is
    free text its one owner reads (a cache folder, a key); a good value passes the check, and `check` reads
    every variable the module documents."""
    from rw_sweeps.core import env_vars

    free = {"RW_SWEEPS_CACHE": "rw_sweeps/core/fused.py", "RW_SWEEPS_SEAL_KEY": "rw_sweeps/core/seal.py"}
    readers: dict = {}
    for f in (ROOT / "rw_sweeps").rglob("*.py"):
        for name in set(re.findall(r"RW_SWEEPS_[A-Z_]+[A-Z]", f.read_text())):
            readers.setdefault(name, set()).add(f.relative_to(ROOT).as_posix())
    checked = set(re.findall(r"^- (RW_SWEEPS_[A-Z_]+):", env_vars.__doc__, re.M))
    assert checked == set(readers) - set(free), (checked, readers)
    for name, owner in free.items():
        assert owner in readers[name]
    for f in (ROOT / "rw_sweeps").rglob("*.py"):  # nowhere else is a checked one read from the environment
        if f.name != "env_vars.py":
            read = set(re.findall(r"(?:environ(?:\.get|\.setdefault|\.pop)?|getenv)\W{1,12}(RW_SWEEPS_[A-Z_]+[A-Z])", f.read_text()))
            assert not read & checked, (f, read & checked)
    for name in checked:
        with pytest.raises(env_vars.EnvVarError, match=f"^invalid config: {name}='x y': must be"):
            env_vars.check({name: "x y"})
    good = {"RW_SWEEPS_BACKEND": "Torch", "RW_SWEEPS_FUSED_ISA": "generic", "RW_SWEEPS_THREADS": "3",
            "RW_SWEEPS_DATA_WORKERS": "0", "RW_SWEEPS_PROGRESS_S": " 0.05 "}
    assert set(good) == checked
    env_vars.check(good)
    assert (env_vars.threads(good), env_vars.data_workers(good), env_vars.progress_s(good)) == (3, None, 0.05)
    for bad in ("inf", "-1", "1_0", "٣", "0x10"):
        with pytest.raises(env_vars.EnvVarError):
            env_vars.progress_s({"RW_SWEEPS_PROGRESS_S": bad})


@pytest.mark.e2e
def test_console_lines_name_the_swept_values_jobs_and_skipped_runs(tmp_path):
    sweep = tmp_path / "s"
    args = ["-m", "optim.lr=0.5,1", "init=zero,gaussian", *TINY_RUN, f"hydra.sweep.dir={sweep}"]
    r = launch(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    done = sorted(line.rsplit("  ", 1)[1] for line in lines if line.startswith("done: p=0.5"))
    assert done == ["[optim.lr=0.5 init=gaussian]", "[optim.lr=0.5 init=zero]",
                    "[optim.lr=1 init=gaussian]", "[optim.lr=1 init=zero]"]
    jobs = [line for line in lines if line.startswith("job ")]
    assert jobs[0].startswith("job 1/") and "of 4" in jobs[0]
    assert lines.index(next(l for l in lines if l.endswith("runs finished so far"))) > lines.index(jobs[0])
    r = launch(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    skipped = [line for line in r.stdout.splitlines() if line.startswith("skipped (done): p=0.5")
               and line.endswith("]")]
    assert len(skipped) == 4 and not any(line.startswith("done:") for line in r.stdout.splitlines())


@pytest.mark.e2e
def test_a_single_run_says_where_its_folder_is(tmp_path):
    r = launch(*TINY_RUN, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"run folder: {tmp_path / 'r'}" in r.stdout.splitlines()


def test_a_pseudo_terminal_without_a_size_gets_the_log_line_ticker(tmp_path):
    """`script -qc` gives a terminal that reports no size: the run still says it is training."""
    import shutil
    import subprocess
    import sys

    from .conftest import ROOT
    if shutil.which("script") is None:
        import pytest
        pytest.skip("no `script` (util-linux) here")
    cmd = f"{sys.executable} {ROOT / 'launch.py'} debug=default hydra.run.dir={tmp_path / 'r'}"
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("CI", "COLUMNS", "LINES")}
    out = subprocess.run(["script", "-qc", cmd, "/dev/null"], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "training 1 run(s): step 0 → 5" in out.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("args, cause", [
    (["init=no_such_init"], "hydra.errors.MissingConfigException: In 'config': Could not find 'init/no_such_init'"),
    (["data.p=1.5"], None),
    (["-m", "init=zero,gaussian", "init.sigma=1e-4,1e-2"], None),   # refused by the sweeper, inside Hydra
])
def test_hydra_full_error_gives_the_whole_trace_as_hydra_does(tmp_path, args, cause):
    """HYDRA_FULL_ERROR=1, Hydra's switch: the refusal raised whole (Python's trace, with the Hydra error it was
    made from, exit 1); without it, the same message as one line and exit 2. Nothing is written either way."""
    where = [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    full = launch(*args, *where, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and full.stderr.startswith("Traceback (most recent call last):"), full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("rw_sweeps.core.errors.ConfigError: invalid config: ")
    if cause:
        assert cause in full.stderr and "The above exception was the direct cause" in full.stderr
    plain = launch(*args, *where, cwd=tmp_path, env={"HYDRA_FULL_ERROR": ""})
    assert plain.returncode == 2 and plain.stderr == "error: " + last.split(": ", 1)[1] + "\n"
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


# ------------------------------------------------------------------------------ the suite's launches
def _seen(r: subprocess.CompletedProcess, folder, files) -> tuple:
    """What a launch shows: its status, its lines and files, but for the times they name, the seconds a run took
    and its folder (`run_id` is a digest of the folder's path)."""
    def text(t: str) -> str:
        return re.sub(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]", "[time]", t).replace(str(folder), "FOLDER")

    def read(f):
        if f.name == "summary.json":
            return {k: v for k, v in json.loads(f.read_text()).items() if k not in ("wall_s", "run_id")}
        return text(f.read_text())

    made = {str(f.relative_to(folder)): read(f) for f in sorted(folder.rglob("*")) if f.is_file() and f.name in files}
    return r.returncode, text(r.stdout), text(r.stderr), made


@pytest.mark.e2e
@pytest.mark.parametrize("args, env, status", [
    (["-m", "data.p=0.5,1", *SMALL], {}, 0),                        # a sweep: its lines, its folders' files
    (["data.p=1.5"], {}, 2),                                        # a refusal: one line
    (["init=no_such_init"], {"HYDRA_FULL_ERROR": "1"}, 1),              # Python's whole trace, from launch.py's frame
    (["-m", "data.p=0.5", *SMALL], {"RW_SWEEPS_PROGRESS_S": "0"}, 0),   # read as a batch starts
], ids=["sweep", "refusal", "trace", "import-time-variable"])
def test_the_suites_forked_launch_is_what_a_fresh_interpreter_gives(tmp_path, args, env, status):
    """The suite's `launch` forks from a server that imported torch and the other libraries once
    (tests/_forked.py): the exit status, stdout, stderr and files of `subprocess.run([python, launch.py, …])`."""
    seen = []
    for how in ("fresh", "forked"):
        folder = tmp_path / how / "launch"   # the same last two parts: a sweep's wandb group
        argv = [*args, f"hydra.run.dir={folder / 'run'}", f"hydra.sweep.dir={folder / 'sweep'}",
                "wandb.mode=disabled", "wandb.analysis=false"]
        e = {**_forked.BASE, "WANDB_SILENT": "true", **env}   # the server's own, and what the case changes
        folder.mkdir(parents=True)
        seen.append(_seen(_both(how, [ROOT / "launch.py", *argv], folder, e), folder,
                          {"summary.json", "history.jsonl", "config.yaml", "rw.log"}))
    assert seen[0] == seen[1] and seen[0][0] == status


def _both(how: str, argv: list, cwd, env: dict) -> subprocess.CompletedProcess:
    if how == "forked":
        assert _forked.serves(env)
        return _forked.run(argv, cwd, env, timeout=600)
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=600)


@pytest.mark.e2e
@pytest.mark.parametrize("args, status", [(["--out", "report"], 0), (["--metric", "speed", "--out", "report"], 2),
                                          (["--no-such-flag"], 2)], ids=["report", "refusal", "usage"])
def test_a_forked_python_dash_m_is_what_a_fresh_interpreter_gives(tmp_path, args, status):
    """`python -m analysis`, which the suite forks too: the same status, lines and report files (`-m` runs as the
    interpreter runs it: argv[0] the module's file, the folder first on sys.path)."""
    sweep = tmp_path / "S"
    r = launch("-m", "data.p=0.5,1", *SMALL, f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    seen = []
    for how in ("fresh", "forked"):
        folder = tmp_path / how / "analysis"
        folder.mkdir(parents=True)
        e = {**_forked.BASE, "MPLBACKEND": "Agg"}
        got = _both(how, ["-m", "analysis", sweep, *args], folder, e)
        seen.append(_seen(got, folder, {"index.html"}))
    assert seen[0] == seen[1] and seen[0][0] == status, seen[1][2]


@pytest.mark.e2e
def test_a_launch_whose_environment_changes_what_a_library_read_at_load_is_not_forked(tmp_path):
    """Only variables the project reads as it runs may differ from the server's; anything else (the interpreter's,
    a thread pool's, an allocator's, the time zone, torch's) gets a fresh interpreter, as does a script that is
    not a file (the interpreter's own refusal)."""
    e = dict(_forked.BASE)
    script = [ROOT / "launch.py"]
    assert _forked.serves(e, script) and _forked.serves(e, ["-m", "analysis"])
    assert _forked.serves({**e, "RW_SWEEPS_PROGRESS_S": "1", "HYDRA_FULL_ERROR": "1", "WANDB_MODE": "offline"}, script)
    for name, value in (("OMP_NUM_THREADS", "2"), ("PYTHONHASHSEED", "1"), ("MKL_NUM_THREADS", "7"),
                        ("LD_PRELOAD", "x.so"), ("PYTHONUNBUFFERED", ""), ("TZ", "Asia/Tokyo"), ("PYTORCH_JIT", "0"),
                        ("ARROW_DEFAULT_MEMORY_POOL", "system"), ("LANG", "C")):
        assert not _forked.serves({**e, name: value}, script), name
    assert not _forked.serves({k: v for k, v in e.items() if k != "PATH"}, script)   # removed counts too
    assert not _forked.serves(e, [tmp_path / "absent.py"]) and not _forked.serves(e, [tmp_path])
