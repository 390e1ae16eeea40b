"""What every model option has (`ModelBase`: its training loop, its engine), and what an option of eq. 2.1's
family declares beyond it (`IMPLEMENTATION_KINDS`: the fast paths it may have beside its reference forward)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from omegaconf import MISSING

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..inits.base import InitConfig

NORMALIZE = ("none", "whole", "positional", "token")
# bools (and what OmegaConf makes of a bool given to a str key) read as before model.normalize was a string
NORMALIZE_ALIASES = {True: "whole", False: "none", "True": "whole", "False": "none", "true": "whole",
                     "false": "none"}

# The implementations an option of eq. 2.1's family may declare beside its reference forward (its
# `IMPLEMENTATIONS`), fastest last: what each is, and what it hands the batches it cannot run to.
IMPLEMENTATION_KINDS = {
    "engine": "the compact engine's hand-written backward (rw_sweeps/core/engine.py, model.py)",
    "kernel": "the C kernel (rw_sweeps/core/fused.py, fused.c), which hands what it cannot run to the engine",
}


def resolve_normalize(model, init):
    """model.normalize=auto → whole with a Gaussian init, none otherwise (the paper's protocol); a copy."""
    where = NORMALIZE_ALIASES.get(model.normalize, model.normalize)
    if where == "auto":
        where = init.AUTO_NORMALIZE
    return model if where == model.normalize else dataclasses.replace(model, normalize=where)


@dataclass
class ModelBase:
    """What every model option has: its name, and the training loop that trains it (`TRAINER`, a module of
    `rw_sweeps.core` with `train`, `summary`, `prefetch` and `run_bytes`: `rw_sweeps.core.trainer`)."""
    name: str = MISSING
    PER_RUN: ClassVar[tuple] = ()
    TRAINER: ClassVar[str] = ""
    ENGINE: ClassVar[str] = ""  # the engine its trainer is (what an optimiser or init implements for it)
    # why the escape theory (`rw_sweeps.core.theory`, the linearised GD step of eq. 2.1) does not describe
    # this model, or None where it does
    ESCAPE_THEORY: ClassVar[Optional[str]] = "the escape theory linearises eq. 2.1's GD step (model=transformer)"
    # the fast paths it declares beside its reference forward (`IMPLEMENTATION_KINDS`); () for none
    IMPLEMENTATIONS: ClassVar[tuple] = ()
    # what `precision=auto` (the default) trains it in: float64 for eq. 2.1, whose exactness (Theorem 4.1's
    # symmetric point, the tests' 1e-8 agreement with literal autograd) the paper's claims rest on
    PRECISION: ClassVar[str] = "float64"

    def resolved(self, init: "InitConfig") -> "ModelBase":
        """The model with what depends on the init resolved (model.normalize=auto); a copy where it changes."""
        return self

    def validate(self, c: "RunConfig") -> None:
        """The model's own rules, given the whole run (ConfigError, one line)."""

    def recorded(self, c: "RunConfig") -> tuple[int, int]:
        """Numbers in one history row and in one snapshot row of a run of this model, as its trainer records
        them: `rw_sweeps.core.contract.written` bounds a run's files with them, so that a run whose files its
        readers would refuse is refused before it trains."""
        raise NotImplementedError(f"model={self.name} does not say what its records hold (recorded)")


def check_implementations(cls: type) -> None:
    """What `@option("model")` checks of an eq. 2.1 option's `IMPLEMENTATIONS` and `ESCAPE_THEORY` (a one-line
    TypeError naming the option): both declared by the class itself — a subclass that inherited its parent's fast paths would
    train its own forward on its parent's —, naming only kinds there are, and the kernel only beside the
    engine that takes what the kernel cannot run."""
    name = f"model={cls.__dataclass_fields__['name'].default}"
    if "IMPLEMENTATIONS" not in cls.__dict__:
        raise TypeError(f"{name}: {cls.__name__} declares no IMPLEMENTATIONS of its own: the fast paths that "
                        f"compute its forward (of {', '.join(IMPLEMENTATION_KINDS)}), or () for its reference "
                        "forward alone")
    unknown = [k for k in cls.IMPLEMENTATIONS if k not in IMPLEMENTATION_KINDS]
    if unknown or not isinstance(cls.IMPLEMENTATIONS, tuple):
        raise TypeError(f"{name}: IMPLEMENTATIONS = {cls.IMPLEMENTATIONS!r}; a tuple of "
                        f"{', '.join(IMPLEMENTATION_KINDS)}")
    if "kernel" in cls.IMPLEMENTATIONS and "engine" not in cls.IMPLEMENTATIONS:
        raise TypeError(f"{name}: IMPLEMENTATIONS declares the kernel without the engine, which runs what the "
                        "kernel cannot (K > 127, gram=numeric, a GPU)")
    if "ESCAPE_THEORY" not in cls.__dict__:  # the theory linearises one forward's GD step: a new forward says
        raise TypeError(f"{name}: {cls.__name__} declares no ESCAPE_THEORY of its own: None where "
                        "rw_sweeps.core.theory's linearised GD step of eq. 2.1 describes its forward, else why not")
