"""The model options of eq. 2.1's family, one module each (its schema with `@option("model")`, its readable
forward, the fast implementations it declares), on `base.py`; model=gpt's schema is `rw_sweeps.core.gpt.schema`.

Every module of this package but `base` is an option's and is imported here, in the order of its name, so
that a new model is its module and its YAML file (`conf/model/<name>.yaml`) alone."""
import importlib
import pkgutil

from .base import IMPLEMENTATION_KINDS, NORMALIZE, NORMALIZE_ALIASES, ModelBase, resolve_normalize  # noqa: F401
from .transformer import ModelConfig  # noqa: F401
from .transformer_ffn import FfnModelConfig  # noqa: F401

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base":
        importlib.import_module(f"{__name__}.{_module}")  # each declares itself (`@option("model")`)
