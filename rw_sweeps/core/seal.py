"""Seals: an HMAC under a key only this user can read, for files this project writes and later trusts.

A shared sweep folder is writable by co-workers, so a file there proves nothing by its name, its stamps or
an unkeyed hash (anyone can recompute one). What this project reads back as its own — the analysis cache
(`runs.parquet`), a run's checkpoint — carries a seal made with the user's key
(`~/.cache/rw_sweeps/seal.key`, mode 0600, created on first use; `RW_SWEEPS_SEAL_KEY` names another file).
A file whose seal does not verify is not trusted: the cache is rebuilt from the run files, the checkpoint
discarded (the run starts over). The same user on every node of a cluster shares the key through the home
folder; another user's seal does not verify, which costs only a rebuild.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from functools import lru_cache
from pathlib import Path

KEY_BYTES = 32


def key_path() -> Path:
    env = os.environ.get("RW_SWEEPS_SEAL_KEY")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rw_sweeps" / "seal.key"


@lru_cache(maxsize=4)
def _key(path: str) -> bytes:
    p = Path(path)
    try:
        return _read_key(p)
    except FileNotFoundError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = secrets.token_bytes(KEY_BYTES)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return _read_key(p)
    with os.fdopen(fd, "wb") as fh:
        fh.write(fresh)
    return fresh


def _read_key(p: Path) -> bytes:
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{p}: the seal key must be a regular file of yours, readable by no one else")
        key = fh.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise PermissionError(f"{p}: the seal key must hold {KEY_BYTES} bytes")
    return key


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
