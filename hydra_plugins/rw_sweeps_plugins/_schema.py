"""The rw launcher's schema: every `hydra.launcher.*` key of `hydra/launcher=rw` (conf/hydra/launcher/*.yaml,
the presets, hold only their deltas), its registration in Hydra's ConfigStore, and the checks of the values
that become lines of a generated sbatch script. A bad value is refused in one line naming the key.

A module of `launcher.py`'s, named with `_` so that Hydra's plugin scan leaves it alone: the scan executes
every other module of the package again, and the classes here must stay the ones their users hold."""
# No `from __future__ import annotations`: Hydra imports plugins outside sys.modules (dataclasses break).
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from rw_sweeps.core.errors import ConfigError


@dataclass
class RwLauncherConf:
    """The schema of every rw preset; the preset files hold only their deltas."""
    _target_: str = "hydra_plugins.rw_sweeps_plugins.launcher.RwLauncher"
    backend: str = "local"  # local | local_gpus | slurm
    pack: bool = True  # many same-shape runs per job, trained as one batched program (project's task only)
    memory_gb: Optional[float] = None  # packed: a chunk's memory budget (null: 2 GB on a CPU, a GPU's free memory)
    max_runs_per_job: Optional[int] = None  # packed: cap on runs per chunk (null: by memory only)
    write_behind: Optional[bool] = None  # packed: write a chunk's results while the next trains (null: on a GPU only)
    lean: bool = False  # packed: skip each run's .hydra/hydra.yaml and <job>.log (grids of 100k runs)
    store: Optional[bool] = None  # packed: runs as records in <sweep>/store/, not run folders (null: a new sweep of 1,000+ runs, or one that has a store)
    wait_for_lock: bool = False  # another launch holds the sweep folder: wait for it (else: refuse, one line)
    overwrite: bool = False  # train over run folders that hold a run of another config (else: refuse, one line)
    # the outcomes a relaunch trains again: a failed run's cause may be the place it ran (a full disk, a killed
    # job); a diverged run diverges again, so it is kept unless named here (e.g. [failed,diverged])
    retry: List[str] = field(default_factory=lambda: ["failed"])
    detach: bool = False  # slurm: submit, print the job ids and return
    dry_run: bool = False  # print the plan (slurm: the sbatch scripts) and stop: nothing written or submitted
    poll_s: float = 5.0  # slurm, blocking: seconds between questions to SLURM while waiting
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # SLURM: the names and meanings of hydra-submitit-launcher 1.2.0's `submitit_slurm`
    timeout_min: int = 60  # --time; a job at its limit is requeued (max_num_timeout times) and resumes
    cpus_per_task: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tasks_per_node: int = 1
    mem_gb: Optional[float] = None  # --mem in GB
    nodes: int = 1
    name: str = "${hydra.job.name}"
    stderr_to_stdout: bool = False
    partition: Optional[str] = None  # null: the cluster's default partition
    qos: Optional[str] = None
    comment: Optional[str] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    gres: Optional[str] = None  # or gpus_per_node (set one, not both)
    cpus_per_gpu: Optional[int] = None
    gpus_per_task: Optional[int] = None
    mem_per_gpu: Optional[str] = None
    mem_per_cpu: Optional[str] = None
    account: Optional[str] = None
    signal_delay_s: int = 60  # --signal=USR2@N: submitit requeues the job N s before its time limit
    max_num_timeout: int = 3  # requeues after a time limit (preemptions are always requeued)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option
    array_parallelism: int = 256  # --array=0-(n-1)%N: at most N jobs of an array run at once
    max_array_size: Optional[int] = None  # null: the cluster's MaxArraySize; larger grids become several arrays
    setup: List[str] = field(default_factory=list)  # shell lines before the job (module load, venv…)
    srun_args: Optional[List[str]] = None  # extra arguments of the srun that starts the job


def register() -> None:
    """`hydra/launcher=rw` in Hydra's ConfigStore (called by `launcher.py`, which each plugin scan executes)."""
    ConfigStore.instance().store(group="hydra/launcher", name="rw", node=RwLauncherConf, provider="rw_sweeps")


SLURM_KEYS = ("partition", "account", "qos", "comment", "constraint", "exclude", "cpus_per_task", "gpus_per_node",
              "gres", "cpus_per_gpu", "gpus_per_task", "mem_per_gpu", "mem_per_cpu", "nodes", "stderr_to_stdout",
              "srun_args")


# Values that become `#SBATCH` lines or shell lines of the job script. A newline would start a line of its
# own (a command), and shlex.quote does not neutralise it there: control characters are refused everywhere,
# and scheduler names get the character set SLURM itself uses.
NAME_KEYS = ("partition", "account", "qos", "name", "gres", "constraint", "exclude", "mem_per_gpu", "mem_per_cpu")
SAFE_NAME = re.compile(r"[A-Za-z0-9_.,:=+@%/\-\[\]|&*!()]+")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_script_values(p: Dict[str, Any]) -> None:
    """One line and exit 2 for any value that could smuggle a command into a generated sbatch script."""
    for key in NAME_KEYS:
        v = p.get(key)
        if v is not None and not SAFE_NAME.fullmatch(str(v)):
            refuse(key, v, "may only hold letters, digits and _.,:=+@%/-[]|&*!() (it becomes an #SBATCH line)")
    values = [(k, v) for k, v in p.items() if k not in NAME_KEYS and k != "additional_parameters"]
    values += [(f"additional_parameters.{k}", v) for k, v in (p.get("additional_parameters") or {}).items()]
    values += [(f"additional_parameters.{k}", k) for k in (p.get("additional_parameters") or {})]
    for key, v in values:
        for item in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(item, str) and CONTROL.search(item):
                refuse(key, item, "must not contain control characters such as newlines (each would become a "
                       "line of the job script)")


def refuse(key: str, value: Any, allowed: str) -> None:
    """Refused before anything is launched: one line (Hydra prints it as its own; the front door exits 2)."""
    raise ConfigError(f"hydra.launcher.{key}", value, allowed)
