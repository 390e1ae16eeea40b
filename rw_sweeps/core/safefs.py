"""The one way this project writes into a sweep folder, which strangers may share.

Every file is written to a fresh, unpredictable temporary name opened with O_CREAT|O_EXCL|O_NOFOLLOW (a
link or file planted at that name makes the open fail instead of redirecting the write) and renamed over
its target (a rename replaces a planted link itself, never what it points to); readers so see the old
file or the new one, never half of one. Logs are appended through O_NOFOLLOW, and a run folder or its
`.hydra` that is a symbolic link is refused (`PlantedLink`) rather than followed. Files get the
permissions the umask allows, as `open` would give them (group-readable on a shared file system). A write
killed outright (SIGKILL, a second signal) leaves its temp file; `remove_stale_temps` removes those of a
sweep folder when the next launch holds its lock.
"""
from __future__ import annotations

import errno
import io
import logging
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Callable

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{16}\.tmp", re.DOTALL)  # `write_with`'s temp names, and only those
STALE_TEMP_S = 10.0  # a temp file untouched this long has no writer left (a live write keeps it fresh)
_NOT_OURS = frozenset({"wandb", ".wandb_data", ".submitit"})  # folders other programs write: never ours
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class PlantedLink(OSError):
    """A folder the project writes into is a symbolic link: followed, it would send files elsewhere."""


def ensure_dir(path: Path) -> Path:
    """The folder, created if missing (with its parents); a link at its place is refused, not followed."""
    path = Path(path)
    if path.is_symlink():
        raise PlantedLink(f"{path} is a symbolic link; refusing to write through it")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file at the folder's place
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None
    if path.is_symlink():  # planted between the check and the mkdir
        raise PlantedLink(f"{path} is a symbolic link; refusing to write through it")
    return path


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
            raise PlantedLink(f"{folder} is a symbolic link; refusing to write through it")
        if folder.is_dir():
            for entry in os.scandir(folder):
                if entry.is_symlink():
                    raise PlantedLink(f"{entry.path} is a symbolic link; refusing to write through it")


def remove_stale_temps(root: Path, older_than_s: float = STALE_TEMP_S) -> int:
    """Remove the temp files that killed writes left under `root` (a sweep folder whose lock the caller
    holds, so no other launch writes there): only names `write_with` makes (`.<name>.<16 hex digits>.tmp`),
    only regular files and links (a link itself, never what it points to), only those unmodified for
    `older_than_s` seconds (a write still going keeps its file fresh). Folders are entered only when they
    are real folders (a link to a folder is never followed), except those of wandb and submitit. Returns
    how many were removed; a file that cannot be looked at or removed is left as it is."""
    now, removed = time.time(), 0
    stack = [os.fspath(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.name.endswith(".tmp") and TEMP_NAME.fullmatch(entry.name):
                        st = entry.stat(follow_symlinks=False)
                        if (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and now - st.st_mtime >= older_than_s:
                            os.unlink(entry.path)
                            removed += 1
                    elif entry.name not in _NOT_OURS and entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except OSError:
                    continue
    return removed


def write_with(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """`write(fh)` into a fresh temp file beside `path`, then rename it into place (the one writer)."""
    path = Path(path)
    if path.parent.is_symlink():
        raise PlantedLink(f"{path.parent} is a symbolic link; refusing to write through it")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, _CREATE, 0o666)
    except FileNotFoundError:
        ensure_dir(path.parent)
        fd = os.open(tmp, _CREATE, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write(path: Path, data: str | bytes) -> None:
    """Text (UTF-8) or bytes to `path`, atomically (`write_with`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    write_with(path, lambda fh: fh.write(raw))


def append_text(path: Path, text: str) -> None:
    """Append to a log file, never through a link planted at its name or its folder's."""
    if Path(path).parent.is_symlink():
        raise PlantedLink(f"{Path(path).parent} is a symbolic link; refusing to write through it")
    fd = os.open(path, _APPEND, 0o666)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)


def read_bytes(path: Path) -> bytes:
    """A file's bytes, never through a link at its name (raises OSError for one)."""
    fd = os.open(path, _READ)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


class NoFollowFileHandler(logging.FileHandler):
    """logging.FileHandler that opens its file with O_NOFOLLOW (a run's `<job>.log` in the sweep folder)."""

    def _open(self):  # noqa: D401 - the one method FileHandler documents for opening its stream
        flags = _APPEND if "a" in self.mode else (_CREATE & ~os.O_EXCL) | os.O_TRUNC
        fd = os.open(self.baseFilename, flags, 0o666)
        return os.fdopen(fd, self.mode.replace("b", ""), encoding=self.encoding, errors=self.errors)
