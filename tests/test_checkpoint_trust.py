"""A resumed checkpoint is the run's own (README, "Faults"): sealed under the user's key over its config's
identity, its folder's run_id and every value it holds. A checkpoint that is edited, copied from another
folder, sealed by another key, unsealed, of another config, or not a regular file is refused in one line on
stdout naming the folder and why, and the run starts over and ends as if it had never been there. A run
resumes once, and says so once, however its batch is split."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from rw_sweeps.core import results, training
from rw_sweeps.core.config import RunConfig, data_config, validate
from rw_sweeps.core.models import ModelConfig
from rw_sweeps.core.optimisers.gd import Gd
from rw_sweeps.sweeps import run

from .conftest import launch

SMALL = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled"]


class Stop(BaseException):
    """A kill right after a checkpoint (not an Exception: the batch does not catch it)."""


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """Every test seals with a key of its own (created on first use), never the user's."""
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "keys" / "seal.key"))


def cfg(lr: float = 1.0, seed: int = 3) -> RunConfig:
    return validate(RunConfig(data=data_config(K=5, N=21, p=0.7, n_train=60, n_test=40), model=ModelConfig(M=64),
                              optim=Gd(lr=lr, steps=12), eval_every=4, checkpoint_every=2,
                              snapshot_steps=[0, 4, 8], seed=seed,
                              wandb=dataclasses.replace(RunConfig().wandb, mode="disabled")))


def interrupted(monkeypatch, c: RunConfig, d: Path, at: int) -> None:
    """Train c in d and stop it right after its checkpoint at step `at`: d holds that checkpoint."""
    save = results.save_checkpoint

    def save_then_stop(run_dir, blob):
        save(run_dir, blob)
        if blob["state"]["step"] == at:
            raise Stop

    monkeypatch.setattr(results, "save_checkpoint", save_then_stop)
    with pytest.raises(Stop):
        run.execute([c], [d], progress=False)
    monkeypatch.setattr(results, "save_checkpoint", save)
    assert not (d / results.SUMMARY).exists() and raw(d)["state"]["step"] == at


def raw(d: Path) -> dict:
    return torch.load(d / results.CHECKPOINT, weights_only=True)


def same_results(a: Path, b: Path) -> None:
    """Folder b holds exactly folder a's run: the same history, snapshots and summary (but its wall time and id)."""
    for name in ("history.jsonl", "snapshots.jsonl", "config.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = results.read_summary(a), results.read_summary(b)
    assert sa["status"] == sb["status"] == "done" and sa["steps"] == sb["steps"] == 12
    for k in set(sa) - {"wall_s", "run_id"}:
        assert sa[k] == sb[k], k
    assert not (b / results.CHECKPOINT).exists()


def checkpoint_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "checkpoint" in line]


@pytest.fixture
def whole(tmp_path) -> Path:
    """The uninterrupted run of cfg() every resumed or restarted run must equal."""
    d = tmp_path / "whole"
    run.execute([cfg()], [d], progress=False)
    return d


# ------------------------------------------------------------------------------ edited: refused, trained afresh
def _edit_config(blob):  # a run of lr 0.5 whose stored config is edited to read as this run's (lr 1)
    blob["config"] = cfg().to_dict()


def _edit_tensor(blob):
    name = next(iter(blob["state"]["params"]))
    blob["state"]["params"][name] = blob["state"]["params"][name] + 1e-12


def _edit_history(blob):
    blob["history"][-1]["test_acc"] = 1.0


def _edit_step(blob):
    blob["state"]["step"] = 2


def _drop_seal(blob):
    del blob["seal"]


def _forge_seal(blob):  # a seal made without the key: the unkeyed hash anyone can compute
    import hashlib

    blob["seal"] = hashlib.sha256(results.digest({k: v for k, v in blob.items() if k != "seal"})).hexdigest()


@pytest.mark.parametrize("edit,source_lr,why", [
    (_edit_config, 0.5, "its seal does not verify: edited, or written for another folder or by another user"),
    (_edit_tensor, 1.0, "its seal does not verify: edited, or written for another folder or by another user"),
    (_edit_history, 1.0, "its seal does not verify: edited, or written for another folder or by another user"),
    (_edit_step, 1.0, "its seal does not verify: edited, or written for another folder or by another user"),
    (_forge_seal, 1.0, "its seal does not verify: edited, or written for another folder or by another user"),
    (_drop_seal, 1.0, "it has no seal"),
], ids=["config", "tensor", "history", "step", "unkeyed-seal", "no-seal"])
def test_an_edited_checkpoint_is_refused_in_one_line_and_the_run_starts_over(tmp_path, monkeypatch, capsys, whole,
                                                                             edit, source_lr, why):
    d = tmp_path / "run"
    interrupted(monkeypatch, cfg(lr=source_lr), d, at=6)
    blob = raw(d)
    edit(blob)
    torch.save(blob, d / results.CHECKPOINT)
    capsys.readouterr()
    assert results.load_checkpoint(cfg().to_dict(), d, say=None) is None
    run.execute([cfg()], [d], progress=False)
    assert checkpoint_lines(capsys.readouterr().out) == [f"{d}: its checkpoint is not this run's ({why}); starting over"]
    same_results(whole, d)


def test_a_checkpoint_copied_from_another_folder_is_refused_though_its_config_is_this_runs(tmp_path, monkeypatch,
                                                                                            capsys, whole):
    there, here = tmp_path / "there", tmp_path / "here"
    interrupted(monkeypatch, cfg(), there, at=8)
    here.mkdir()
    shutil.copy(there / results.CHECKPOINT, here / results.CHECKPOINT)
    assert results.same_run(raw(here)["config"], cfg().to_dict())  # the config alone would have let it in
    capsys.readouterr()
    run.execute([cfg()], [here], progress=False)
    assert checkpoint_lines(capsys.readouterr().out) == [
        f"{here}: its checkpoint is not this run's (its seal does not verify: edited, or written for another "
        "folder or by another user); starting over"]
    same_results(whole, here)
    assert results.load_checkpoint(cfg().to_dict(), there, say=None)["state"]["step"] == 8  # in its own folder, it is


def test_a_checkpoint_sealed_with_another_users_key_is_refused(tmp_path, monkeypatch, capsys, whole):
    d = tmp_path / "run"
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "theirs" / "seal.key"))
    interrupted(monkeypatch, cfg(), d, at=4)
    monkeypatch.setenv("RW_SWEEPS_SEAL_KEY", str(tmp_path / "mine" / "seal.key"))
    capsys.readouterr()
    run.execute([cfg()], [d], progress=False)
    assert checkpoint_lines(capsys.readouterr().out) == [
        f"{d}: its checkpoint is not this run's (its seal does not verify: edited, or written for another folder "
        "or by another user); starting over"]
    same_results(whole, d)


def test_a_sealed_checkpoint_of_another_config_is_refused_naming_the_keys(tmp_path, monkeypatch, capsys, whole):
    d = tmp_path / "run"
    interrupted(monkeypatch, cfg(lr=0.5, seed=4), d, at=6)
    capsys.readouterr()
    run.execute([cfg()], [d], progress=False)
    assert checkpoint_lines(capsys.readouterr().out) == [
        f"{d}: its checkpoint is not this run's (a run of another config: seed, optim.lr differ); starting over"]
    same_results(whole, d)


@pytest.mark.parametrize("kind,why", [
    ("fifo", "checkpoint.pt is not a regular file (a FIFO); it is not read"),
    ("link", "checkpoint.pt is a symbolic link; it is not followed"),
    ("folder", "checkpoint.pt is not a regular file (a folder); it is not read"),
    ("torn", "it does not load as tensors and plain data: "),  # then torch's error type, which its version picks
    ("pickle", "it does not load as tensors and plain data: UnpicklingError"),
    ("list", "not a checkpoint: no config"),
])
def test_what_is_no_checkpoint_is_refused_in_one_line_never_read_or_run(tmp_path, monkeypatch, capsys, whole, kind, why):
    d = tmp_path / "run"
    d.mkdir()
    path, marker = d / results.CHECKPOINT, tmp_path / "ran"
    if kind == "fifo":
        os.mkfifo(path)  # opening it to read would wait for a writer forever
    elif kind == "link":
        interrupted(monkeypatch, cfg(), tmp_path / "real", at=6)
        path.symlink_to(tmp_path / "real" / results.CHECKPOINT)  # even to a checkpoint of this very run
    elif kind == "folder":
        path.mkdir()
    elif kind == "torn":
        interrupted(monkeypatch, cfg(), tmp_path / "real", at=6)
        path.write_bytes((tmp_path / "real" / results.CHECKPOINT).read_bytes()[:-100])
    elif kind == "pickle":
        import pickle

        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))
        path.write_bytes(pickle.dumps({"config": Payload()}))
    else:
        torch.save([1, 2, 3], path)
    capsys.readouterr()
    if kind == "folder":  # a folder at the checkpoint's name is refused, and then the run's writer stops at it
        assert results.load_checkpoint(cfg().to_dict(), d) is None
        assert checkpoint_lines(capsys.readouterr().out) == [
            f"{d}: its checkpoint is not this run's ({why}); starting over"]
        return
    run.execute([cfg()], [d], progress=False)
    lines = checkpoint_lines(capsys.readouterr().out)
    if kind == "torn":
        assert len(lines) == 1 and lines[0].startswith(f"{d}: its checkpoint is not this run's ({why}")
        assert lines[0].endswith("); starting over") and "\n" not in lines[0]
    else:
        assert lines == [f"{d}: its checkpoint is not this run's ({why}); starting over"]
    assert not marker.exists()
    same_results(whole, d)


# ------------------------------------------------------------------------------ its own: resumed, exactly, once
def test_a_runs_own_checkpoint_resumes_bit_for_bit_and_says_so_once(tmp_path, monkeypatch, capsys, whole):
    d = tmp_path / "run"
    interrupted(monkeypatch, cfg(), d, at=6)
    blob = raw(d)
    assert isinstance(blob["seal"], str) and len(blob["seal"]) == 64
    loaded = results.load_checkpoint(cfg().to_dict(), d, say=None)
    assert "seal" not in loaded and loaded["state"]["step"] == 6 and len(loaded["history"]) == 2  # steps 0, 4
    # keys that change no result (how often it is saved, where it is logged) still resume it
    other = dataclasses.replace(cfg(), checkpoint_every=3, objective="test_acc")
    assert results.load_checkpoint(other.to_dict(), d, say=None)["state"]["step"] == 6
    capsys.readouterr()
    run.execute([cfg()], [d], progress=False)
    assert checkpoint_lines(capsys.readouterr().out) == [f"resuming {d} from its checkpoint at step 6"]
    same_results(whole, d)


def test_runs_checkpointed_at_different_steps_resume_in_one_call_and_each_says_so_once(tmp_path, monkeypatch, capsys):
    """The second `resuming` came from the split: runs at different steps were trained as separate batches,
    each of which read every checkpoint again and said so again."""
    cs = [cfg(seed=0), cfg(seed=1), cfg(seed=2)]
    wholes = [tmp_path / f"w{i}" for i in range(3)]
    run.execute(cs, wholes, progress=False)
    ds = [tmp_path / f"r{i}" for i in range(3)]
    for c, d, at in zip(cs[:2], ds, (4, 6)):
        interrupted(monkeypatch, c, d, at)
    capsys.readouterr()
    got = run.execute(cs, ds, progress=False)
    assert [s["status"] for s in got] == ["done"] * 3
    assert checkpoint_lines(capsys.readouterr().out) == [f"resuming {ds[0]} from its checkpoint at step 4",
                                                         f"resuming {ds[1]} from its checkpoint at step 6"]
    for w, d in zip(wholes, ds):
        same_results(w, d)


def test_a_batch_retried_run_by_run_says_resuming_once_per_run(tmp_path, monkeypatch, capsys):
    """A batch that raises is retried run by run, each from the checkpoint on disk: read again, not said again."""
    cs = [cfg(seed=0), cfg(seed=1)]
    wholes = [tmp_path / "w0", tmp_path / "w1"]
    run.execute(cs, wholes, progress=False)
    ds = [tmp_path / "r0", tmp_path / "r1"]
    for c, d in zip(cs, ds):
        interrupted(monkeypatch, c, d, at=6)
    train = training.train

    def no_batches(cfgs, *args, **kwargs):
        if len(cfgs) > 1:
            raise RuntimeError("a batch that fails")
        return train(cfgs, *args, **kwargs)

    monkeypatch.setattr(training, "train", no_batches)
    capsys.readouterr()
    got = run.execute(cs, ds, progress=False)
    assert [s["status"] for s in got] == ["done", "done"]
    assert checkpoint_lines(capsys.readouterr().out) == [f"resuming {d} from its checkpoint at step 6" for d in ds]
    for w, d in zip(wholes, ds):
        same_results(w, d)


@pytest.mark.e2e
def test_a_real_launch_says_on_stdout_why_a_planted_checkpoint_is_refused(tmp_path):
    sweep = tmp_path / "S"
    (sweep / "0").mkdir(parents=True)
    torch.save({"config": {"seed": 0}, "state": {"step": 3}}, sweep / "0" / results.CHECKPOINT)
    r = launch("-m", *SMALL, "seed=0", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
               env={"RW_SWEEPS_SEAL_KEY": str(tmp_path / "seal.key")})
    assert r.returncode == 0, r.stderr
    assert checkpoint_lines(r.stdout) == [f"{sweep / '0'}: its checkpoint is not this run's (it has no seal); starting over"]
    assert "checkpoint" not in r.stderr
    s = json.loads((sweep / "0" / "summary.json").read_text())
    assert s["status"] == "done" and s["steps"] == 5


# ------------------------------------------------------------------------------ the digest the seal is over
def test_the_digest_is_canonical_and_tells_apart_what_differs():
    d = results.digest
    a = {"x": [1.0, 2.0], "t": torch.arange(6, dtype=torch.float64).reshape(2, 3), "n": None, "s": "v", "i": 7}
    assert d(a) == d(dict(reversed(list(a.items()))))  # the order a mapping was built in does not count
    assert d(a) == d({**a, "t": a["t"].clone()}) and len(d(a)) == 32
    differ = [
        {**a, "x": [1.0, 2.0000000000000004]},                                    # one ulp
        {**a, "x": [1.0, 2]},                                                     # 2.0 and 2
        {**a, "t": a["t"].reshape(3, 2)},                                         # same bytes, another shape
        {**a, "t": a["t"].to(torch.float32)},                                     # another dtype
        {**a, "t": a["t"].to(torch.int64)},
        {**a, "n": 0}, {**a, "n": False}, {**a, "s": "w"}, {**a, "i": 8}, {**a, "i": "7"},
        {**a, "x": [[1.0], [2.0]]}, {**a, "extra": None},
    ]
    digests = {d(x) for x in differ}
    assert len(digests) == len(differ) and d(a) not in digests
    assert d(0.0) != d(-0.0) and d(math.nan) == d(math.nan) and d(True) != d(1)
    with pytest.raises(TypeError):
        d({"f": object()})
