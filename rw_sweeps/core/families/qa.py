"""§6's question-answering tasks over a 19-word vocabulary: N − 1 words, then the answer. Their shapes are
fixed by the task, and the answer is deterministic (OPT = 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from ..registry import option
from .base import DataConfig


class _QA(DataConfig):
    TARGETS: ClassVar[tuple] = ("last",)  # one question, answered at the end
    ECHO: ClassVar[tuple] = ()  # no keys of their own

    def validate(self, seed: int) -> None:
        fixed = type(self)()
        for key in ("K", "N"):
            if getattr(self, key) != getattr(fixed, key):
                raise ConfigError(f"data.{key}", getattr(self, key), f"must be {getattr(fixed, key)} for "
                                  f"data={self.name} (fixed by the task)")

    def parents_of(self, seed: int):
        return None  # the answer depends on the whole sentence

    @property
    def opt_acc(self) -> float:
        return 1.0


@option("data")
@dataclass
class QaMajority(_QA):
    """Task 1: "Based on the list <5 fruits> which type of fruit appears most frequently" → the majority."""
    name: str = "qa_majority"
    K: int = 19  # the 19-word vocabulary
    N: int = 17  # 16 words, then the answer

    def draw(self, n: int, gen, seed: int):
        from ..data import qa_majority  # torch: only where a run draws its data

        return qa_majority(n, gen)


@option("data")
@dataclass
class QaPreference(_QA):
    """Task 2: "Based on the sentence I prefer an <a> to an <b> which type of fruit do I prefer" → a."""
    name: str = "qa_preference"
    K: int = 19  # the 19-word vocabulary
    N: int = 19  # 18 words, then the answer

    def draw(self, n: int, gen, seed: int):
        from ..data import qa_preference  # torch: only where a run draws its data

        return qa_preference(n, gen)
