"""The sweep folder is a file-system boundary (the file-system edges a shared folder has).

A co-worker who can write a shared sweep folder swaps run folders for links while a launch writes; the
project works through the sweep folder's handle, folder by folder, so nothing lands outside it in any try.
A launch into a folder of someone else's files is refused in one line, and nothing there is touched.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rw_sweeps.core import safefs
from .conftest import ROOT, launch, start_launch

TINY = ["data.n_train=64", "data.n_test=64", "data.N=17", "model.M=20", "wandb.mode=disabled"]
_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE): the two names swap what they hold, atomically (the attacker's move)."""
    return _libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0


class Swapper(threading.Thread):
    """Swaps each of `names` (run folders) with a link to the victim's folder, back and forth, until stopped."""

    def __init__(self, sweep: Path, victim: Path, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.sweep, self.names, self.stop, self.swaps = sweep, names, threading.Event(), 0
        self.links = []
        for n in names:
            link = sweep.parent / f"link-{sweep.name}-{n}"
            os.symlink(victim, link)
            self.links.append(link)

    def run(self) -> None:
        while not self.stop.is_set():
            for n, link in zip(self.names, self.links):
                if exchange(self.sweep / n, link):
                    self.swaps += 1

    def put_back(self) -> None:
        self.stop.set()
        self.join()
        for n, link in zip(self.names, self.links):
            if os.path.islink(self.sweep / n):  # left swapped: put the real folder back where it belongs
                exchange(self.sweep / n, link)


def everything_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.e2e  # it launches
def test_run_folders_swapped_for_links_while_launches_write_land_nothing_outside(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("the victim's own file")
    for attempt in range(2):
        sweep = tmp_path / f"tc{attempt}"
        first = launch("-m", *TINY, "data.p=0,0.5", "optim.steps=300", f"hydra.sweep.dir={sweep}")
        assert first.returncode == 0, first.stderr
        for n in "01":  # unfinished again: the relaunch under attack writes every file of both runs
            (sweep / n / "summary.json").unlink()
        swapper = Swapper(sweep, victim, ["0", "1"])
        swapper.start()
        try:
            p = start_launch("-m", *TINY, "data.p=0,0.5", "optim.steps=300", f"hydra.sweep.dir={sweep}")
            out, err = p.communicate(timeout=600)
            an = subprocess.run([sys.executable, "-m", "analysis", str(sweep)], cwd=ROOT, capture_output=True,
                                text=True, timeout=600)
        finally:
            swapper.put_back()
        assert swapper.swaps > 0
        said = [ln for ln in out.splitlines() if ln.startswith(("done:", "failed:", "skipped"))]
        assert len(said) == 2, out  # both runs were written (or failed on a link) under attack, not refused
        assert everything_in(victim) == ["mine.txt"], (attempt, out, err)  # nothing landed outside, in any try
        assert "Traceback" not in err + out and "Traceback" not in an.stderr, (err, an.stderr)
        for n in "01":  # the runs the attack made fail are trained on a quiet relaunch; every file is ours
            assert not (sweep / n).is_symlink()
    again = launch("-m", *TINY, "data.p=0,0.5", "optim.steps=300", f"hydra.sweep.dir={sweep}")
    assert again.returncode == 0, again.stderr
    assert all((sweep / n / "summary.json").is_file() for n in "01")


@pytest.mark.e2e  # it launches
def test_run_folders_swapped_for_links_while_the_adaptive_sweeper_writes_land_nothing_outside(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    sweep = tmp_path / "ad"
    args = ["-m", "hydra/sweeper=adaptive", *TINY, "optim.steps=300", "optim.lr=tag(log,interval(0.01,0.3))",
            "hydra.sweeper.n_points=6", "hydra.sweeper.batch=2", f"hydra.sweep.dir={sweep}"]
    swapper = Swapper(sweep, victim, ["0", "1", "2", "3"])  # the first round's folders, and the next's
    swapper.start()
    try:
        p = start_launch(*args)
        out, err = p.communicate(timeout=600)
    finally:
        swapper.put_back()
    assert swapper.swaps > 0
    assert everything_in(victim) == [], (out, err)  # nothing landed outside
    assert "Traceback" not in err + out, err
    again = launch(*args)  # quiet: the runs the attack failed train, in the sweep's own folders
    assert again.returncode == 0, again.stderr
    assert everything_in(victim) == []


@pytest.mark.e2e  # it launches
def test_a_launch_into_a_folder_of_someone_elses_files_is_one_line_and_touches_nothing(tmp_path):
    home = tmp_path / "project"
    (home / "0").mkdir(parents=True)
    (home / "0" / "data.csv").write_text("x,y\n1,2\n")
    (home / "a" / "b").mkdir(parents=True)
    planted = home / "a" / "b" / ".notes.txt.0123456789abcdef.tmp"  # named like our temp files, two hours old
    planted.write_text("keep me")
    os.utime(planted, (1, 1))
    (home / "multirun.yaml").write_text("mine: true\n")
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    r = launch("-m", *TINY, "data.p=0,0.5", "optim.steps=5", f"hydra.sweep.dir={home}")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "the folder holds files this project did not make" in lines[0], r.stderr
    assert "0/" in lines[0] and "a/" in lines[0]
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before  # nothing written, nothing removed
    assert not (home / ".rw_lock").exists() and not (home / ".rw_sweep.json").exists()


@pytest.mark.e2e  # it launches
def test_an_empty_folder_and_a_sweep_of_ours_are_launched_into(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = launch("-m", *TINY, "data.p=0.5", "optim.steps=5", f"hydra.sweep.dir={empty}")
    assert r.returncode == 0, r.stderr
    again = launch("-m", *TINY, "data.p=0,0.5", "optim.steps=5", f"hydra.sweep.dir={empty}")  # ours now: it grows
    assert again.returncode == 0, again.stderr
    assert sorted(p.parent.name for p in empty.glob("*/summary.json")) == ["0", "1"]


# ------------------------------------------------------------------------------------------ the handle itself
def test_writes_below_a_held_folder_refuse_a_link_at_any_depth(tmp_path):
    root, victim = tmp_path / "sweep", tmp_path / "victim"
    (root / "3" / ".hydra").mkdir(parents=True)
    victim.mkdir()
    safefs.hold(root)
    try:
        safefs.atomic_write(root / "3" / ".hydra" / "config.yaml", "a: 1\n")
        assert (root / "3" / ".hydra" / "config.yaml").read_text() == "a: 1\n"
        os.rename(root / "3", tmp_path / "aside")
        os.symlink(victim, root / "3")  # a run folder that is now a link: refused, at whatever depth is written
        for target in (root / "3" / "summary.json", root / "3" / ".hydra" / "config.yaml"):
            with pytest.raises(safefs.PlantedLink, match="3 is a symbolic link"):
                safefs.atomic_write(target, "x")
        with pytest.raises(safefs.PlantedLink):
            safefs.append_text(root / "3" / "rw.log", "line\n")
        with pytest.raises(safefs.PlantedLink):
            safefs.ensure_dir(root / "3" / "wandb")
        assert list(victim.iterdir()) == []
        safefs.atomic_write(root / "4" / "new" / "f", "made through the handle")  # folders made as it goes
        assert (root / "4" / "new" / "f").read_text() == "made through the handle"
    finally:
        safefs.release(root)


def test_a_held_folder_moved_is_still_the_sweep_and_one_removed_is_written_no_more(tmp_path):
    root, outside = tmp_path / "sweep", tmp_path / "outside"
    outside.mkdir()
    safefs.hold(root)
    try:
        os.rename(root, tmp_path / "moved")  # moved away (by whoever can write its parent): the held folder is
        os.symlink(outside, root)             # the sweep, wherever it is now; nothing goes by its old name
        safefs.atomic_write(root / "g", "held")
        safefs.hold(root, anew=False)  # a job of the launch holds it again: still the folder held
        safefs.atomic_write(root / "1" / "h", "held")
        assert (tmp_path / "moved" / "g").read_text() == "held" and (tmp_path / "moved" / "1" / "h").is_file()
        assert list(outside.iterdir()) == []
        import shutil
        shutil.rmtree(tmp_path / "moved")  # removed: its name now leads elsewhere, so nothing is written by it
        for write in (lambda: safefs.atomic_write(root / "f", "x"), lambda: safefs.hold(root, anew=False)):
            with pytest.raises(safefs.SweepGone, match="was removed while this process wrote it"):
                write()
        assert list(outside.iterdir()) == []
        os.unlink(root)
        root.mkdir()
        safefs.hold(root)  # a new launch takes the folder now at the name
        safefs.atomic_write(root / "h", "here")
        assert (root / "h").read_text() == "here"
    finally:
        safefs.release(root)


def test_a_path_through_dot_dot_is_the_folder_the_kernel_finds(tmp_path):
    (tmp_path / "deep" / "inner").mkdir(parents=True)
    os.symlink(tmp_path / "deep" / "inner", tmp_path / "Lq")
    given = tmp_path / "Lq" / ".." / "s"  # the kernel: deep/s; the text: s
    safefs.hold(given)
    try:
        safefs.atomic_write(given / "0" / "f", "x")
        assert (tmp_path / "deep" / "s" / "0" / "f").is_file() and not (tmp_path / "s").exists()
        with pytest.raises(safefs.PlantedLink, match="leaves it through"):
            safefs.atomic_write(given / "0" / ".." / ".." / "escape", "x")
    finally:
        safefs.release(given)


@pytest.mark.e2e  # it launches
def test_a_sweep_folder_that_is_a_link_is_one_line(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "sl")
    r = launch("-m", *TINY, "data.p=0.5", "optim.steps=5", f"hydra.sweep.dir={tmp_path / 'sl'}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (f"error: invalid config: hydra.sweep.dir='{tmp_path / 'sl'}': is a symbolic link (to "
                                f"{tmp_path / 'real'}); a sweep is written only into a real folder: give that folder "
                                f"instead")
    assert list((tmp_path / "real").iterdir()) == []


def test_no_module_but_safefs_writes_a_sweep_file_by_path():
    """One owner: the project's sweep-side writers go through safefs (open for writing, rename, unlink,
    mkdir by path are safefs's alone)."""
    import re
    # and a library's writer given a path (a figure, a table): only a handle `fh` from `safefs.write_with`, or none
    forbidden = re.compile(r"os\.(replace|rename|unlink|mkdir|makedirs)\(|\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wa]"
                           r"|\.(savefig|to_parquet|to_csv|to_json|to_html|to_feather)\((?!fh[,)]|\)|index=)")
    allowed = {"rw_sweeps/core/safefs.py", "rw_sweeps/core/fused.py", "rw_sweeps/core/seal.py",  # outside any sweep
               "rw_sweeps/sweeps/lock.py",  # the lock's own atomic link at the sweep folder's top
               "rw_sweeps/sweeps/predict.py"}  # a report folder of the user's
    offenders = []
    for base in ("rw_sweeps", "analysis", "hydra_plugins"):
        for path in (ROOT / base).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in allowed:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if forbidden.search(line.split("#")[0]):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


@pytest.mark.e2e  # it launches
def test_a_copy_of_a_finished_run_folder_is_counted_once_with_one_line(tmp_path):
    import shutil
    sweep = tmp_path / "S"
    r = launch("-m", *TINY, "data.p=0,0.5", "optim.steps=5", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr
    shutil.copytree(sweep / "0", sweep / "X", symlinks=True)  # a backup: cp -a 0 X
    an = subprocess.run([sys.executable, "-m", "analysis", str(sweep), "--out", str(tmp_path / "rep")], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
    assert an.returncode == 0, an.stderr
    assert "runs 2, done 2," in an.stdout and "copies 1" in an.stdout, an.stdout
    said = [ln for ln in an.stderr.splitlines() if ": a copy of" in ln]
    assert len(said) == 1 and said[0].startswith(f"note: {sweep / 'X'}: a copy of 0 "), an.stderr
    from analysis import load_runs
    runs = load_runs(sweep)
    assert sorted(runs["run"]) == ["0", "1"] and [s["status"] for s in runs.attrs["skipped"]] == ["copy"]
    st = subprocess.run([sys.executable, "-m", "rw_sweeps.sweeps.status", str(sweep)], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
    assert st.returncode == 0, st.stderr
    assert st.stdout.startswith(f"sweep {sweep}: 2 runs: 2 done, 0 skipped,") and "1 copy not counted" in st.stdout
    assert st.stderr.strip() == f"note: {sweep / 'X'}: a copy of 0 (the same run_id {runs['run_id'][0]}); counted once"
