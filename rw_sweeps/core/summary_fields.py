"""The fields of a run's `summary.json`: each one's type and bounds (`SUMMARY_FIELDS`), and the summary's
copies of config keys (`ECHOES`). `rw_sweeps.core.contract` checks a summary against them; a data family's
`ECHO` is checked against them when it registers."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .registry import SEED_MAX


@dataclass(frozen=True)
class Field:
    """One summary field: its type, its bounds, whether it may be null or left out (older versions wrote
    fewer fields: a missing one reads as null)."""
    kind: str  # int | num | str | bool | ints | list | any
    lo: float | None = None
    hi: float | None = None
    required: bool = False
    nullable: bool = True

    def check(self, value) -> str | None:
        """None if `value` fits, else what is wrong."""
        if value is None:
            return None if self.nullable else "must not be null"
        k = self.kind
        if k == "int":
            ok = type(value) is int
        elif k == "num":
            ok = type(value) in (int, float) and math.isfinite(value)
        elif k == "str":
            ok = type(value) is str
        elif k == "bool":
            ok = type(value) is bool
        elif k == "ints":
            ok = type(value) is list and all(type(x) is int for x in value)
        elif k == "list":
            ok = type(value) is list
        else:
            ok = True
        if not ok:
            return f"must be {_KIND_NAMES[k]}"
        if k in ("int", "num") and ((self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi)):
            return f"must be in [{shown(self.lo)}, {shown(self.hi)}]"
        return None


_KIND_NAMES = {"int": "an integer", "num": "a finite number", "str": "a string", "bool": "true or false",
               "ints": "a list of integers", "list": "a list", "any": "a JSON value"}


def shown(x) -> str:
    """A bound as a message shows it (… where there is none)."""
    return "…" if x is None else f"{x:g}"


_NUM, _RATE, _STEP = Field("num"), Field("num", 0, 1), Field("int", 0)
SUMMARY_FIELDS = {
    "status": Field("str", required=True, nullable=False),
    "error": Field("str"),
    "steps": Field("int", 0, required=True, nullable=False),
    "eval_step": _STEP,
    **{k: _RATE for k in ("test_acc", "opt_acc", "opt_test_acc")},
    **{k: _NUM for k in ("test_loss", "train_loss", "test_kl", "parent_attention", "v_pi_cosine", "pred_dist",
                         "attention_spread", "parents_attention", "opt_loss", "unigram_loss", "relative_loss",
                         "kl_uniform", "kl_unigram", "kl_bigram", "p", "q", "sigma", "lr", "eps")},
    "wall_s": Field("num", 0),
    "trap": Field("bool"),
    **{k: _STEP for k in ("symmetry_break_step", "prediction_break_step", "locked_position")},
    "parent_positions": Field("ints"),
    **{k: Field("list") for k in ("attn_parent", "induction")},
    "seed": Field("int", 0, SEED_MAX, required=True, nullable=False),
    "K": Field("int", 1, required=True, nullable=False),
    "N": Field("int", 1, required=True, nullable=False),
    "M": Field("int", 1),
    **{k: Field("int", 1) for k in ("n_layer", "n_head")},
    **{k: Field("bool") for k in ("tie", "online", "git_dirty")},
    **{k: Field("str") for k in ("relative_loss_null", "data", "init", "model", "precision", "optim", "target", "run_id",
                                 "git_commit", "version", "torch_version", "host")},
}
# The summary's copies of config keys (for a reader of the one file): each must equal the config's.
ECHOES = {"seed": "seed", "K": "data.K", "N": "data.N", "M": "model.M", "p": "data.p", "q": "data.q",
          "data": "data.name", "init": "init.name", "model": "model.name", "lr": "optim.lr", "eps": "optim.eps",
          "optim": "optim.name", "precision": "precision", "n_layer": "model.n_layer", "n_head": "model.n_head",
          "tie": "model.tie", "target": "data.target", "online": "data.online"}
