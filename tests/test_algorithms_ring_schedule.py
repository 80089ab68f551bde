"""The ring all_reduce's schedule and the operations' scratch buffers.

The all_gather half's receives are posted before the reduce-scatter starts, so no all_gather
segment is ever held as unexpected (copied twice); scratch buffers are reused by a thread's
later operations and dropped after an error."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pydist
from pydist.algorithms.comm import Comm
from pydist.core.deadline import Deadline
from pydist.testing import run_threads
from pydist.transport.matching import Matcher, Unexpected


def _all_reduce_large(rank: int, size: int) -> bool:
    buf = np.full(64 * 1024, float(rank + 1), np.float32)  # 256 KiB: the ring, several segments
    for _ in range(5):
        pydist.all_reduce(buf)
        buf[:] = rank + 1
    pydist.all_reduce(buf)
    return bool(np.all(buf == size * (size + 1) / 2))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_no_all_gather_segment_of_the_ring_arrives_unexpected(size, monkeypatch):
    held: list[int] = []
    arrive = Matcher.arrive

    def recording(self, source, key, nbytes, call=0):
        target = arrive(self, source, key, nbytes, call)
        if isinstance(target, Unexpected) and (key.tag >> 24) >= size:  # all_gather tags start at step n
            held.append(key.tag)
        return target

    monkeypatch.setattr(Matcher, "arrive", recording)
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", str(64 * 1024))
    monkeypatch.setenv("PYDIST_ALGO_ALL_REDUCE", "ring")
    assert run_threads(size, _all_reduce_large, hosts=[f"h{r}" for r in range(size)]) == [True] * size
    assert held == []


def _comm() -> Comm:
    return Comm(transport=None, group_id=1, transport_ranks=[0], rank=0, seq=1,  # type: ignore[arg-type]
                deadline=Deadline.after(1), op_name="test")


def test_scratch_is_reused_per_index_and_thread_and_dropped_after_an_error():
    comm = _comm()
    first = comm.scratch(1000, np.float32, 0)
    assert first.shape == (1000,) and first.dtype == np.float32
    again = comm.scratch(500, np.float64, 0)  # same bytes, another view
    assert np.shares_memory(first, again)
    other = comm.scratch(1000, np.float32, 1)
    assert not np.shares_memory(first, other)
    elsewhere: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: elsewhere.append(_comm().scratch(1000, np.float32, 0)))
    thread.start()
    thread.join()
    assert not np.shares_memory(first, elsewhere[0])
    comm.abandon()  # a late frame may still land in it: never handed out again
    assert not np.shares_memory(first, comm.scratch(1000, np.float32, 0))
