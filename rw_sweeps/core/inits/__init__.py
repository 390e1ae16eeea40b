"""The inits, one module each: its schema (`@option("init")`), its rules (on its fields, and in `validate` for
what spans fields), its scale (`scale()`: what a run's summary records as `sigma`; `unit()`: the init at unit
scale, the draw every point of its σ axis is a multiple of) and its implementation for each engine it serves
(`ENGINES`):

- `eq21`: the compact engine of eq. 2.1 (`rw_sweeps.core.training.initial_state`), a class with
  `initial(cfg, geo, dtype)` (one run's parameters V (and A) and the compact (a, c) of its W) and
  `draw_bytes(cfg)` (the peak memory of that draw, which the check before a run counts: `resources`);
- `gpt`: `model=gpt`'s initial parameters (`rw_sweeps.core.gpt.model.init_params`), a class with
  `weight(cfg, p, gen)`: one weight matrix or embedding `p` (a `gpt.model.Param`), float64, from the run's
  init stream (biases 0 and LayerNorm gains 1 are the model's, under every init);
- `oracle`: the literal dense θ the exactness tests train (`rw_sweeps.core.oracle.initial`), a class with
  `dense(cfg, dtype)`.

An engine the init has no entry for is refused before anything is written (`config.implementation`); an
entry that lacks a method fails when the module registers. The order of the imports below is the order the
options are listed in.
"""
from . import zero, gaussian, gpt2  # noqa: F401 - each declares itself (`@option("init")`)
