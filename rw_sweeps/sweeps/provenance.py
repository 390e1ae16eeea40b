"""The code that trained a run, as its summary.json and its wandb run record it: the git commit and dirty flag
of the checkout the package runs from (null outside one), the package's and torch's versions, the host.

Read once per process, when the first run's summary is written (`rw_sweeps.sweeps.run`, which imports this
module there and then: torch is imported here for its version, and a command that trains nothing does not
pay for it).
"""
from __future__ import annotations

import socket
import subprocess
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


@lru_cache(maxsize=1)
def provenance() -> dict:
    """git_commit, git_dirty, version (the rw-sweeps package's), torch_version and host, read once per process."""
    here = Path(__file__).resolve().parent
    commit = dirty = None
    try:
        git = ["git", "-C", str(here)]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or None
        if commit:
            st = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=10)
            dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        pkg = version("rw-sweeps")
    except PackageNotFoundError:
        pkg = None
    return {"git_commit": commit, "git_dirty": dirty, "version": pkg, "torch_version": torch.__version__,
            "host": socket.gethostname()}
