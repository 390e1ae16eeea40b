"""`hydra/sweeper=rw` (the default): Hydra's basic grid sweeper, plus three things users need.

1. Every run of the grid is validated before anything is created or launched (`rw_sweeps.sweep`), so a
   bad value is one line and an untouched disk, and validation costs one composition per group choice
   rather than Hydra's one per job.
2. Failed runs never stop the sweep: each job records its own status; at the end one line counts the
   done, skipped, failed and diverged runs, and the sweep exits non-zero if any run failed.
3. The launcher receives the validated plans (`launcher.plans`), which the packed launcher trains directly.
"""

import logging
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

log = logging.getLogger(__name__)


@dataclass
class RwSweeperConf:
    _target_: str = "hydra_plugins.rw_sweeps_plugins.sweeper.RwSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="rw", node=RwSweeperConf, provider="rw_sweeps")


def status_of(ret) -> str:
    """A job's outcome from Hydra's JobReturn: the summary's status, `skipped`, or `failed` on an exception."""
    try:
        s = ret.return_value
    except Exception as exc:  # noqa: BLE001 - the job itself crashed (not the run): count it, go on
        log.error("job failed: %s", exc)
        return "failed"
    if not isinstance(s, dict):
        return "failed"
    return "skipped" if s.get("skipped") else s.get("status", "failed")


class RwSweeper(BasicSweeper):
    def sweep(self, arguments: List[str]) -> Any:
        from rw_sweeps.config import ConfigError
        from rw_sweeps.status import summary_line
        from rw_sweeps.sweep import Planner

        params_conf = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params_conf), self.max_batch_size)
        jobs = [job for batch in self.overrides for job in batch]
        try:
            plans = Planner(self.hydra_context.config_loader, self.config).plan(jobs)
        except Exception as exc:  # noqa: BLE001 - ConfigError, or a composition error of one job
            # SystemExit passes through Hydra's error reporting, which would add a line about HYDRA_FULL_ERROR.
            msg = str(exc).strip().splitlines() if not isinstance(exc, ConfigError) else [str(exc)]
            print(f"error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr, flush=True)
            sys.exit(2)
        self.launcher.plans = {tuple(p.overrides): p.cfg for p in plans}

        sweep_dir = Path(self.config.hydra.sweep.dir)
        if not OmegaConf.select(self.config, "hydra.launcher.dry_run", default=False):
            sweep_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        counts: Counter = Counter()
        returns, idx, detached = [], 0, False
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=idx)
            idx += len(batch)
            if results is None:  # submitted and detached (or a dry run): nothing to count here
                detached = True
                continue
            for r in results:
                st = status_of(r)
                counts[st] += 1
                if st == "failed" and isinstance(getattr(r, "_return_value", None), dict):
                    print(f"failed {r.working_dir}: {r._return_value.get('error')}", file=sys.stderr, flush=True)
            returns.append(results)
        if detached:
            return None
        print(summary_line(str(sweep_dir), counts), flush=True)
        if counts["failed"]:
            sys.exit(1)
        return returns
