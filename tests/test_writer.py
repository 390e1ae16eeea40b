"""Writing behind: a packed chunk's results are written on the writer thread while the next chunk trains;
its JobReturns are read once written, memory holds at most one chunk waiting, and a failed write fails
its own run only."""
from __future__ import annotations

import pickle
import threading
import time

from hydra.core.utils import JobStatus

from rw_sweeps.sweeps import packing, writer
from rw_sweeps.sweeps.hydra_job import Chunk
from rw_sweeps.sweeps.planner import Spec
from rw_sweeps.sweeps.run import Pending
from rw_sweeps.core.config import RunConfig, validate


def _specs(tmp_path, n: int) -> list[Spec]:
    cfg = validate(RunConfig())
    return [Spec(i, [f"seed={i}"], {}, {}, {"job": {"name": "rw"}, "output_subdir": None},
                 output_dir=str(tmp_path / str(i)), cfg=cfg) for i in range(n)]


def _gated_batch(gate: threading.Event, fail: set = frozenset()):
    """A batched twin whose results are written only once `gate` is set; the runs in `fail` fail to write."""
    def batch(specs):
        def write():
            gate.wait(60)
            return [(RuntimeError("disk full") if s.num in fail else {"status": "done", "num": s.num},
                     [f"done: {s.num}"]) for s in specs]
        return Pending(write)
    return batch


def test_a_chunk_written_behind_returns_at_once_and_its_returns_wait_for_the_writes(tmp_path):
    gate = threading.Event()
    returns = Chunk(_specs(tmp_path, 3), _gated_batch(gate, fail={1}), write_behind=True)()
    assert len(returns) == 3  # returned while its results are still being written
    seen = {}
    reader = threading.Thread(target=lambda: seen.update(status=returns[0].status))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not seen  # a status is not read before it is written
    gate.set()
    reader.join(60)
    assert seen["status"] == JobStatus.COMPLETED and returns[0].return_value == {"status": "done", "num": 0}
    assert returns[1].status == JobStatus.FAILED and str(returns[1]._return_value) == "disk full"
    assert returns[2].status == JobStatus.COMPLETED
    copy = pickle.loads(pickle.dumps(returns[2]))  # a submitit job's result: pickled once written
    assert copy.status == JobStatus.COMPLETED and copy.return_value == {"status": "done", "num": 2}


def test_a_chunk_written_in_turn_is_written_before_it_returns(tmp_path):
    gate = threading.Event()
    gate.set()
    returns = Chunk(_specs(tmp_path, 2), _gated_batch(gate), write_behind=False)()
    assert "_written" not in returns[0].__dict__ and returns[1].status == JobStatus.COMPLETED


def test_at_most_one_chunks_results_wait_to_be_written():
    """Handing over chunk k+1's results waits until chunk k's are written: memory holds two chunks at most."""
    gate, order = threading.Event(), []
    writer.submit(lambda: (gate.wait(60), order.append("k written")), results=True)
    handed = threading.Thread(target=lambda: (writer.submit(lambda: order.append("k+1 written"), results=True),
                                              order.append("k+1 handed over")))
    handed.start()
    handed.join(0.2)
    assert handed.is_alive() and order == []  # k+1 waits while k is not written
    gate.set()
    handed.join(60)
    writer.flush()
    assert order[0] == "k written" and sorted(order[1:]) == ["k+1 handed over", "k+1 written"]


def test_small_writes_never_wait_for_a_chunks_results():
    gate = threading.Event()
    writer.submit(lambda: gate.wait(60), results=True)
    t = time.monotonic()
    fut = writer.submit(lambda: "envelopes")  # queued behind it, handed over at once
    assert time.monotonic() - t < 30 and not fut.done()
    gate.set()
    assert fut.result(60) == "envelopes"


def test_writing_behind_is_used_on_a_gpu_and_where_the_key_says(monkeypatch):
    from rw_sweeps.core import resources

    cfg = validate(RunConfig(device="cpu"))
    assert packing.writes_behind(True, cfg) and not packing.writes_behind(False, cfg)  # the key decides when set
    assert not packing.writes_behind(None, cfg)  # on a CPU the training uses the writer's cores
    monkeypatch.setattr(resources, "resolve_device", lambda device: "cuda:0")  # as where a GPU is visible
    assert packing.writes_behind(None, validate(RunConfig(device="cpu")))
