"""Any row-stochastic K×K Π, given as a list of rows or read from a file."""
from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Optional

import numpy as np

from ..errors import ConfigError
from ..readers import Broken, read_bytes
from ..registry import option
from .base import DataConfig


@option("data")
@dataclass
class MarkovMatrix(DataConfig):
    name: str = "markov_matrix"
    K: int = 3  # Π's size
    # the row-stochastic K×K Π, a list of rows. Typed Any, checked and made float in `validate`: OmegaConf
    # 2.3 cannot merge a command line's whole numbers (`data.Pi=[[0,1],[1,0]]`) into a List[List[float]]
    Pi: Optional[List[List[Any]]] = field(default_factory=lambda: [[0.8, 0.1, 0.1], [0.1, 0.6, 0.3],
                                                                     [0.3, 0.2, 0.5]])
    # Π from a file instead (a .npy array, or text: K rows of K numbers separated by spaces or commas; a
    # relative path is from the launch folder). Read when the config is validated; it replaces data.Pi, so a
    # run's config.yaml holds the matrix it was trained on.
    Pi_file: Optional[str] = None
    PER_RUN: ClassVar[tuple] = ("Pi", "Pi_file")
    FILES: ClassVar[tuple] = ("Pi_file",)
    MATRICES: ClassVar[tuple] = ("Pi",)  # the config records Π: K² numbers (`contract.written` bounds K by them)
    ECHO: ClassVar[tuple] = ()  # Π is K² numbers: the config records it

    def validate(self, seed: int) -> None:
        if self.Pi_file is None:
            return self._check()
        self.Pi = _read_pi(self.Pi_file, self.K)  # the file replaces data.Pi (the default, or a recorded one)
        try:
            self._check()
        except ConfigError as e:  # the user wrote the file, not data.Pi: name it
            raise ConfigError("data.Pi_file", self.Pi_file, e.allowed) from None

    def _check(self) -> None:
        P, K = self.Pi, self.K
        if P is None:
            raise ConfigError("data.Pi", P, "must be a K×K row-stochastic matrix (a list of rows)")
        if not isinstance(P, list) or not all(isinstance(row, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in row) for row in P):
            raise ConfigError("data.Pi", P, "must be a list of rows of numbers, e.g. [[0.9,0.1],[0.2,0.8]]")
        self.Pi = P = [[float(x) for x in row] for row in P]
        if not P or any(len(row) != len(P) for row in P):
            raise ConfigError("data.Pi", P, "must be square: K rows of K entries each")
        if len(P) != K:
            raise ConfigError("data.Pi", P, f"must be data.K×data.K ({K}×{K}); it is {len(P)}×{len(P)}")
        if K < 2:
            raise ConfigError("data.K", K, "must be >= 2 for data=markov_matrix")
        for i, row in enumerate(P):
            if not all(math.isfinite(x) and x >= 0 for x in row):
                raise ConfigError("data.Pi", P, f"row {i} has a negative or non-finite entry; entries must be in [0, 1]")
            if abs(math.fsum(row) - 1) > 1e-9:
                raise ConfigError("data.Pi", P, f"row {i} sums to {math.fsum(row):.12g}; every row must sum to 1 "
                                  "(to 1e-9)")

    def transition(self, seed: int = 0) -> np.ndarray:
        return np.array(self.Pi, dtype=np.float64).reshape(self.K, self.K)


# a Π as text of the largest K a run may have (`rw_sweeps.core.contract.written`: ~1,150) is ~30 MB
PI_FILE_CAP = 64 * 1024 * 1024


def _read_pi(path: str, K: int) -> list:
    """data.Pi_file's matrix as a list of rows, or a one-line ConfigError. The file is read as the run-folder
    files are (`readers`: a regular file only, never a FIFO or a device, at most PI_FILE_CAP bytes); a text
    file must hold data.K rows (counted before a number is parsed); an error names the file and the rule,
    never a line of its content (the path may be anyone's file)."""
    f = os.path.expanduser(path)
    try:
        raw = read_bytes(f, PI_FILE_CAP, "data.Pi_file")
    except FileNotFoundError:
        raise ConfigError("data.Pi_file", path, "no such file") from None
    except Broken as e:
        raise ConfigError("data.Pi_file", path, e.why.replace("data.Pi_file ", "", 1)) from None
    try:
        if f.endswith(".npy"):
            P = np.load(io.BytesIO(raw), allow_pickle=False)
        else:
            rows = [r for r in raw.decode("utf-8").replace(",", " ").splitlines() if r.strip()]
            if len(rows) != K:
                raise ConfigError("data.Pi_file", path, f"must hold data.K={K} rows of {K} numbers; it holds "
                                  f"{len(rows):,} rows")
            P = np.loadtxt(rows, ndmin=2)
    except (OSError, ValueError, UnicodeDecodeError, EOFError):
        what = "a .npy array of numbers" if f.endswith(".npy") else "UTF-8 text: K rows of K numbers"
        raise ConfigError("data.Pi_file", path, f"must hold {what}; it does not") from None
    if P.ndim != 2:
        raise ConfigError("data.Pi_file", path, f"must hold a 2-d matrix; it holds {P.ndim} dimension(s)")
    if P.dtype.kind not in "fiu":
        raise ConfigError("data.Pi_file", path, "must hold numbers")
    return [[float(x) for x in row] for row in P]
