"""README, "Faults": the seal key is made whole in one step, and every problem
with it is one line naming the file and the fix, in every command that seals; a grid is counted before it
is built, and one over `hydra.sweeper.max_runs` is one line before anything is written."""
from __future__ import annotations

import hashlib
import hmac
import math
import multiprocessing
import os
import stat
import subprocess
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from rw_sweeps.sweeps.grid_count import MAX_RUNS, grid_size, refuse_large_grid
from rw_sweeps.core import seal
from rw_sweeps.core.errors import ConfigError
from rw_sweeps.sweeps.hydra_adapter import split_arguments
from rw_sweeps.sweeps.planner import packaged_conf

from .conftest import SMALL, launch, one_error_line, python, start_launch


# ------------------------------------------------------------------------------ the key at first use
def _first_use(path: str, barrier, results) -> None:
    """One process of the race: set the key's path, wait for the others, then seal as a run does."""
    os.environ["RW_SWEEPS_SEAL_KEY"] = path
    seal._key.cache_clear()  # forked: nothing the parent read counts
    barrier.wait()
    try:
        results.put(("ok", seal.seal(b"x")))
    except Exception as exc:  # noqa: BLE001 - what the race makes of it, reported to the parent
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def test_eight_processes_at_first_use_all_seal_with_one_32_byte_key(tmp_path):
    """The issue's race: 17 of 200 trials of 8 processes found the key empty (created, then written). Made
    whole and linked into place, every process of every trial seals with the one key the file holds."""
    ctx = multiprocessing.get_context("fork")
    for trial in range(50):
        path = tmp_path / f"t{trial}" / "rw" / "seal.key"
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(str(path), barrier, results)) for _ in range(8)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 8
        key = path.read_bytes()
        assert len(key) == seal.KEY_BYTES
        want = hmac.new(key, len(b"x").to_bytes(8, "little") + b"x", hashlib.sha256).hexdigest()
        assert got == [("ok", want)] * 8, f"trial {trial}: {got}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert os.listdir(path.parent) == ["seal.key"]  # no temp file left


def _watch_key_being_made(path: str, results) -> None:
    """In a forked child (an audit hook cannot be removed): the size the key's name has at each file-system
    step of making the key (None: no such name)."""
    import sys

    seen = []

    def hook(event, args):
        if event in ("open", "os.mkdir", "os.link", "os.rename", "os.remove", "os.chmod"):
            try:
                seen.append((event, os.lstat(path).st_size))
            except FileNotFoundError:
                seen.append((event, None))

    os.environ["RW_SWEEPS_SEAL_KEY"] = path
    seal._key.cache_clear()
    sys.addaudithook(hook)
    seal.check()
    results.put(seen)


def test_the_seal_keys_name_never_holds_part_of_a_key(tmp_path):
    """The race's cause, without a race: at every step of making the key, its name is missing or holds all 32
    bytes (the key made empty and then written held 0 bytes at the step after its creation)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_watch_key_being_made, args=(str(tmp_path / "rw" / "seal.key"), results))
    child.start()
    seen = results.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert ("os.link", None) in seen and seen[-1][1] == 32
    assert {size for _, size in seen} <= {None, 32}, seen


# ------------------------------------------------------------------------------ unusable keys: one line
def _key_file(p, content: bytes = b"k" * 32, mode: int = 0o600) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content)
    p.chmod(mode)


def _empty(p):
    _key_file(p, b"")
    return "the seal key is empty, not 32 bytes (cut short, or not a key); delete it to make a new one"


def _short(p):
    _key_file(p, b"k" * 31)
    return "the seal key is 31 bytes long, not 32 bytes (cut short, or not a key); delete it to make a new one"


def _long(p):
    _key_file(p, b"k" * 4096)
    return "the seal key is 4,096 bytes long, not 32 bytes (cut short, or not a key); delete it to make a new one"


def _symlink(p):
    _key_file(p.parent / "elsewhere.key")
    p.symlink_to(p.parent / "elsewhere.key")
    return "the seal key is a symbolic link; replace the link with the file itself, or delete it to make a new one"


def _folder(p):
    p.mkdir(parents=True)
    return "the seal key is a folder, not a file; remove it to make a new one"


def _fifo(p):  # opened without blocking: a FIFO nobody writes is refused, not waited on
    p.parent.mkdir(parents=True)
    os.mkfifo(p, 0o600)
    return "the seal key is a FIFO, not a file; remove it to make a new one"


def _readable_by_others(p):
    _key_file(p, mode=0o644)
    return f"the seal key is readable by others (mode 0644); run chmod 600 {p}, or delete it to make a new one"


def _writable_by_others(p):
    _key_file(p, mode=0o620)
    return f"the seal key is writable by others (mode 0620); run chmod 600 {p}, or delete it to make a new one"


def _another_owner(p):
    if os.getuid() != 0:
        pytest.skip("making a file of another user needs root")
    _key_file(p)
    os.chown(p, 4242, -1)
    return (f"the seal key belongs to uid 4242, not to you (uid {os.getuid()}); set RW_SWEEPS_SEAL_KEY to a file "
            "of yours, or delete it to make a new one")


def _folder_is_a_file(p):
    p.parent.parent.mkdir(parents=True)
    p.parent.write_text("not a folder")
    return (f"its folder cannot be created: {p.parent} on its path is not a folder; set RW_SWEEPS_SEAL_KEY to "
            "a file in a folder of yours")


def _folder_not_writable(p):
    if os.getuid() == 0:
        pytest.skip("root writes into any folder")
    p.parent.parent.mkdir(parents=True)
    p.parent.parent.chmod(0o500)
    return ("its folder cannot be created (Permission denied); make the folder yourself, or set "
            "RW_SWEEPS_SEAL_KEY to a file in a folder of yours")


BAD_KEYS = [_empty, _short, _long, _symlink, _folder, _fifo, _readable_by_others, _writable_by_others,
            _another_owner, _folder_is_a_file, _folder_not_writable]
IDS = [f.__name__.lstrip("_") for f in BAD_KEYS]


def _bad_key(tmp_path, make):
    """A key path in `make`'s state, the line it must give, and a snapshot of it (what the commands must
    leave as it was: the project touches only what it made)."""
    p = tmp_path / "keys" / "rw" / "seal.key"
    why = make(p)
    return p, f"error: {p}: {why}", _state(p)


def _state(p):
    try:
        s = os.lstat(p)
    except OSError:
        return None
    return (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_uid, s.st_size, s.st_mtime_ns)


@pytest.mark.parametrize("make", BAD_KEYS, ids=IDS)
def test_an_unusable_seal_key_is_one_line_naming_the_file_and_the_fix(tmp_path, monkeypatch, make):
    p, line, _ = _bad_key(tmp_path, make)
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(p))
    seal._key.cache_clear()
    with pytest.raises(seal.SealKeyError) as e:
        seal.check()
    assert f"error: {e.value}" == line
    with pytest.raises(seal.SealKeyError):
        seal.seal(b"x")  # what a checkpoint's or the cache's seal meets


@pytest.mark.e2e
@pytest.mark.parametrize("make", BAD_KEYS, ids=IDS)
def test_a_launch_with_checkpoints_refuses_an_unusable_seal_key_in_one_line(tmp_path, make):
    """Each run of `checkpoint_every=1` failed with a traceback; now one line before anything is written."""
    p, line, before = _bad_key(tmp_path, make)
    run = tmp_path / "run"
    r = launch(*SMALL, "optim.steps=5", "checkpoint_every=1", f"hydra.run.dir={run}", cwd=tmp_path,
               env={"RW_SWEEPS_SEAL_KEY": str(p)})
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == line
    assert not run.exists()
    assert _state(p) == before


@pytest.mark.e2e
def test_a_sweep_refuses_an_unusable_seal_key_before_its_folder_is_made(tmp_path):
    p, line, before = _bad_key(tmp_path, _readable_by_others)
    sweep = tmp_path / "S"
    r = launch("-m", *SMALL, "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env={"RW_SWEEPS_SEAL_KEY": str(p)})
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == line
    assert not sweep.exists() and _state(p) == before


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """A finished 1-run sweep whose checkpoints were sealed with a key made at first use."""
    root = tmp_path_factory.mktemp("sealed")
    key, sweep = root / "keys" / "seal.key", root / "S"
    r = launch("-m", *SMALL, "optim.steps=5", "checkpoint_every=1", "seed=0", f"hydra.sweep.dir={sweep}", cwd=root,
               env={"RW_SWEEPS_SEAL_KEY": str(key)})
    assert r.returncode == 0, r.stderr
    return sweep, key


@pytest.mark.e2e
def test_a_key_made_at_first_use_is_private_and_serves_checkpoints_and_analysis(finished_sweep, tmp_path):
    sweep, key = finished_sweep
    assert len(key.read_bytes()) == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.stat().st_uid == os.getuid()
    r = python("-m", "analysis", sweep, "--out", tmp_path / "report", env={**os.environ, "RW_SWEEPS_SEAL_KEY": str(key)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.mark.e2e
@pytest.mark.parametrize("make", BAD_KEYS, ids=IDS)
def test_analysis_refuses_an_unusable_seal_key_in_one_line(finished_sweep, tmp_path, make):
    """`python -m analysis` ended in a traceback; now one line, exit 2, and nothing written (the sweep's
    sealed cache included)."""
    sweep, _ = finished_sweep
    p, line, before = _bad_key(tmp_path, make)
    files = sorted(q.relative_to(sweep) for q in sweep.rglob("*"))
    out = tmp_path / "report"
    r = python("-m", "analysis", sweep, "--out", out, env={**os.environ, "RW_SWEEPS_SEAL_KEY": str(p)})
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == line
    assert not out.exists()
    assert sorted(q.relative_to(sweep) for q in sweep.rglob("*")) == files
    assert _state(p) == before


@pytest.mark.e2e
def test_a_key_made_private_again_serves_the_launch(tmp_path):
    """The fix the line names works: after `chmod 600` the same launch trains and seals its checkpoints."""
    p, line, _ = _bad_key(tmp_path, _readable_by_others)
    run = tmp_path / "run"
    args = (*SMALL, "optim.steps=5", "checkpoint_every=1", f"hydra.run.dir={run}")
    env = {"RW_SWEEPS_SEAL_KEY": str(p)}
    assert one_error_line(launch(*args, cwd=tmp_path, env=env)) == line
    p.chmod(0o600)
    r = launch(*args, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (run / "summary.json").is_file()


# ------------------------------------------------------------------------------ a grid counted before it is built
def _parse(overrides):
    return OverridesParser.create().parse_overrides(list(overrides))


def _hydra_count(overrides) -> int:
    return sum(len(b) for b in split_arguments(_parse(overrides), None))


_ints = st.integers(-30, 30)
_int_range = st.builds(lambda a, b, s: f"range({a},{b},{s})", _ints, _ints, st.integers(-7, 7).filter(bool))
_float_range = st.builds(lambda a, b, s: f"range({a!r},{b!r},{s!r})", st.floats(-3, 3), st.floats(-3, 3),
                         st.sampled_from([0.1, 0.25, -0.1, 0.05, 0.3, -0.7, 1.1, 0.01]))
_values = st.one_of(
    _int_range, _float_range, st.builds(lambda n: f"range({n})", st.integers(0, 40)),
    st.lists(st.integers(0, 9).map(str), min_size=2, max_size=6).map(",".join),
    st.lists(st.integers(0, 9).map(str), min_size=1, max_size=6).map(lambda v: f"choice({','.join(v)})"),
    st.integers(0, 9).map(str), _int_range.map(lambda r: f"shuffle({r})"))
_grids = st.lists(st.tuples(st.sampled_from(["seed", "data.p", "optim.lr", "+x", "init.sigma"]), _values),
                  min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_grids)
def test_grid_size_is_the_number_of_jobs_hydra_lists(grid):
    """Over ranges (int and float, either direction, empty), comma lists, choice(), shuffle(), plain
    values and keys given twice (the later wins): the count is the length of Hydra's own expansion."""
    overrides = [f"{k}={v}" for k, v in grid]
    assert grid_size(_parse(overrides))[0] == _hydra_count(overrides)


def test_grid_size_counts_a_glob_by_the_group_options_it_matches():
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=packaged_conf(), version_base="1.3"):
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            parsed = parser.parse_overrides(["data=glob(*)", "seed=0,1"])
            listed = sum(len(b) for b in split_arguments(parsed, None))
            assert grid_size(parsed)[0] == listed > 2
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("overrides, runs", [
    (["seed=range(0,10000000)"], 10_000_000),
    (["seed=range(0,1000)", "data.p=range(0,1,0.001)", "init.sigma=1,2,3,4,5"], 5_000_000),
    (["seed=range(0,100000)", "data.p=range(0,100000)", "optim.lr=range(0,100000)"], 10 ** 15),
], ids=["range-1e7", "3-key-product", "1e15"])
def test_grid_size_takes_no_time_and_no_memory_whatever_the_count(overrides, runs):
    parsed = _parse(overrides)
    tracemalloc.start()
    t = time.perf_counter()
    n, sizes = grid_size(parsed)
    elapsed = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"{overrides}: {n:,} runs counted in {elapsed * 1e3:.3f} ms, {peak / 1024:.1f} KiB at peak")
    assert n == runs and n == math.prod(sizes.values())
    assert elapsed < 0.5 and peak < 1 << 20


def test_a_grid_over_max_runs_names_the_count_the_limit_and_the_keys():
    with pytest.raises(ConfigError) as e:
        refuse_large_grid(_parse(["seed=range(0,1000)", "data.p=0,0.5", "optim.steps=5", "seed=range(0,2000)"]), 3999)
    assert str(e.value) == ("invalid config: hydra.sweeper.max_runs=3999: this sweep has 4,000 runs (seed: 2,000 "
                            "values × data.p: 2 values); raise hydra.sweeper.max_runs to launch it")
    refuse_large_grid(_parse(["seed=range(0,1000)", "data.p=0,0.5"]), 2000)  # at the limit: launched


@pytest.mark.parametrize("limit", [0, -1, True, 2.5])
def test_max_runs_must_be_a_whole_number_at_least_1(limit):
    with pytest.raises(ConfigError, match=r"hydra.sweeper.max_runs=.*: must be a whole number of runs, at least 1$"):
        refuse_large_grid(_parse(["seed=0"]), limit)


@pytest.mark.parametrize("value", ["range(0,1,0)", "range(0.0,1.0,0.0)"], ids=["int", "float"])
def test_a_range_with_step_0_is_one_line_not_an_endless_expansion(value):
    """Hydra's FloatRange with step 0 yields None for ever (its expansion never ends); Python's range raises."""
    with pytest.raises(ConfigError) as e:
        grid_size(_parse([f"data.p={value}"]))
    assert str(e.value).endswith(": a range's step must not be 0") and str(e.value).startswith("invalid config: data.p=")


def test_the_default_limit_serves_a_million_run_sweep():
    assert MAX_RUNS >= 1_000_000
    refuse_large_grid(_parse(["seed=range(0,1000000)"]), MAX_RUNS)


@pytest.mark.e2e
def test_a_ten_million_run_grid_is_refused_in_one_line_before_anything_is_written(tmp_path):
    """The issue's case: 90 s without output and 2.4 GB inside Hydra's expansion. Now one line, in seconds."""
    sweep = tmp_path / "S"
    t = time.monotonic()
    p = start_launch("-m", "seed=range(0,10000000)", f"hydra.sweep.dir={sweep}", cwd=tmp_path)  # a fresh interpreter
    out, err = p.communicate(timeout=300)
    elapsed = time.monotonic() - t
    print(f"refused in {elapsed:.2f} s")
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == ("error: invalid config: hydra.sweeper.max_runs=1000000: this sweep has 10,000,000 "
                                 "runs (seed: 10,000,000 values); raise hydra.sweeper.max_runs to launch it")
    assert elapsed < 30  # generous: a loaded 2-core VM; the whole process takes ~2 s alone (this VM)
    assert not sweep.exists()


@pytest.mark.e2e
def test_a_presets_params_are_counted_with_the_command_line(tmp_path):
    """`experiment=locking` sweeps 4 × 3 × 2 values and 50 seeds in `hydra.sweeper.params`; the command line's
    seeds replace its own, as in Hydra's expansion."""
    sweep = tmp_path / "S"
    r = launch("-m", "experiment=locking", "seed=range(0,5000)", "hydra.sweeper.max_runs=100000",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == ("error: invalid config: hydra.sweeper.max_runs=100000: this sweep has 120,000 runs "
                                 "(seed: 5,000 values × data.n_train: 4 values × data.N: 3 values × model.M: 2 "
                                 "values); raise hydra.sweeper.max_runs to launch it")
    assert not sweep.exists()


@pytest.mark.e2e
def test_max_runs_is_a_key_and_a_raised_limit_launches(tmp_path):
    """The limit is a key: `hydra.sweeper.max_runs=2` refuses 3 runs in one line; 3 lets the same grid run."""
    sweep = tmp_path / "S"
    args = ("-m", *SMALL, "optim.steps=2", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    r = launch(*args, "hydra.sweeper.max_runs=2", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == ("error: invalid config: hydra.sweeper.max_runs=2: this sweep has 3 runs (seed: 3 "
                                 "values); raise hydra.sweeper.max_runs to launch it")
    assert not sweep.exists()
    r = launch(*args, "hydra.sweeper.max_runs=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(q.parent.name for q in sweep.glob("*/summary.json")) == ["0", "1", "2"]
