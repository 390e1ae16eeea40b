"""What Hydra's `run_job` does for one job, for many jobs trained together.

Packing replaces only the *call* of the task function. Around it every run keeps its Hydra job:
its folder; `.hydra/config.yaml`, `hydra.yaml` and `overrides.yaml` as Hydra writes them; its
`<job name>.log`; `hydra.job.env_set` (process-wide, so one chunk shares one env_set); `on_job_start` before
training and `on_job_end` after, with a real `JobReturn` (cfg, hydra_cfg, overrides, return value or the
run's exception, status, task name, working dir).

Cost per run is microseconds to a millisecond: the `.hydra/` files are written from plain dicts with
libyaml, and the DictConfigs a user could look at (the callbacks' `config`, `HydraConfig`, a JobReturn's
`cfg`/`hydra_cfg`) are built only when someone looks: always when callbacks are configured, else on first
access of a JobReturn's field (~10 ms each; Hydra's own per-job cost is ~100 ms).
"""
from __future__ import annotations

import copy
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, env_override

from rw_sweeps.core.safefs import append_text, atomic_write as _write, ensure_dir, hold
from rw_sweeps.core import signals

from . import writer
from .packing import env_set_of, writes_behind
from .hydra_adapter import WrittenLater, observes_jobs, yaml_str_representer
from .planner import Spec, replaced
from rw_sweeps.core.yamltext import Templates

class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
    """libyaml with OmegaConf's rule for strings (quote what would read back as a bool or a number)."""


_Dumper.add_representer(str, yaml_str_representer())


_OPTIONS = dict(default_flow_style=False, allow_unicode=True, sort_keys=False)  # OmegaConf.to_yaml's


def to_yaml(node: Any) -> str:
    """The text `OmegaConf.to_yaml` writes for plain data (same options and quoting), ~10× faster."""
    return yaml.dump(node, Dumper=_Dumper, **_OPTIONS)


class YamlTemplates:
    """The YAML text of a job's dict, given as its composition's dict and the job's own changes (dotted
    keys): byte for byte `to_yaml(job's dict)`, with each shape of a grid's documents dumped once
    (`rw_sweeps.core.yamltext`; PyYAML's Python representer and serialiser are most of the cost of writing)."""

    def __init__(self) -> None:
        self._of: dict[tuple, tuple[dict, Templates]] = {}  # (id(base), wrap) → (base, templates): keeps base alive

    def text(self, base: dict, changes: dict, wrap: Optional[str] = None) -> str:
        key = (id(base), wrap)
        if key not in self._of:
            self._of[key] = (base, Templates(to_yaml))
        doc = {wrap: base} if wrap else base
        for dotted, value in changes.items():
            doc = replaced(doc, ([wrap] if wrap else []) + dotted.split("."), value)
        return self._of[key][1].text(doc)

    def text_list(self, items: list) -> str:
        if ("list", None) not in self._of:
            self._of[("list", None)] = ({}, Templates(to_yaml))
        return self._of[("list", None)][1].text_list(items)


class LazyJobReturn(WrittenLater):
    """A JobReturn whose `cfg` and `hydra_cfg` DictConfigs are built on first access, from the job's
    plain-data spec, and whose status and return value, when its chunk's results are written on the writer
    thread, are read once written (`WrittenLater`); to its reader it is the JobReturn Hydra's own launchers give."""

    def __init__(self, spec: Spec, **kwargs: Any) -> None:
        self._spec = spec
        self._built: dict = {}
        super().__init__(**kwargs)

    def _get(self, which: str) -> Optional[DictConfig]:
        if self._built.get(which) is None and getattr(self, "_spec", None) is not None:
            node = self._spec.task if which == "cfg" else {"hydra": self._spec.hydra}
            self._built[which] = OmegaConf.create(copy.deepcopy(node))
        return self._built.get(which)

    cfg = property(lambda self: self._get("cfg"), lambda self, v: _set(self, "cfg", v))  # type: ignore
    hydra_cfg = property(lambda self: self._get("hydra_cfg"), lambda self, v: _set(self, "hydra_cfg", v))  # type: ignore


def _set(ret: LazyJobReturn, which: str, value: Any) -> None:
    if value is not None:  # JobReturn.__init__ assigns None: keep building lazily
        ret.__dict__.setdefault("_built", {})[which] = value


def _formatters(hydra: dict) -> tuple[Optional[logging.Formatter], Optional[logging.Formatter]]:
    """The console and file formatters of the job's `hydra.job_logging` (what run_job would configure)."""
    jl = hydra.get("job_logging") or {}
    fmts = {name: logging.Formatter(f.get("format"), f.get("datefmt")) for name, f in (jl.get("formatters") or {}).items()}
    console = file = None
    for h in (jl.get("handlers") or {}).values():
        cls = str(h.get("class", ""))
        fmt = fmts.get(h.get("formatter"), logging.Formatter())
        if cls.endswith("FileHandler"):
            file = fmt
        elif cls.endswith("StreamHandler"):
            console = fmt
    return console, file


@dataclass
class Chunk:
    """Runs of one shape and one env_set, trained by `batch` (the project's batched twin) in one call."""
    specs: list[Spec]
    batch: Callable
    hydra_context: Any = None
    task_function: Any = None
    planner: Any = None  # builds the DictConfigs callbacks receive
    lean: bool = False  # skip each run's hydra.yaml and log (documented switch for huge grids)
    job_id: Optional[str] = None  # the scheduler's job id (SLURM), else each run's job number
    finished: bool = False  # runs already done: their Hydra job without training, and nothing written
    write_behind: Optional[bool] = None  # its results written while the next chunk trains (`packing.writes_behind`)
    said_after: Optional[str] = None  # a line said once the chunk's results are written ("8 of 12 runs finished")
    stored: bool = False  # its runs' records go to the sweep's store (`rw_sweeps.core.store`), not run folders

    def __call__(self) -> list[JobReturn]:
        specs = self.specs
        if specs[0].sweep_dir:  # in this process too (a submitit or SLURM job), through the sweep's handle
            hold(specs[0].sweep_dir, anew=False)  # the launch's folder, wherever it is now
        callbacks = self.hydra_context.callbacks if self.hydra_context is not None else None
        observed = callbacks is not None and observes_jobs(callbacks)
        console, file_fmt = _formatters(specs[0].base_hydra)
        yaml_of = YamlTemplates()
        env = dict(env_set_of(specs[0]))
        configs: list[Optional[DictConfig]] = [None] * len(specs)
        for s in specs:
            if self.job_id is not None:
                s.set_hydra("job.id", self.job_id)
        results: list = [None] * len(specs)
        job = self._store_writer() if self.stored and not self.finished else None
        # Unobserved, the chunk's files are written on the writer thread (`rw_sweeps.sweeps.writer`): its
        # `.hydra/` files while it trains (a chunk of 4,096 runs writes 12,288 of them), its results while the
        # next chunk trains. Its folders are made first, so a folder that cannot be made fails its run before
        # anything trains, as its own job would. (Writing reads no environment variable: hydra.job.env_set,
        # process-wide, holds for the training.)
        deferred = not observed and not self.finished and len(specs) > 1 and job is None
        behind = deferred and specs[0].cfg is not None and writes_behind(self.write_behind, specs[0].cfg)
        returns = [LazyJobReturn(s, overrides=list(s.overrides), working_dir=s.output_dir, task_name=s.name)
                   for s in specs]
        with env_override(env):
            started = []
            for i, s in enumerate(specs):
                try:  # a run whose folder cannot be written fails alone, as its own job would
                    if not self.finished and job is None:
                        self._folders(s)
                        if not deferred:
                            self._files(s, yaml_of)
                except Exception as exc:  # noqa: BLE001
                    results[i] = _failed(s, exc)
                    continue
                if observed:
                    configs[i] = self.planner.config(s)
                    with _job_context(configs[i], s):
                        callbacks.on_job_start(config=configs[i], task_function=self.task_function)
                started.append(i)
            todo = [specs[i] for i in started]
            envelopes = writer.submit(lambda: self._envelopes(todo, yaml_of)) if deferred and todo else None
            trained = self.batch(todo) if todo else None

        def finish() -> None:
            """The chunk's results written; each job's return, log lines and on_job_end."""
            try:
                for i, res in zip(started, trained.write() if trained is not None else []):
                    results[i] = res
                for k, exc in (envelopes.result() if envelopes is not None else {}).items():
                    results[started[k]] = _failed(specs[started[k]], exc)
            except Exception as exc:  # noqa: BLE001 - its runs fail, never the chunk trained next
                for i in started:
                    if results[i] is None:
                        results[i] = (exc, [f"failed: {specs[i].output_dir}: writing the results: {exc}"])
            for i, (s, ret, (value, lines)) in enumerate(zip(specs, returns, results)):
                ret.status = JobStatus.FAILED if isinstance(value, BaseException) else JobStatus.COMPLETED
                ret.return_value = value
                try:
                    self._log(s, lines, console, file_fmt)
                except OSError:
                    pass  # the run's own error says why its folder is unusable
                if observed and configs[i] is not None:
                    ret.cfg = _task_part(configs[i])
                    ret.hydra_cfg = _hydra_part(configs[i])
                    with _job_context(configs[i], s):
                        callbacks.on_job_end(config=configs[i], job_return=ret)
            if job is not None:
                job.close()
            if self.said_after:
                say(self.said_after)

        # A signal from here on (or one the training loop handed back after its last step) is raised once
        # the chunk's results are written or handed to the writer: nothing finished is lost.
        with signals.deferred():
            if behind:
                written = writer.submit(finish, results=True)
                for ret in returns:
                    ret.written_by(written)
            else:
                finish()
        return returns

    def _store_writer(self):
        """The job's writer of the sweep's store, which keeps the job's Hydra config with its records."""
        from rw_sweeps.core.store import Writer  # the store (pyarrow): only a job that writes one

        s0 = self.specs[0]
        root = os.path.abspath(s0.sweep_dir)
        names = {os.path.relpath(os.path.abspath(s.output_dir), root).replace(os.sep, "/"): list(s.overrides)
                 for s in self.specs}
        # the job's hydra.yaml goes into each of its heads' metadata (`rw-show --file hydra.yaml`), not a file
        hydra = None if self.lean or s0.base_hydra.get("output_subdir") is None else \
            YamlTemplates().text(s0.base_hydra, s0.hydra_changes, wrap="hydra")
        return Writer(root, list(names), overrides=names, hydra=hydra)

    def _envelopes(self, specs: list, yaml_of: YamlTemplates) -> dict[int, BaseException]:
        """The `.hydra/` files of these runs; the errors, by index (that run fails alone)."""
        errors = {}
        for k, s in enumerate(specs):
            try:
                self._files(s, yaml_of)
            except Exception as exc:  # noqa: BLE001
                errors[k] = exc
        return errors

    def _folders(self, s: Spec) -> None:
        """The job's folder and its `.hydra/`, as run_job makes them (a folder planted as a link fails it)."""
        out = ensure_dir(Path(s.output_dir))
        sub = s.base_hydra.get("output_subdir")
        if sub is not None:
            ensure_dir(out / sub)

    def _files(self, s: Spec, yaml_of: YamlTemplates) -> None:
        """The job's `.hydra/` files, as run_job writes them."""
        sub = s.base_hydra.get("output_subdir")
        if sub is None:
            return
        out = Path(s.output_dir)
        task = yaml_of.text(s.base_task, s.task_changes) if s.base_task is not None else to_yaml(s.task)
        _write(out / sub / "config.yaml", task)
        if not self.lean:
            _write(out / sub / "hydra.yaml", yaml_of.text(s.base_hydra, s.hydra_changes, wrap="hydra"))
        _write(out / sub / "overrides.yaml", yaml_of.text_list(list(s.overrides)))

    def _log(self, s: Spec, lines: Sequence[str], console, file_fmt) -> None:
        if console is not None:
            for line in lines:
                say(console.format(_record(line)))
        # a stored run has no folder for its log: its line is its summary's (`rw-show`), said on the console
        if file_fmt is not None and not self.lean and not self.finished and not self.stored:
            text = "".join(file_fmt.format(_record(line)) + "\n" for line in lines)
            append_text(Path(s.output_dir) / f"{s.name}.log", text)


def _failed(s: Spec, exc: BaseException) -> tuple:
    """A run that failed around its training (its folder, its `.hydra/` files): the job's value and line."""
    return exc, [f"failed: {s.output_dir}: {type(exc).__name__}: {exc}"]


def say(line: str) -> None:
    """A line on stdout, from any thread: above a progress bar that is drawn, not through it."""
    # tqdm: only once a line is said; the launcher plugin imports this module, and Hydra imports the plugins
    # at every start-up (--help included)
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def _record(msg: str) -> logging.LogRecord:
    rec = logging.LogRecord("rw_sweeps.sweeps.app", logging.INFO, __file__, 0, msg, None, None)
    rec.created = time.time()
    return rec


def _task_part(cfg: DictConfig) -> DictConfig:
    out = copy.deepcopy(cfg)
    OmegaConf.set_readonly(out, False)
    OmegaConf.set_struct(out, False)
    out.pop("hydra", None)
    return out


def _hydra_part(cfg: DictConfig) -> DictConfig:
    return copy.deepcopy(OmegaConf.masked_copy(cfg, "hydra"))


class _job_context:
    """HydraConfig (so `${hydra:...}` and HydraConfig.get() work in callbacks) and the job's cwd when
    hydra.job.chdir, as run_job has them around on_job_start and on_job_end."""

    def __init__(self, config: DictConfig, spec: Spec):
        self.config, self.spec = config, spec

    def __enter__(self):
        self.old_hydra, self.old_cwd = HydraConfig.instance().cfg, os.getcwd()
        HydraConfig.instance().set_config(self.config)
        if self.spec.base_hydra["job"].get("chdir"):
            os.chdir(self.spec.output_dir)

    def __exit__(self, *exc):
        HydraConfig.instance().cfg = self.old_hydra
        os.chdir(self.old_cwd)
