"""model=gpt: a decoder-only transformer in the nanoGPT sense, R runs of one shape as one batched program.

`schema.py` is its config (one dataclass, every key commented), `model.py` the batched forward pass and the
initialisation, `optim.py` the optimisers (GD, SGD, Adam, AdamW, the schedule, clipping) run by run,
`strategies.py` the baselines and the in-context strategies it is measured against, `training.py` the loop
(the module `GptConfig.TRAINER` names). With `model=gpt_eq21` the generic model is eq. 2.1 itself.
"""
