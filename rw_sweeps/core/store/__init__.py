"""The sweep store: the runs of a large sweep as a few files per job, not a folder of ten files per run.

A packed job writes its runs' records into `<sweep>/store/` (`writer`): per flush one shard, a sealed head
(the runs table's row, the config, the summary, the overrides of each run) and a body (each run's history
and snapshots as a run folder holds them), plus one checkpoint file while the job trains and its log. Every
reader asks here (`index`): the contract's `judge` judges a run with no folder by its record, so the
launcher's placement and skip, `rw-status`, the analysis and the wandb export agree on a stored run as on a
folder. The README's "Results" says what a store sweep holds and why; `shard` says how a record is verified.
"""
from __future__ import annotations

# A new sweep of this many runs or more is stored (hydra.launcher.store=null): below it a folder per run is at most
# 10,000 files, and each run stays a folder to `ls` and `cat`; at it a store is ~0.01 files a run.
STORE_FROM = 1000

from .. import contract
from .index import STORE, Index, body_rows, has_folder, index, listing, present, sweep_id, sweep_of
from .shard import Refused
from .writer import Writer, earlier_states, remove_orphans, writer_for


def stored_verdict(run_dir):
    """The contract's verdict on a run that no run folder holds (`has_folder`) but its sweep's store does;
    else None."""
    if has_folder(run_dir):
        return None
    where = sweep_of(run_dir)
    if where is None:
        return None
    return index(where[0]).verdict(where[1])


contract.ELSEWHERE.append(stored_verdict)  # `contract.judge` judges a stored run by its record


__all__ = ["STORE", "STORE_FROM", "Index", "Refused", "Writer", "body_rows", "index", "listing", "present", "stored_verdict",
           "sweep_of", "writer_for", "earlier_states", "has_folder", "sweep_id", "remove_orphans"]
