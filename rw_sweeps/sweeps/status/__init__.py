"""Where a sweep stands, in four rooms: the launcher's record (`record`), the scheduler's answers about its
jobs (`scheduler`: SLURM's states, a local process's liveness), every run classified and followed (`sweep`),
and the command `python -m rw_sweeps.sweeps.status SWEEP_DIR [--wait]` / `rw-status` (`cli`). The names
below are what the launchers, the lock, sync and the tests import from here."""
from rw_sweeps.core.console import shown  # noqa: F401 - imported from here too (lock, sync)

from .cli import is_run_folder, main, run_status  # noqa: F401
from .record import RECORD_FIELDS, STATE, check_record, fingerprint, new_record, read_record, write_record  # noqa: F401
from .scheduler import (PENDING, PID_MAX, RUNNING, alive, expand_ids, is_pid, is_start, job_states,  # noqa: F401
                        parse_states, process_start, slurm_states)
from .sweep import COPY, DONE_WITH, FINAL, GRACE_S, UNFINISHED, Snapshot, Sweep, summary_line  # noqa: F401
