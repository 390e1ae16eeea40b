"""The data families, one module each. A module declares its family with `@option("data")` on its schema
(a subclass of `config.DataConfig` holding only the family's own keys, each default written once, with its
comment), and the class is the family: its validation, its Π or law, its sampler and its Bayes optimum,
the keys its summary echoes (`ECHO`) and Theorem 4.1's trap where it has one (`is_trap`). A family needs a
sampler (`draw`, or a first-order `transition` that the default draw samples) and offers target=all only with
the law at every position (`laws`, or that `transition`): `DataConfig.registered` refuses, when the module is
imported, a family that lacks them, in one line. `conf/data/<name>.yaml` names the schema in its defaults.
Every module in this folder is imported here, so that a new family is its module and its YAML file."""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
