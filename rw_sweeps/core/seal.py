"""Seals: an HMAC under a key only this user can read, for files this project writes and later trusts.

A shared sweep folder is writable by co-workers, so a file there proves nothing by its name, its stamps or
an unkeyed hash (anyone can recompute one). What this project reads back as its own — the analysis cache
(`runs.parquet`), a run's checkpoint — carries a seal made with the user's key
(`~/.cache/rw_sweeps/seal.key`, mode 0600, created on first use; `RW_SWEEPS_SEAL_KEY` names another file).
It is made whole in one step (a private temp file, synced, then hard-linked to its name), so processes that
start together agree on one key and none reads a half-made one. A key that cannot be used (empty, of another
length, a link, not a regular file, open to others, another user's, a folder that cannot be made) is one
line naming the file and the fix (`SealKeyError`), which the launch and analysis front doors check before
anything is written.
A file whose seal does not verify is not trusted: the cache is rebuilt from the run files, the checkpoint
discarded (the run starts over). The same user on every node of a cluster shares the key through the home
folder; another user's seal does not verify, which costs only a rebuild.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from functools import lru_cache
from pathlib import Path

from .errors import Refused

KEY_BYTES = 32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device",
          stat.S_IFBLK: "a device"}


class SealKeyError(Refused):
    """The seal key cannot be used: one line naming the file, what is wrong and the fix. A Refused, so the
    launch's front door says it as `error: …` and exits 2 (it checks the key before any job starts), as the
    analysis command does."""

    def __init__(self, path, why: str, fix: str):
        self.path = str(path)
        super().__init__(f"{path}: {why}; {fix}")


def key_path() -> Path:
    env = os.environ.get("RW_SWEEPS_SEAL_KEY")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rw_sweeps" / "seal.key"


def check() -> None:
    """Read the key, or make it on first use, now: a front door calls this before any job starts or any file
    is written, so that a key that cannot be used is its one line (SealKeyError) there, not a traceback in
    every run that seals. Costs one 32-byte read (cached for the process)."""
    _key(str(key_path()))


@lru_cache(maxsize=4)
def _key(path: str) -> bytes:
    p = Path(path)
    try:
        return _read_key(p)
    except FileNotFoundError:
        return _make_key(p)


def _make_key(p: Path) -> bytes:
    """A fresh key put in place whole, in one step: written and synced in a private temp file of the key's
    folder, then hard-linked to the key's name. A process that finds the name finds all 32 bytes (created
    empty and then written, a reader in between found it empty); the link fails where another process got
    there first, and everyone uses that one key."""
    folder = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise SealKeyError(p, f"its folder cannot be created ({e.strerror or e})",
                           "make the folder yourself, or set RW_SWEEPS_SEAL_KEY to a file in a folder of yours") from None
    tmp = folder / f".{p.name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except OSError as e:
        raise SealKeyError(p, f"a new seal key cannot be written in {folder} ({e.strerror or e})",
                           "make the folder writable, or set RW_SWEEPS_SEAL_KEY to a file in a folder of yours") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())  # the bytes reach the disk before the name does: a crash leaves no empty key
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass  # another process made it first: use theirs (read below)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            # a file system without hard links: a rename, whole too, though a second first-use rename may
            # replace the first (whose seals then cost a rebuild); everyone reads back what is there
            if not os.path.lexists(p):
                os.rename(tmp, p)
    except OSError as e:
        raise SealKeyError(p, f"a new seal key cannot be put in place ({e.strerror or e})",
                           "set RW_SWEEPS_SEAL_KEY to a file in a folder of yours") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_key(p)


def _read_key(p: Path) -> bytes:
    """The key's 32 bytes; a key that is not a regular file of yours, closed to others and 32 bytes long is
    SealKeyError (a missing one: FileNotFoundError, for `_key` to make it)."""
    try:
        fd = os.open(p, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _unreadable(p, e) from None
    try:
        st = os.fstat(fd)  # of what was opened, not of the name (which may change meanwhile)
        if not stat.S_ISREG(st.st_mode):
            raise SealKeyError(p, f"the seal key is {_KINDS.get(stat.S_IFMT(st.st_mode), 'not a regular file')}, "
                               "not a file", "remove it to make a new one")
        if st.st_uid != os.getuid():
            raise _not_yours(p, st.st_uid)
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            how = "readable" if mode & 0o044 else "writable" if mode & 0o022 else "usable"
            raise SealKeyError(p, f"the seal key is {how} by others (mode {mode:04o})",
                               f"run chmod 600 {p}, or delete it to make a new one")
        key = b""
        while len(key) <= KEY_BYTES and (chunk := os.read(fd, KEY_BYTES + 1 - len(key))):
            key += chunk
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        size = "empty" if not key else f"{max(st.st_size, len(key)):,} bytes long"
        raise SealKeyError(p, f"the seal key is {size}, not {KEY_BYTES} bytes (cut short, or not a key)",
                           "delete it to make a new one")
    return key


def _not_yours(p: Path, uid: int) -> SealKeyError:
    # its owner can read it, and forge every seal made with it
    return SealKeyError(p, f"the seal key belongs to uid {uid}, not to you (uid {os.getuid()})",
                        "set RW_SWEEPS_SEAL_KEY to a file of yours, or delete it to make a new one")


def _unreadable(p: Path, e: OSError) -> SealKeyError:
    """Why the key could not be opened, as one line with its fix."""
    if e.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW at a link: ELOOP on Linux, EMLINK on the BSDs
        return SealKeyError(p, "the seal key is a symbolic link", "replace the link with the file itself, "
                            "or delete it to make a new one")
    if e.errno == errno.ENOTDIR:
        blocked = next((str(a) for a in reversed(p.parents) if os.path.lexists(a) and not os.path.isdir(a)), "a folder")
        return SealKeyError(p, f"its folder cannot be created: {blocked} on its path is not a folder",
                            "set RW_SWEEPS_SEAL_KEY to a file in a folder of yours")
    if e.errno == errno.EACCES:
        try:
            st = os.lstat(p)
        except OSError:
            st = None
        if st is not None and st.st_uid != os.getuid():
            return _not_yours(p, st.st_uid)
        mode = f" (mode {stat.S_IMODE(st.st_mode):04o})" if st is not None else ""
        return SealKeyError(p, f"the seal key cannot be read{mode}", f"run chmod 600 {p}, or delete it to make a new one")
    return SealKeyError(p, f"the seal key cannot be read ({e.strerror or e})",
                        "set RW_SWEEPS_SEAL_KEY to a file in a folder of yours, or delete it to make a new one")


def seal(*parts: bytes) -> str:
    """The hex HMAC-SHA256 of the parts (each length-prefixed, so no two splits of one text seal alike)."""
    mac = hmac.new(_key(str(key_path())), digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.hexdigest()


def verify(expected, *parts: bytes) -> bool:
    """Does `expected` (a hex seal, or anything else read from a file) seal these parts?"""
    return isinstance(expected, str) and hmac.compare_digest(expected, seal(*parts))


def _canonical(record: dict) -> bytes:
    """A JSON record's bytes as its seal covers them: every key but `seal`, sorted, compact and ASCII, so that
    the record parsed back from its file (floats round-trip through repr) gives the bytes it was sealed over."""
    body = {k: v for k, v in record.items() if k != "seal"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def seal_record(what: str, record: dict) -> dict:
    """The JSON record (`adaptive.json`: plain JSON values) with a `seal` over its canonical bytes and its name."""
    return {**record, "seal": seal(b"rw-sweeps record", what.encode(), _canonical(record))}


def record_sealed(what: str, record) -> bool:
    """Was this record, as read back from its file, sealed by `seal_record` under this user's key, unedited?"""
    if not isinstance(record, dict):
        return False
    try:
        body = _canonical(record)
    except (TypeError, ValueError):  # not plain JSON: nothing `seal_record` wrote
        return False
    return verify(record.get("seal"), b"rw-sweeps record", what.encode(), body)
