"""Trust of the sweep store (`rw_sweeps.core.store`): tests/test_trust.py's hostile but fair user, and
tests/test_signals.py's unlucky one, against a sweep whose runs are shards, not folders.

A shard cut at any byte, bit-flipped, planted (no seal, another user's key) or copied under another name
holds no run that is `done` — for the contract's judge, the store's index and rw-status alike — and the
same command trains exactly its runs again, to the bytes an untouched sweep holds; a run two shards hold
counts once; nothing at a shard's name is read past its cap, followed or waited on; a kill, a stop or a full
disk at any moment loses nothing stored, and the relaunch ends as an uninterrupted sweep. Real launches
wherever a process matters; `S` is a small sweep of four runs in two jobs, so two shards.
"""
from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rw_sweeps.core import contract, layout, readers, store
from rw_sweeps.core.results import CHECKPOINT_CAP
from rw_sweeps.core.store import shard

from .conftest import small_tmpfs, cpu_seconds, launch, start_launch, status_here, steps_lasting, wait_for_work, wait_until
from .test_signals import Output, the_line

pytestmark = pytest.mark.e2e  # every test here starts a process (tests/conftest.py)

S = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled"]
GRID = ["data.p=0.5,1", "seed=0,1"]  # four runs
STORED = ["hydra.launcher.store=true", "hydra.launcher.max_runs_per_job=2"]  # two jobs: two shards of two runs
RUNS = ["0", "1", "2", "3"]
# what a summary says of where and when, not of the run: its wall time, its id, the commit of a shared checkout
LOCAL = {"wall_s", "run_id", "git_commit", "git_dirty", "host"}
HANG_S = 180  # a hang guard: every command here takes seconds
HEAD, BODY, CKPT = shard.HEAD, shard.BODY, shard.CHECKPOINT
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
_fresh = itertools.count()  # a new folder per Hypothesis example: the index is cached per folder and listing


def command(sweep: Path, *extra: str, shape=S, grid=GRID) -> list[str]:
    return ["-m", *grid, *shape, *STORED, f"hydra.sweep.dir={sweep}", *extra]


def shards(sweep: Path) -> dict[str, list[str]]:
    """{shard id: the runs it holds} of the heads the store accepts."""
    out: dict[str, list[str]] = {}
    for run, (sid, _, _) in store.index(sweep).runs.items():
        out.setdefault(sid, []).append(run)
    return {sid: sorted(runs) for sid, runs in sorted(out.items())}


def records(sweep: Path) -> dict[str, tuple[dict, str, str]]:
    """Every stored run's summary (where and when left out), history text and snapshots text, each body
    verified against the head that holds the run."""
    idx = store.index(sweep)
    out = {}
    for sid, (_, meta) in idx.heads.items():
        raw = (Path(sweep) / store.STORE / (sid + BODY)).read_bytes()
        shard.verify_body(sid, meta, raw)
        t = shard.read_body(raw)
        for run, hist, snaps in zip(*(t.column(c).to_pylist() for c in ("_run", "history", "snapshots"))):
            if idx.runs[run][0] == sid:
                summary = idx.record(run)[1]
                out[run] = ({k: v for k, v in summary.items() if k not in LOCAL}, hist, snaps)
    return out


def shard_files(sweep: Path) -> dict[str, bytes]:
    """The bytes of every head and body in the store, by name."""
    return {n: (Path(sweep) / store.STORE / n).read_bytes() for n in in_store(sweep, (HEAD, BODY))
            if stat.S_ISREG(os.lstat(Path(sweep) / store.STORE / n).st_mode)}


def in_store(sweep: Path, suffix) -> list[str]:
    """The names in the sweep's store that end with `suffix` (none where it has no store yet)."""
    folder = Path(sweep) / store.STORE
    return sorted(n for n in os.listdir(folder) if n.endswith(suffix)) if folder.is_dir() else []


def counts(out: str, sweep: Path) -> dict[str, int]:
    """rw-status's line about the sweep, as numbers."""
    m = re.search(rf"^sweep {re.escape(str(sweep))}: (\d+) runs: (\d+) done, (\d+) skipped, (\d+) failed, "
                  r"(\d+) diverged", out, re.M)
    assert m, out
    return dict(zip(("runs", "done", "skipped", "failed", "diverged"), map(int, m.groups())))


def last_line(sweep: Path, done: int, skipped: int, failed: int = 0) -> str:
    return f"sweep {sweep}: 4 runs: {done} done, {skipped} skipped, {failed} failed, 0 diverged"


def copy_sweep(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def relaunch(sweep: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    r = launch(*command(sweep, *extra, **kw), timeout=HANG_S)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-3000:]
    return r


def assert_not_done(sweep: Path, refused: str, victims: list[str]) -> None:
    """`refused` is refused in one line, and the runs it held (`victims`) are done for nobody: not for the
    index, the contract's judge or rw-status; every other run is done for all three."""
    idx = store.index(sweep)
    assert refused in idx.refused and "\n" not in idx.refused[refused], idx.refused
    assert not set(victims) & set(idx.runs), (victims, idx.runs)
    others = [n for n in RUNS if n not in victims]
    assert {n: idx.runs[n][2] for n in others} == {n: "done" for n in others}
    assert {n: contract.judge(sweep / n).done for n in RUNS} == {n: n in others for n in RUNS}
    st_ = status_here(str(sweep))
    c = counts(st_.stdout, sweep)
    assert c["runs"] == 4 and c["done"] + c["skipped"] == len(others), st_.stdout


# ------------------------------------------------------------------------------------------ the sweeps
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The four runs, stored by two jobs: what every damaged sweep's relaunch must end as."""
    d = tmp_path_factory.mktemp("store") / "S"
    r = launch(*command(d), timeout=HANG_S)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == last_line(d, 4, 0), r.stdout + r.stderr
    assert sorted(shards(d).values()) == [["0", "1"], ["2", "3"]]
    assert sorted(p.name for p in d.iterdir()) == [".rw_sweep.json", "multirun.yaml", "store"]  # no run folder
    assert in_store(d, CKPT) == [] and sorted(layout.run_folders(d)) == RUNS
    return d


@pytest.fixture
def s(reference, tmp_path) -> Path:
    """A fresh copy of the reference sweep, for this test to damage."""
    return copy_sweep(reference, tmp_path / "S")


def parts(sweep: Path) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
    """The two shards, (id, runs) each, in the order of their ids."""
    a, b = shards(sweep).items()
    return a, b


# ------------------------------------------------------------------------------------------ damage anywhere
def _cut(path: Path, at: int) -> None:
    os.truncate(path, at)


def _flip(path: Path, at: int, bit: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ (1 << bit)]))


@settings(max_examples=100, **SETTINGS)
@given(data=st.data())
def test_a_head_or_body_cut_at_any_byte_or_with_any_bit_flipped_holds_no_done_run(reference, tmp_path, data):
    sweep = copy_sweep(reference, tmp_path / f"S{next(_fresh)}")
    sid, victims = data.draw(st.sampled_from(parts(sweep)), label="shard")
    kind = data.draw(st.sampled_from(["head cut", "head flipped", "body cut", "body flipped"]), label="damage")
    name = sid + (BODY if kind.startswith("body") else HEAD)
    path = sweep / store.STORE / name
    size = path.stat().st_size
    at = data.draw(st.one_of(st.integers(0, size - 1), st.sampled_from([0, 4, size - 8, size - 4, size - 1])),
                   label="at")
    if kind.endswith("flipped"):
        _flip(path, at, data.draw(st.integers(0, 7), label="bit"))
    else:
        _cut(path, at)
    assert_not_done(sweep, name, victims)


@pytest.mark.parametrize("where", [0.1, 0.5, 0.97])
def test_a_body_with_a_bit_flipped_holds_no_done_run(s, where):
    (sid, victims), _ = parts(s)
    path = s / store.STORE / (sid + BODY)
    _flip(path, int(where * path.stat().st_size), 2)
    assert_not_done(s, sid + BODY, victims)
    assert "not the body its head was sealed with" in store.index(s).refused[sid + BODY]
    assert store.body_rows(s, victims) == {}  # and no reader of histories gets its rows


# ------------------------------------------------------------------------------------------ planted, copied, renamed
def _columns(sweep: Path, sid: str) -> tuple[dict, dict]:
    """The columns of the shard `sid`'s head and body."""
    head = shard.read_head(store.index(sweep).heads[sid][0])
    body = shard.read_body((sweep / store.STORE / (sid + BODY)).read_bytes())
    return ({c: head.column(c).to_pylist() for c in head.column_names},
            {c: body.column(c).to_pylist() for c in body.column_names})


def _encoded_again(sweep: Path, sid: str, as_sid: str, key: Path | None = None, monkeypatch=None) -> tuple[bytes, bytes]:
    """The shard `sid` made again whole by `shard.encode`, as `as_sid`: the same columns, metadata and body,
    sealed with this user's key, or with `key` (another user's)."""
    meta = store.index(sweep).heads[sid][1]
    columns = _columns(sweep, sid)
    if key is None:
        return shard.encode(as_sid, *columns, meta["config_keys"], store.sweep_id(sweep))
    with monkeypatch.context() as m:
        m.setenv("RW_SWEEPS_SEAL_KEY", str(key))
        return shard.encode(as_sid, *columns, meta["config_keys"], store.sweep_id(sweep))


def _another_users_key(folder: Path) -> Path:
    key = folder / "theirs.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    return key


def plant(sweep: Path, how: str, monkeypatch) -> tuple[str, list[str]]:
    """Damage or plant one shard of `sweep` as `how` says: (the file the store must refuse, the runs that
    are then no run's record)."""
    (a, a_runs), (b, b_runs) = parts(sweep)
    folder = sweep / store.STORE
    head, body = folder / (a + HEAD), folder / (a + BODY)
    if how == "head cut":
        _cut(head, head.stat().st_size // 2)
    elif how == "head bit flipped":
        _flip(head, 200, 3)
    elif how == "body cut":
        _cut(body, body.stat().st_size - 1)
        return a + BODY, a_runs
    elif how == "sealed with another user's key":
        new_head, new_body = _encoded_again(sweep, a, a, _another_users_key(sweep.parent), monkeypatch)
        body.write_bytes(new_body)
        head.write_bytes(new_head)
    elif how == "written without the seal key":  # a valid Parquet file of the same table, no seal
        pq.write_table(shard.read_head(head.read_bytes()), head)
    elif how == "its seal zeroed":
        raw = head.read_bytes()
        mark = store.index(sweep).heads[a][1]["seal"].encode()
        head.write_bytes(raw.replace(mark, b"0" * len(mark)))
    elif how == "copied over another shard's name":
        shutil.copyfile(head, folder / (b + HEAD))
        shutil.copyfile(body, folder / (b + BODY))
        return b + HEAD, b_runs
    elif how == "renamed":  # a copy under a new name, the original gone
        new = "w0123456789ab-00000"
        os.replace(body, folder / (new + BODY))
        os.replace(head, folder / (new + HEAD))
        return new + HEAD, a_runs
    elif how == "copied under a new name":  # the original stays: its runs stay done, the copy adds nothing
        new = "w0123456789ab-00001"
        shutil.copyfile(body, folder / (new + BODY))
        shutil.copyfile(head, folder / (new + HEAD))
        return new + HEAD, []
    else:
        raise AssertionError(how)
    return a + HEAD, a_runs


PLANTS = ["head cut", "head bit flipped", "body cut", "sealed with another user's key", "written without the seal key",
          "its seal zeroed", "copied over another shard's name", "renamed", "copied under a new name"]


@pytest.mark.parametrize("how", PLANTS)
def test_a_damaged_or_planted_shard_holds_no_done_run(s, how, monkeypatch):
    assert_not_done(s, *plant(s, how, monkeypatch))


# one of each way a launch comes to a shard it refuses: a head that does not verify (of whatever cause: the seal
# covers every byte), a body of the wrong size, a head at another's name, a head moved away from its own
@pytest.mark.parametrize("how", ["head cut", "sealed with another user's key", "body cut",
                                 "copied over another shard's name", "renamed"])
def test_a_damaged_or_planted_shard_is_refused_and_the_relaunch_retrains_exactly_its_runs(reference, s, how,
                                                                                          monkeypatch):
    refused, victims = plant(s, how, monkeypatch)
    assert_not_done(s, refused, victims)
    sound = [sid for sid, runs in shards(s).items() if not set(runs) & set(victims)]
    kept = {n: b for n, b in shard_files(s).items() if n.split(".")[0] in sound}
    r = relaunch(s)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == last_line(s, len(victims), 4 - len(victims)), r.stdout
    assert {n: b for n, b in shard_files(s).items() if n in kept} == kept  # nothing stored was touched
    assert records(s) == records(reference)  # the same runs, to the byte of every history and snapshot
    assert all(contract.judge(s / n).done for n in RUNS)
    assert counts(status_here(str(s)).stdout, s) == dict(runs=4, done=len(victims), skipped=4 - len(victims),
                                                        failed=0, diverged=0)


def test_the_plant_sealed_with_another_key_is_a_valid_shard_under_ones_own(s):
    """The control of the plant above: the same shard made again with this user's key is a record."""
    (a, a_runs), _ = parts(s)
    new_head, new_body = _encoded_again(s, a, "w0123456789ab-00000")
    before = records(s)
    for f in (a + HEAD, a + BODY):
        (s / store.STORE / f).unlink()
    (s / store.STORE / ("w0123456789ab-00000" + BODY)).write_bytes(new_body)
    (s / store.STORE / ("w0123456789ab-00000" + HEAD)).write_bytes(new_head)
    assert store.index(s).refused == {} and records(s) == before
    assert all(contract.judge(s / n).done for n in RUNS)


def test_a_refused_shard_is_named_in_one_line_by_status_and_by_the_relaunch(s, monkeypatch):
    refused, victims = plant(s, "head cut", monkeypatch)
    st_ = status_here(str(s))
    assert len([ln for ln in (st_.stdout + st_.stderr).splitlines() if refused in ln]) == 1, st_.stdout + st_.stderr
    r = relaunch(s)
    named = [ln for ln in (r.stdout + r.stderr).splitlines() if refused in ln]
    retraining = [ln for ln in r.stdout.splitlines() if ln.startswith("retraining ")]
    assert len(named) == 1 or sorted(retraining) == sorted(f"retraining {s / n}: " for n in victims), r.stdout


# ------------------------------------------------------------------------------------------ two writers
@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    """The same command in another folder: the same four runs, stored by two other writers."""
    d = tmp_path_factory.mktemp("twin") / "S"
    r = launch(*command(d), timeout=HANG_S)
    assert r.returncode == 0, r.stderr
    return d


def test_shards_of_another_sweep_copied_in_hold_no_run(reference, twin, s):
    """A sweep's heads are sealed with its store's own id: the same runs stored by another sweep (the same
    command, another folder) and copied in are no record here, each named in one line."""
    for name, raw in shard_files(twin).items():
        (s / store.STORE / name).write_bytes(raw)
    idx = store.index(s)
    assert sorted(idx.refused) == sorted(n for n in shard_files(twin) if n.endswith(HEAD))
    assert all("copied from another name or another sweep" in why for why in idx.refused.values())
    assert shards(s) == shards(reference) and idx.duplicates == {}


def test_a_run_two_shards_hold_is_one_run(reference, twin, s):
    """Two writers of one sweep raced (or a requeued job stored its runs again): every run is held by two valid
    shards and counts once, for the index, the layout, rw-status and the relaunch (which writes nothing)."""
    for sid in shards(twin):  # the twin's records, as two other writers of this sweep would have sealed them
        head, body = shard.encode(sid, *_columns(twin, sid), store.index(twin).heads[sid][1]["config_keys"],
                                  store.sweep_id(s))
        (s / store.STORE / (sid + HEAD)).write_bytes(head)
        (s / store.STORE / (sid + BODY)).write_bytes(body)
    theirs, ours = shards(twin), shards(reference)
    idx = store.index(s)
    assert idx.refused == {} and sorted(idx.runs) == RUNS
    holders = {run: sorted(sid for sid, runs in {**ours, **theirs}.items() if run in runs) for run in RUNS}
    assert {run: sorted(sids) for run, sids in idx.duplicates.items()} == holders
    assert all(len(h) == 2 for h in holders.values())
    assert sorted(layout.runs(s)) == RUNS and sorted(store.index(s).configs()) == RUNS
    assert all(contract.judge(s / n).done for n in RUNS)
    c = counts(status_here(str(s)).stdout, s)
    assert c["runs"] == 4 and c["done"] + c["skipped"] == 4
    files = sorted(os.listdir(s / store.STORE))
    r = relaunch(s)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == last_line(s, 0, 4), r.stdout
    assert sorted(os.listdir(s / store.STORE)) == files


# ------------------------------------------------------------------------------------------ bounded readers
@pytest.mark.timeout(HANG_S * 2)  # a FIFO read would block: the timeout fails the test
def test_nothing_at_a_shards_name_is_read_past_its_cap_followed_or_waited_on(reference, s, tmp_path):
    """Shard a's head a link to itself (moved outside), shard b's body a link to itself; at new shard names a
    FIFO, a device, a folder, a head one byte over its cap (sparse, never read), a folder at a body's name;
    a FIFO at a checkpoint's name: each refused in one line, nothing followed, nothing waited on; the
    relaunch retrains every run and leaves every planted thing as it was."""
    (a, _), (b, _) = parts(s)
    folder, outside = s / store.STORE, tmp_path / "outside"
    outside.mkdir()
    sub_body = "w000000000005-00000"  # a whole head of this user's, whose body is a folder
    (folder / (sub_body + HEAD)).write_bytes(_encoded_again(s, a, sub_body)[0])
    (folder / (sub_body + BODY)).mkdir()
    for name in (a + HEAD, b + BODY):
        os.replace(folder / name, outside / name)
        os.symlink(outside / name, folder / name)
    planted = {f"w00000000000{i}-00000{HEAD}" for i in range(1, 5)}
    fifo, device, sub, huge = sorted(planted)
    os.mkfifo(folder / fifo)
    if os.geteuid() == 0:
        os.mknod(folder / device, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless if read
    else:
        os.mkfifo(folder / device)
    (folder / sub).mkdir()
    with open(folder / huge, "wb") as fh:
        fh.truncate(shard.HEAD_CAP + 1)
    os.mkfifo(folder / ("w000000000006" + CKPT))
    # a checkpoint larger than this machine's free memory, sparse: it costs its planter no disk
    big = "w000000000007" + CKPT
    with open(folder / big, "wb") as fh:
        fh.truncate(min(CHECKPOINT_CAP + 1, (readers.memory_available() or CHECKPOINT_CAP) + 1))
    outside_bytes = {p.name: p.read_bytes() for p in outside.iterdir()}

    idx = store.index(s)
    assert set(idx.refused) == {a + HEAD, b + BODY, sub_body + BODY, *planted}, idx.refused
    assert all("\n" not in why for why in idx.refused.values())
    assert "symbolic link" in idx.refused[a + HEAD] and "cap" in idx.refused[huge]
    assert idx.runs == {} and not any(contract.judge(s / n).done for n in RUNS)
    c = counts(status_here(str(s)).stdout, s)
    assert c["done"] + c["skipped"] == 0

    r = relaunch(s)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == last_line(s, 4, 0), r.stdout
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("not a checkpoint: ") and big in ln]
    assert said and all("not read" in ln or "its cap" in ln for ln in said), said  # by its size: never read
    assert records(s) == records(reference)
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == outside_bytes  # not written through a link
    assert os.readlink(folder / (a + HEAD)) == str(outside / (a + HEAD))
    assert stat.S_ISFIFO(os.lstat(folder / fifo).st_mode) and (folder / sub).is_dir()
    assert stat.S_ISFIFO(os.lstat(folder / ("w000000000006" + CKPT)).st_mode)


# ------------------------------------------------------------------------------------------ kills, stops, full disks
def long_shape() -> list[str]:
    """Runs whose training takes a few seconds here: a signal finds a job mid-way, with more than the block
    of about a second after which the training loop answers it (`rw_sweeps.core.training`) still to go."""
    steps = max(80, -(-steps_lasting(2.5) // 40) * 40)
    return ["data.n_test=200", "wandb.mode=disabled", f"optim.steps={steps}", f"eval_every={steps // 4}"]


def steps_of(shape: list[str]) -> int:
    (steps,) = [int(a.split("=")[1]) for a in shape if a.startswith("optim.steps=")]
    return steps


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, list[str]]:
    """The long grid, uninterrupted: (its folder, its shape)."""
    shape = long_shape()
    d = tmp_path_factory.mktemp("whole") / "S"
    r = launch(*command(d, shape=shape), timeout=HANG_S * 2)
    assert r.returncode == 0, r.stderr
    assert sorted(records(d)) == RUNS
    return d, shape


def work_or_end(p: subprocess.Popen, seconds: float) -> None:
    """Wait until the process has used `seconds` more CPU time, or has ended (CPU time, not wall time: a
    loaded machine makes the wait longer, never the work less)."""
    start = cpu_seconds(p.pid)
    wait_until(lambda: p.poll() is not None or cpu_seconds(p.pid) - start >= seconds, HANG_S, "the launch to work")


def checkpoint_steps(sweep: Path) -> dict[str, int]:
    """{run: step} of every state in the store's checkpoint files (loaded as the launch loads them)."""
    import torch

    out = {}
    for name in in_store(sweep, CKPT):
        states = torch.load(sweep / store.STORE / name, map_location="cpu", weights_only=True)
        out.update({run: int(blob["state"]["step"]) for run, blob in states.items()})
    return out


@settings(max_examples=1, **SETTINGS)
@given(chunk=st.sampled_from([1, 2]), cpu_s=st.floats(0.0, 3.0))
@example(chunk=1, cpu_s=0.4)  # the first job checkpointed, nothing stored yet
@example(chunk=2, cpu_s=0.5)  # the first job's runs stored, the second's checkpointed
def test_a_sigkill_at_any_moment_loses_no_stored_run_and_the_relaunch_equals_the_uninterrupted_sweep(
        whole, tmp_path_factory, chunk, cpu_s):
    """The launch is killed (SIGKILL: nothing of ours runs) `cpu_s` CPU seconds after its `chunk`-th job
    starts training (or after its end). Every run stored by then is kept byte for byte and skipped; the
    others are trained (from their checkpoints where the job wrote one), to the uninterrupted records."""
    ref, shape = whole
    shape = [*shape, f"checkpoint_every={steps_of(shape) // 8}"]  # a state to resume from
    cut = tmp_path_factory.mktemp("killed") / "S"
    o = Output(start_launch(*command(cut, shape=shape)))
    for _ in range(chunk):
        o.wait_for(lambda ln: ln.startswith("training "), f"job {chunk} to train")
    work_or_end(o.p, cpu_s)
    if o.p.poll() is None:
        os.kill(o.p.pid, signal.SIGKILL)
    o.finish()
    stored = sorted(store.index(cut).runs)
    assert all(store.index(cut).runs[n][2] == "done" for n in stored)
    kept, states = shard_files(cut), checkpoint_steps(cut)

    r = relaunch(cut, shape=shape)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == last_line(cut, 4 - len(stored), len(stored)), r.stdout
    assert {n: b for n, b in shard_files(cut).items() if n in kept} == kept  # every stored file, unmodified
    for run, step in states.items():
        if run not in stored:
            assert f"resuming {cut / run} from its checkpoint at step {step}" in r.stdout, r.stdout
    assert records(cut) == records(ref)
    assert in_store(cut, CKPT) == []


def test_a_killed_flushs_stale_temp_file_in_the_store_is_removed_by_the_next_launch(s, monkeypatch):
    (sid, _), _ = parts(s)
    plant(s, "head cut", monkeypatch)  # runs to train: the relaunch takes the lock and writes
    stale = s / store.STORE / f".{sid[:13]}-00007{BODY}.0123456789abcdef.tmp"  # as `safefs.write_with` names it
    stale.write_bytes(b"PAR1 a body cut short")
    os.utime(stale, (1, 1))
    r = relaunch(s)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == last_line(s, 2, 2), r.stdout
    assert not stale.exists()


def test_sigterm_mid_training_resumes_from_the_jobs_one_checkpoint_file_to_the_uninterrupted_records(
        whole, tmp_path_factory):
    ref, shape = whole
    cut = tmp_path_factory.mktemp("stopped") / "S"
    every = steps_of(shape) // 8  # a periodic checkpoint: the first says the first job is mid-way
    o = Output(start_launch(*command(cut, f"checkpoint_every={every}", shape=shape)))
    wait_until(lambda: in_store(cut, CKPT) or o.p.poll() is not None, HANG_S, "the first job's first checkpoint")
    o.p.send_signal(signal.SIGTERM)
    code, out, err = o.finish()
    assert code == 143, err
    assert the_line(out, err).startswith("stopped by SIGTERM: finished runs are kept and the others checkpointed")
    (ckpt,) = in_store(cut, CKPT)  # the job's one file, every run of it inside
    assert re.fullmatch(r"w[0-9a-f]{12}\.ckpt\.pt", ckpt) and in_store(cut, HEAD) == []
    states = checkpoint_steps(cut)
    assert len(states) == 2 and all(0 < s < steps_of(shape) for s in states.values()), states

    r = relaunch(cut, shape=shape)
    assert r.returncode == 0, r.stderr[-3000:]
    for run, step in states.items():  # from the file, at the step it holds
        assert r.stdout.count(f"resuming {cut / run} from its checkpoint at step {step}\n") == 1, r.stdout
    assert r.stdout.strip().splitlines()[-1] == last_line(cut, 4, 0), r.stdout
    assert records(cut) == records(ref)
    assert in_store(cut, CKPT) == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root only; CI runs as root), unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk") as disk:
        yield disk


def _fill(disk: Path) -> Path:
    """Every free byte of the disk taken by one file (written until the disk says it is full)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == 28, exc
    return filler


def test_a_disk_full_during_a_flush_fails_its_runs_in_one_line_each_and_a_relaunch_on_free_space_finishes_them(
        whole, tiny_disk):
    """The disk fills while the second job trains: its flush fails; the first job's shard stays as written."""
    ref, shape = whole
    sweep = tiny_disk / "S"
    o = Output(start_launch(*command(sweep, shape=shape)))
    for _ in range(2):
        o.wait_for(lambda ln: ln.startswith("training "), "the second job to train")
    first = shards(sweep)
    filler = _fill(tiny_disk)
    code, out, err = o.finish()
    assert code == 1 and "Traceback" not in out + err, err
    (kept_runs,) = first.values()
    lost = [n for n in RUNS if n not in kept_runs]
    failed = [ln for ln in out.splitlines() if ln.startswith("failed: ")]
    assert len(failed) == 2 and all("writing the results" in ln and "No space left on device" in ln
                                    for ln in failed), out
    for n in lost:  # and one line each at the end
        assert len([ln for ln in err.splitlines() if ln.startswith(f"failed {sweep / n}: ")]) == 1, err
    assert out.strip().splitlines()[-1] == last_line(sweep, 2, 0, failed=2), out
    assert shards(sweep) == first and store.index(sweep).refused == {}  # nothing half-written is a record
    assert [n for n in RUNS if contract.judge(sweep / n).done] == kept_runs
    assert not [n for n in os.listdir(sweep / store.STORE) if n.endswith(".tmp")]
    kept = shard_files(sweep)

    filler.unlink()
    r = relaunch(sweep, shape=shape)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == last_line(sweep, 2, 2), r.stdout
    assert {n: b for n, b in shard_files(sweep).items() if n in kept} == kept
    assert records(sweep) == records(ref)
    assert in_store(sweep, CKPT) == []
