"""A Hydra callback that appends every event it sees to a file (jobs may run in other processes)."""
from __future__ import annotations

import json
import os
from typing import Any

from hydra.experimental.callback import Callback


class Record(Callback):
    def __init__(self, path: str, env_key: str = "RW_TEST_ENV") -> None:
        self.path, self.env_key = path, env_key

    def _write(self, **event: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(event) + "\n")

    def on_multirun_start(self, config, **kwargs) -> None:
        self._write(event="multirun_start")

    def on_multirun_end(self, config, **kwargs) -> None:
        self._write(event="multirun_end")

    def on_job_start(self, config, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig

        self._write(event="job_start", num=config.hydra.job.num, p=config.data.p, env=os.environ.get(self.env_key),
                    output_dir=HydraConfig.get().runtime.output_dir)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        value = job_return._return_value
        self._write(event="job_end", num=config.hydra.job.num, status=job_return.status.name,
                    overrides=list(job_return.overrides), working_dir=job_return.working_dir,
                    task_name=job_return.task_name, cfg_p=job_return.cfg.data.p,
                    hydra_num=job_return.hydra_cfg.hydra.job.num,
                    value=value.get("test_acc") if isinstance(value, dict) else str(value))
