"""Every private Hydra, OmegaConf and submitit name the project relies on (`rw_sweeps/sweeps/hydra_adapter.py`)
still behaves as the project needs: an upgrade that moves or changes one fails here, by name."""
from __future__ import annotations

import importlib
import os
import pickle
from concurrent.futures import Future

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf

import rw_sweeps.core.config  # noqa: F401 - the option schemas, stored in Hydra's ConfigStore as the app stores them
from rw_sweeps.core.errors import ConfigError
from rw_sweeps.sweeps import hydra_adapter as adapter

from .conftest import ROOT


def test_the_basic_sweepers_grid_expansion_is_a_cartesian_product_in_order():
    parser = OverridesParser.create()
    jobs = adapter.split_arguments(parser.parse_overrides(["data.p=0,1", "seed=range(0,2)"]), None)
    assert [j for batch in jobs for j in batch] == [["data.p=0", "seed=0"], ["data.p=0", "seed=1"],
                                                    ["data.p=1", "seed=0"], ["data.p=1", "seed=1"]]
    assert adapter.basic_sweeper().__name__ == "BasicSweeper"


def test_the_command_line_is_read_as_hydra_reads_it_and_help_is_left_to_hydra():
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    try:
        args, hydra, name = adapter.command_line(["-m", "data.p=0,1", "--config-name", "config"],
                                                 str(ROOT / "launch.py"), "conf", "config")
        assert args.multirun and list(args.overrides) == ["data.p=0,1"] and name == "config"
        cfg = hydra.compose_config(config_name=name, overrides=["data.p=0.3"], run_mode=RunMode.RUN,
                                   with_log_configuration=False)
        assert cfg.data.p == 0.3
    finally:
        GlobalHydra.instance().clear()  # as the pre-check does: Hydra's own tests start from a clear one
    assert adapter.command_line(["--help"], str(ROOT / "launch.py"), "conf", "config") is None


def test_a_failed_jobs_value_is_its_exception_without_raising_it():
    ret = JobReturn(overrides=["seed=0"])
    ret.status, ret.return_value = JobStatus.FAILED, ValueError("boom")
    assert isinstance(adapter.job_value(ret), ValueError)
    with pytest.raises(ValueError):
        ret.return_value  # the public property raises: the reason the adapter reads the field


def test_strings_are_quoted_as_omegaconf_quotes_them():
    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(str, adapter.yaml_str_representer())
    doc = {"a": "true", "b": "1", "c": "null", "d": "plain", "e": "0.5"}
    assert yaml.dump(doc, Dumper=Dumper, sort_keys=False) == OmegaConf.to_yaml(OmegaConf.create(doc))


def test_submitits_sbatch_script_and_entry_module_are_where_the_dry_run_looks():
    text = adapter.sbatch_script(command="python -u -m x", folder="/tmp/sub/%j", job_name="rw", time=5,
                                 array_parallelism=2, map_count=3)
    assert "#SBATCH --job-name=rw" in text and "#SBATCH --array=0-2%2" in text
    importlib.import_module(adapter.SUBMITIT_ENTRY)


def test_only_callbacks_with_per_job_hooks_observe_jobs():
    from hydra.experimental.callback import Callback

    class Ends(Callback):
        def on_job_end(self, config, job_return, **kw):
            pass

    class Multirun(Callback):
        def on_multirun_end(self, config, **kw):
            pass

    holder = type("Callbacks", (), {})
    holder.callbacks = [Multirun()]
    assert not adapter.observes_jobs(holder)
    holder.callbacks = [Multirun(), Ends()]
    assert adapter.observes_jobs(holder)


def test_a_job_return_written_later_is_read_once_written_and_pickles_without_its_future():
    written = Future()
    ret = adapter.WrittenLater(overrides=["seed=0"], working_dir="/x")
    ret.written_by(written)
    ret.status, ret.return_value = JobStatus.COMPLETED, 0.5  # what the writer thread sets, then it ends
    written.set_result(None)
    assert ret.status == JobStatus.COMPLETED and ret.return_value == 0.5
    again = pickle.loads(pickle.dumps(ret))
    assert again.return_value == 0.5 and "_written" not in again.__dict__
    broken = adapter.WrittenLater(overrides=[])
    failed = Future()
    broken.written_by(failed)
    failed.set_exception(OSError("disk full"))  # the writing itself broke: the job failed, with why
    assert broken.status == JobStatus.FAILED and isinstance(adapter.job_value(broken), OSError)


def test_a_refusal_reaches_the_front_door_and_other_errors_are_reported_as_hydra_reports_them(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(ConfigError):
        with adapter.errors_reach_caller():
            assert os.environ["HYDRA_FULL_ERROR"] == "1"  # what makes hydra.main re-raise
            raise ConfigError("hydra.launcher.backend", "x", "must be local, local_gpus or slurm")
    assert "HYDRA_FULL_ERROR" not in os.environ
    with pytest.raises(SystemExit) as exited:
        with adapter.errors_reach_caller():
            raise CompactHydraException("a compact error of another kind")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "a compact error of another kind" in err and "HYDRA_FULL_ERROR=1" in err and "Traceback" not in err
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the user's own switch: the whole exception
    with pytest.raises(ZeroDivisionError):
        with adapter.errors_reach_caller():
            1 / 0
    assert os.environ["HYDRA_FULL_ERROR"] == "1"


def test_the_launcher_refuses_bad_keys_with_a_hydra_native_error_not_a_process_exit():
    """Under any Hydra app a refusal is a CompactHydraException (Hydra prints its message); only the front
    door turns it into exit 2."""
    from hydra_plugins.rw_sweeps_plugins.launcher import RwLauncher, RwLauncherConf

    params = OmegaConf.to_container(OmegaConf.structured(RwLauncherConf))
    params.pop("_target_")
    with pytest.raises(ConfigError, match=r"hydra.launcher.backend='gpu_farm': must be local, local_gpus or slurm"):
        RwLauncher(**{**params, "backend": "gpu_farm"}).setup(hydra_context=None, task_function=None, config=None)
    assert issubclass(ConfigError, CompactHydraException)
