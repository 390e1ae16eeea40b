"""The one way this project writes into a sweep folder, which strangers may share.

A path checked and then used by name is a race: a co-worker who can write the sweep folder may swap a run
folder for a link between the check and the write. So this module does its file-system work through
folder *handles*. A sweep folder is opened once (`hold`: O_DIRECTORY|O_NOFOLLOW) by each process that
writes or reads it; every path below it is then reached from that handle one folder at a time
(`openat(…, O_DIRECTORY|O_NOFOLLOW)`, made with `mkdirat` where missing), so a link anywhere below the
sweep folder is refused (`PlantedLink`) at the moment it is met, never followed. A path under no held
folder is reached from its own parent folder, opened the same way (a link at its last folder is refused).

Every file is written to a fresh, unpredictable temporary name created with O_CREAT|O_EXCL|O_NOFOLLOW in
its folder's handle and renamed over its target with `os.replace(…, src_dir_fd=, dst_dir_fd=)` (a rename
replaces a planted link itself, never what it points to); readers so see the old file or the new one, never
half of one. Logs are appended through O_NOFOLLOW in their folder's handle. Files get the permissions the
umask allows, as `open` would give them (group-readable on a shared file system). A write killed outright
(SIGKILL, a second signal) leaves its temp file; `remove_stale_temps` removes those, only in the folders
the sweep's record names, when the next launch holds its lock.

Why a process-wide table of held folders rather than a handle passed down every call: every writer of the
project (results, Hydra's per-job files, logs, the lock, the record, the analysis cache and report) asks
for a path, and one table makes each of them go through the handle without a second way to write.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import re
import secrets
import stat
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

_NOFOLLOW, _CLOEXEC = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW | _CLOEXEC
_READ = os.O_RDONLY | _NOFOLLOW | _CLOEXEC
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{16}\.tmp", re.DOTALL)  # `write_with`'s temp names, and only those
STALE_TEMP_S = 10.0  # a temp file untouched this long has no writer left (a live write keeps it fresh)


class PlantedLink(OSError):
    """A folder the project writes into is a symbolic link: followed, it would send files elsewhere."""


def _link_error(path) -> PlantedLink:
    return PlantedLink(f"{path} is a symbolic link; refusing to write through it")


# ------------------------------------------------------------------------------------------ held folders
_held: dict[str, int] = {}  # absolute sweep folder (as given, not resolved) → its handle
_held_lock = threading.Lock()


class SweepGone(OSError):
    """The folder this process held was removed while it wrote there: nothing more is written by its name,
    which may now be a link or someone else's folder."""


def _absolute(path) -> str:
    """`path` made absolute without resolving anything: `.` and repeated separators go, `..` stays (collapsing
    `link/..` by its text would name another folder than the kernel finds)."""
    p = os.fspath(path)
    if not os.path.isabs(p):
        p = os.path.join(os.getcwd(), p)
    return os.sep + os.sep.join(part for part in p.split(os.sep) if part not in ("", "."))


def hold(root, create: bool = True, anew: bool = True) -> None:
    """Open the folder `root` (made if missing and `create`) once for this process: every later path below it
    is reached from this handle, folder by folder, never through a link. `anew` (a launch taking the folder):
    a held folder that is no longer the one at that name is let go and the folder there now is held. Else (a
    job of a launch): the folder held stays the sweep wherever it is, and one removed is `SweepGone`."""
    key = _absolute(root)
    with _held_lock:
        fd = _held.get(key)
        if fd is not None:
            if not anew:
                _alive(fd, key)
                return
            try:
                now, held = os.stat(key, follow_symlinks=False), os.fstat(fd)
                if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                    return
            except OSError:
                pass
            del _held[key]
            os.close(fd)
        if create:
            _mkdirs(key)
        _held[key] = _open_dir_at(None, key, key)


def release(root) -> None:
    """Stop holding `root` (its handle closed); a path below it is then reached from its own parent."""
    with _held_lock:
        fd = _held.pop(_absolute(root), None)
    if fd is not None:
        os.close(fd)


def _anchor(path: str) -> tuple[int | None, str, list[str]]:
    """The held folder `path` is under (its handle, its path) and the names leading from it to `path`; (None,
    "", []) when no held folder holds it, or the held one was removed (a handle of a removed folder would
    write where no one can read)."""
    best, held = None, dict(_held)  # a copy: another thread may hold a folder meanwhile
    for root in held:
        if (path == root or path.startswith(root.rstrip(os.sep) + os.sep)) and (best is None or len(root) > len(best)):
            best = root
    if best is None:
        return None, "", []
    fd = held[best]
    _alive(fd, best)
    return fd, best, [part for part in path[len(best):].split(os.sep) if part]


def _alive(fd: int, shown: str) -> None:
    """SweepGone if the held folder was removed: its name may now lead anywhere, so nothing goes by it."""
    try:
        removed = os.fstat(fd).st_nlink == 0
    except OSError:
        removed = True
    if removed:
        raise SweepGone(f"the sweep folder {shown} was removed while this process wrote it; nothing more is "
                        f"written there")


def _open_dir_at(dir_fd: int | None, name: str, shown) -> int:
    """A handle of the folder `name` (relative to `dir_fd`, or a path), never through a link."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW|O_DIRECTORY at a link says ENOTDIR on Linux
            try:
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    raise _link_error(shown) from None
            except FileNotFoundError:
                pass
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(shown)) from None
        raise


def _mkdirs(path: str) -> None:
    """`mkdir -p` of a path under no held folder, refusing a link at its last name (as `ensure_dir` did)."""
    if os.path.islink(path):
        raise _link_error(path)
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:  # a file at the folder's place
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path) from None


def open_dir(path, create: bool = False) -> int:
    """A new handle of the folder `path` (the caller closes it): from the held folder above it, one name at a
    time, each made if missing when `create`; else from the folder's own path. A link on the way is
    `PlantedLink`, a file `NotADirectoryError`, a missing folder `FileNotFoundError`."""
    path = _absolute(path)
    fd, root, parts = _anchor(path)
    if fd is None:
        if create:
            _mkdirs(path)
        return _open_dir_at(None, path, path)
    if ".." in parts:  # a name below the sweep that climbs out of it is never followed
        raise PlantedLink(f"{path}: a path below {root} that leaves it through '..'; refusing to write there")
    cur, shown = os.dup(fd), root
    try:
        for part in parts:
            shown = os.path.join(shown, part)
            try:
                nxt = _open_dir_at(cur, part, shown)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown) from None
                try:
                    os.mkdir(part, 0o777, dir_fd=cur)
                except FileExistsError:
                    pass  # made meanwhile (another writer), or a link planted there: the open below decides
                nxt = _open_dir_at(cur, part, shown)
            os.close(cur)
            cur = nxt
    except BaseException:
        os.close(cur)
        raise
    return cur


class _InDir:
    """`with _InDir(path, create) as (dir_fd, name):` the handle of a file's folder, and the file's name."""

    def __init__(self, path, create: bool) -> None:
        self.path, self.create = _absolute(path), create

    def __enter__(self) -> tuple[int, str]:
        parent, name = os.path.split(self.path)
        self.fd = open_dir(parent, self.create)
        return self.fd, name

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


# ------------------------------------------------------------------------------------------ folders
def ensure_dir(path: Path) -> Path:
    """The folder, created if missing (with its parents); a link on its way is refused, not followed."""
    os.close(open_dir(path, create=True))
    return Path(path)


def owned_dirs(root: Path, *parts: str) -> Path:
    """`root/parts…`, each folder on the way created if missing and refused if it is a link (`ensure_dir`):
    for folders another library writes into by path (wandb's `dir`, its data folder, the sweep's report),
    which it would follow."""
    path = ensure_dir(Path(root))
    for part in parts:
        path = ensure_dir(path / part)
    return path


def refuse_links(run_dir: Path, hydra_subdir: str | None = ".hydra") -> None:
    """Raise PlantedLink if a run folder, its Hydra folder or a file in either is a symbolic link: for code
    that writes there with plain `open` (Hydra's own `run_job`), which would follow it."""
    run_dir = Path(run_dir)
    folders = [run_dir] + ([run_dir / hydra_subdir] if hydra_subdir else [])
    for folder in folders:
        if folder.is_symlink():
            raise _link_error(folder)
        if folder.is_dir():
            for entry in os.scandir(folder):
                if entry.is_symlink():
                    raise _link_error(entry.path)


def remove_stale_temps(root: Path, folders: Iterable[str] = (), older_than_s: float = STALE_TEMP_S) -> int:
    """Remove the temp files that killed writes left in the sweep folder `root` (whose lock the caller holds,
    so no other launch writes there) and in the run folders its record names (`folders`, relative to `root`)
    and their `.hydra/`: never by walking a tree, never below a link. Only names `write_with` makes
    (`.<name>.<16 hex digits>.tmp`), only regular files and links (a link itself, never what it points to),
    only those unmodified for `older_than_s` seconds (a write still going keeps its file fresh). Returns how
    many were removed; a folder or file that cannot be looked at or removed is left as it is."""
    now, removed = time.time(), 0
    seen: set[str] = set()
    for rel in [""] + [f for name in folders for f in (name, f"{name}/.hydra")]:
        if rel in seen:
            continue
        seen.add(rel)
        try:
            fd = open_dir(os.path.join(os.fspath(root), rel) if rel else root)
        except (OSError, ValueError):
            continue
        try:
            for name in os.listdir(fd):
                if not (name.endswith(".tmp") and TEMP_NAME.fullmatch(name)):
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and now - st.st_mtime >= older_than_s:
                        os.unlink(name, dir_fd=fd)
                        removed += 1
                except OSError:
                    continue
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


# ------------------------------------------------------------------------------------------ files
def write_with(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """`write(fh)` into a fresh temp file in `path`'s folder (made if missing), then renamed into place, both
    through the folder's handle (the one writer)."""
    _placed(path, write, lambda tmp, name, dfd: os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd))


def _placed(path: Path, write: Callable, place: Callable) -> bool:
    """`write(fh)` into a fresh temp file in `path`'s folder, then `place(tmp, name, dir_fd)` puts it at its
    name (a rename, or a link); the temp file never outlives the call. What `place` returns (None: True)."""
    with _InDir(path, create=True) as (dfd, name):
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, _CREATE, 0o666, dir_fd=dfd)
        except OSError as e:
            raise _named(e, path) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            placed = place(tmp, name, dfd)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(e, OSError) and e.errno is not None and not isinstance(e, PlantedLink):
                raise _named(e, path) from None
            raise
        try:  # still there after a link (a rename took it)
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        return placed is None or placed


def _named(e: OSError, path) -> OSError:
    """The error of a call made in a folder's handle, naming the file it was about (its message would name
    only a temp file's bare name)."""
    return type(e)(e.errno, e.strerror, str(path))


def create_once(path: Path, data: bytes) -> bool:
    """Write the file `path` only if nothing is at its name: a fresh temp file linked into place, through the
    folder's handle (of two processes making it at once one wins, where a rename would let the later replace
    the earlier). True if this call made it."""
    def link(tmp: str, name: str, dfd: int) -> bool:
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            return False
        return True

    return _placed(path, lambda fh: fh.write(data), link)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Text (UTF-8) or bytes to `path`, atomically (`write_with`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    write_with(path, lambda fh: fh.write(raw))


def append_text(path: Path, text: str) -> None:
    """Append to a log file in an existing folder, never through a link on its way or at its name."""
    with _InDir(path, create=False) as (dfd, name):
        fd = os.open(name, _APPEND, 0o666, dir_fd=dfd)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)


def open_file(path, flags: int = _READ) -> int:
    """A file descriptor of the file `path` opened with `flags` (O_NOFOLLOW added) in its folder's handle:
    the readers' way in (`rw_sweeps.core.readers`)."""
    with _InDir(path, create=False) as (dfd, name):
        return os.open(name, flags | _NOFOLLOW | _CLOEXEC, dir_fd=dfd)


def read_bytes(path: Path) -> bytes:
    """A file's bytes, never through a link on its way or at its name (raises OSError for one)."""
    with os.fdopen(open_file(path), "rb") as fh:
        return fh.read()


def unlink(path: Path, missing_ok: bool = True) -> None:
    """Remove the file `path` (a link at its name itself, never what it points to) through its folder's handle."""
    try:
        with _InDir(path, create=False) as (dfd, name):
            os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        if not missing_ok:
            raise


def lexists(path: Path) -> bool:
    """Whether anything (a link included) is at `path`, looked up through its folder's handle."""
    try:
        with _InDir(path, create=False) as (dfd, name):
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except (FileNotFoundError, NotADirectoryError, PlantedLink):
        return False


class NoFollowFileHandler(logging.FileHandler):
    """logging.FileHandler that opens its file with O_NOFOLLOW in its folder's handle (a run's `<job>.log`)."""

    def _open(self):  # noqa: D401 - the one method FileHandler documents for opening its stream
        flags = _APPEND if "a" in self.mode else (_CREATE & ~os.O_EXCL) | os.O_TRUNC
        with _InDir(self.baseFilename, create=False) as (dfd, name):
            fd = os.open(name, flags, 0o666, dir_fd=dfd)
        return os.fdopen(fd, self.mode.replace("b", ""), encoding=self.encoding, errors=self.errors)
