"""The optimisers, one module each: its schema (`@option("optim")`), its rules (on its fields, and in
`validate` for what spans fields), and its implementation for each engine it serves (`ENGINES`):

- `eq21`: the compact engine of eq. 2.1 (`rw_sweeps.core.training`), a class with `start(state)` (the
  optimiser's own state in `state.opt`, which checkpoints carry) and `steps(state, data, eps, w, geo, n)`;
- `gpt`: `model=gpt`'s batched update (`rw_sweeps.core.gpt.optim`), a class with `state(params)` and
  `update(...)` per parameter;
- `oracle`: the literal torch.optim optimizer the exactness tests train the dense model with
  (`rw_sweeps.core.oracle`), a class with `make(params, cfg)`.

An engine the optimiser has no entry for is refused before anything is written (`config.implementation`);
an entry that lacks a method fails when the module registers. The order of the imports below is the order
the options are listed in.
"""
from . import gd, adam, sgd, adamw  # noqa: F401 - each declares itself (`@option("optim")`)
