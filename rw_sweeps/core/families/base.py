"""What every data family has and must provide (`DataConfig`): the keys of every family, the hooks a family
overrides, and the checks `@option("data")` runs when a family registers."""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
from omegaconf import MISSING

from ..errors import ConfigError
from ..markov import BALANCED, long_run_law
from ..summary_fields import ECHOES, SUMMARY_FIELDS


@dataclass
class DataConfig:
    """The keys every data family has. A family (`rw_sweeps.core.families`) subclasses it with its own keys
    and behaviour: its rules (`validate`), its Π (`transition`, None when the chain is not first order),
    its sampler (`draw`) and, where it has a closed form, its Bayes-optimal accuracy (`opt_acc`).

    What a family must provide is checked when it registers (`registered`, a one-line TypeError naming the
    family and the hook): a sampler, its own `draw` or the first-order chain of its `transition`; and, where
    it offers target=all (`TARGETS`), the law at every position: its own `laws` or, for a first-order chain,
    its `transition` (the default `laws` reads Π). A family whose `draw` is not the chain of its `transition`
    defines `laws` or declares TARGETS = ("last",). Its facts live here too: the keys its summary echoes
    (`ECHO`) and Theorem 4.1's trap (`is_trap`)."""
    class _Derived:
        """A class attribute derived from the class it is read on, until a family declares its own value."""
        def __init__(self, derive):
            self.derive = derive

        def __get__(self, obj, cls=None):
            cls = cls if cls is not None else type(obj)
            if "__dataclass_fields__" not in cls.__dict__:  # read by @dataclass itself, before it has fields
                return self
            return self.derive(cls)

    name: str = MISSING  # the family: the choice of `data=...`
    K: int = 6  # number of states (vocabulary size for QA)
    N: int = 97  # sequence length, counting the target: N − 1 observed tokens
    n_train: int = 1000
    n_test: int = 1000
    # what is predicted: last (x_N from x_1 … x_{N−1}, the paper's task) | all (x_{t+1} from x_1 … x_t at every
    # position t, the next-token objective of nanoGPT-style training; model=gpt only)
    target: str = "last"
    online: bool = False  # true: a fresh batch of data.batch sequences every step (model=gpt); false: the fixed training set
    batch: int = 16  # sequences per step when online (the fixed test set stays n_test sequences)
    PER_RUN: ClassVar[tuple] = ()  # keys whose values differ within one batch (the rest is the run's shape)
    # the keys above whose default a family may set itself (its number of states, its length), keeping their
    # meaning, type and rule; any other key of this class a family declares again is refused when it registers
    # (`registry.check_shadowing`)
    OPTION_DEFAULTS: ClassVar[tuple] = ("K", "N")
    SEEDED: ClassVar[bool] = False  # do the family's rules depend on the run's seed (`with_seed`)?
    # the data.target values it serves: last always, all where it has the laws for it (its `laws`, or its
    # `transition`, whose Π the default `laws` reads); a family may declare fewer (`registered` checks it)
    TARGETS: ClassVar[tuple] = _Derived(lambda cls: ("last", "all") if cls.has_laws() else ("last",))
    # the keys a run's summary echoes under their names (`echoed`): by default the family's own keys but its
    # FILES; a family declares fewer where a key is large (a matrix) or says nothing alone
    ECHO: ClassVar[tuple] = _Derived(lambda cls: tuple(k for k in cls.own_keys() if k not in cls.FILES))
    # keys that name a file read when a config is validated, whose content the config then records; a stored
    # config is judged without opening them (`stored`)
    FILES: ClassVar[tuple] = ()
    # keys that hold a data.K × data.K matrix (a list of K rows of K numbers): a run's config.yaml records
    # K² numbers for each, which `rw_sweeps.core.contract.written` counts from data.K (its size limit is one on K)
    MATRICES: ClassVar[tuple] = ()

    @classmethod
    def provides(cls, hook: str) -> bool:
        """Does the family define `hook` (a method of this class) itself, rather than inherit this class's?"""
        return getattr(cls, hook) is not getattr(DataConfig, hook)

    @classmethod
    def has_laws(cls) -> bool:
        """Can it give the law at every position (target=all): its own `laws`, or a first-order Π?"""
        return cls.provides("laws") or cls.provides("transition")

    @classmethod
    def own_keys(cls) -> tuple:
        """The family's keys beyond those every family has."""
        base = DataConfig.__dataclass_fields__
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in base)

    @classmethod
    def registered(cls) -> None:
        """What `@option("data")` checks before the family is a choice (a one-line TypeError naming the family
        and what it lacks): a sampler; target=all offered only with the laws for it; an echoed key its own
        and no other field of the summary."""
        name = f"data={cls.__dataclass_fields__['name'].default}"
        if not (cls.provides("draw") or cls.provides("transition")):
            raise TypeError(f"{name}: {cls.__name__} has no sampler: define draw(n, gen, seed), or transition(seed) "
                            "(Π of a first-order chain, which the default draw samples)")
        targets = cls.TARGETS
        if not isinstance(targets, tuple) or "last" not in targets or not set(targets) <= {"last", "all"}:
            raise TypeError(f"{name}: TARGETS={targets!r} must be a tuple of last (every family serves it) and all")
        if "all" in targets and not cls.has_laws():
            raise TypeError(f"{name}: TARGETS offers all but {cls.__name__} has no laws(seq, seed) (nor a "
                            "first-order transition(seed) for the default laws): define laws, or leave all out")
        echo = cls.ECHO
        if not isinstance(echo, tuple):
            raise TypeError(f"{name}: ECHO={echo!r} must be a tuple of its own keys")
        for key in echo:
            if key not in cls.own_keys():
                raise TypeError(f"{name}: ECHO names {key!r}, which is not one of its own keys "
                                f"({', '.join(cls.own_keys()) or 'none'})")
            if key in SUMMARY_FIELDS and ECHOES.get(key) != f"data.{key}":
                raise TypeError(f"{name}: ECHO names {key!r}, a summary field of its own; leave it out of ECHO")

    def echoed(self) -> dict:
        """The family's keys a run's summary echoes (`ECHO`), under their names (copies)."""
        return {k: copy.deepcopy(getattr(self, k)) for k in type(self).ECHO}

    def is_trap(self) -> bool:
        """Theorem 4.1's conditions on the data (the escape theory's `trap`: zero-init GD stays at the
        symmetric point): False where the family has no such theorem (the circle says where it does)."""
        return False

    def validate(self, seed: int) -> None:
        """The family's own rules (ConfigError, one line)."""

    def transition(self, seed: int = 0):
        """Π as a K×K numpy array (row i: the law of the next state given state i), None if the data are not
        a first-order chain; `seed` (the run's) matters only where the chain is drawn from it."""
        return None

    def laws(self, seq, seed: int):
        """For target=all: (n, N−1, K) numpy, row t the law of s_{t+2} given s_1 … s_{t+1} of each sequence
        `seq` (n, N) (0-based: position t predicts seq[:, t + 1]); None where the family has no such law
        (the QA tasks). Default: the first-order chain, Π[s_t]."""
        Pi = self.transition(seed)
        return None if Pi is None else np.asarray(Pi, np.float64)[seq[:, :-1]]

    def stationary(self, seed: int):
        """The law the unigram baseline predicts (K,), or None: the in-context unigram strategy instead. For a
        first-order chain, the long-run law of states from the uniform start, (1/T) Σ_{t<T} u Πᵗ (T = 4096):
        the stationary law where it is unique, and the well-defined average where it is not."""
        Pi = self.transition(seed)
        return None if Pi is None else long_run_law(Pi)

    @property
    def smoothing(self) -> float:
        """α of the in-context strategies (n_k + α) / (n + Kα): 1 (Laplace), or the family's Dirichlet α."""
        return 1.0

    def draw_many(self, datas: list, n: int, gens: list, seeds: list) -> list:
        """`draw` for many runs of this family (online batches, one generator each), each exactly its own
        `draw`: where the family's sampler is this class's first-order chain (`DataConfig.draw`, not
        overridden), one loop over positions for all runs (`data.chains_many`); else run by run."""
        if type(self).draw is DataConfig.draw:
            from ..data import chains_many  # torch: only where a run draws its data

            return chains_many([d.transition(s) for d, s in zip(datas, seeds)], self.N, n, gens,
                               starts=[d.initial_law(s) for d, s in zip(datas, seeds)])
        from ..data import checked  # torch: only where a run draws its data

        return [checked(d, d.draw(n, g, s), n) for d, g, s in zip(datas, gens, seeds)]

    def first_order_pi(self, seed: int):
        """The Π that V is compared with (v_pi_cosine) and that the trap's classes come from."""
        return self.transition(seed)

    @property
    def opt_acc(self) -> Optional[float]:
        """The Bayes-optimal accuracy where it has a closed form; None: the summary measures it on the test set."""
        return None

    @property
    def context(self) -> int:
        """How many last states the next one depends on (the attention's parents)."""
        return 1

    def parents_of(self, seed: int):
        """The parents (1-based positions) of every position 1 … N: the `context` positions before it (a
        Bayesian network overrides it with its DAG); None where the law is not a function of positions."""
        k = self.context
        return [list(range(max(1, i - k), i)) for i in range(1, self.N + 1)]

    def parents(self, seed: int):
        """y's parents (1-based positions), or None."""
        of = self.parents_of(seed)
        return None if of is None else of[-1]

    def draw(self, n: int, gen, seed: int):
        """n sequences (`rw_sweeps.core.data.Split`) from the generator; default: the first-order chain Π."""
        from ..data import chains  # torch: only where a run draws its data

        return chains(self.transition(seed), self.N, n, gen, start=self.initial_law(seed))

    def initial_law(self, seed: int):
        """The law of s_1 (K,), or None: uniform (drawn as the circle draws it), or BALANCED: that uniform
        draw replaced by node i mod K for sequence i (`data.balance`)."""
        return None

    def draw_into(self, gen, seed: int, tokens, y, P_true) -> None:
        """`draw` written into a stacked batch's numpy views (a family with a faster path overrides it)."""
        import torch  # torch: only where a run draws its data

        from ..data import checked

        s = checked(self, self.draw(len(y), gen, seed), len(y))
        tokens[...], y[...] = s.tokens.numpy(), s.y.numpy()
        P_true[...] = s.P_true.to(torch.from_numpy(P_true[:0]).dtype).numpy()

    def in_unit(self, key: str, value: float) -> None:
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ConfigError(f"data.{key}", value, "must be in [0, 1]")