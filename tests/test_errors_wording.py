"""Errors worded so that code written against gloo, and torch's own tests, recognise them.

torch's suite matches a timeout with ``" (Timed out|closed|timeout) "`` and gloo's
"Timed out waiting <N>ms"; a peer that went away with gloo's "Connection closed by peer";
monitored_barrier with gloo's "failed to pass monitoredBarrier", "timed out in
monitoredBarrier" and "successfully reached monitoredBarrier, but received errors while
waiting for send/recv from rank 0" (torch/testing/_internal/distributed/distributed_test.py).
pydist's own account (operation, sequence number, rank and host waited for) stays around them.
"""
from __future__ import annotations

import re
import threading
from datetime import timedelta

import numpy as np
import pytest

import pydist
from pydist.testing import run_threads

#: What torch's test_barrier_timeout_* accept from a timed-out barrier.
TORCH_TIMEOUT = re.compile(" (Timed out|closed|timeout) ")
TWO_HOSTS = ["a", "b"]


def _barrier_without_rank_1(rank: int, size: int, rank0_done: threading.Event) -> str:
    """Rank 1 comes to the barrier only once rank 0 has timed out in it."""
    if rank == 1:
        assert rank0_done.wait(60), "rank 0 never left the barrier"
        return "away"
    try:
        pydist.barrier()
    except pydist.DistBackendError as error:
        return str(error)
    finally:
        rank0_done.set()
    return "passed"


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [TWO_HOSTS, None], ids=["tcp", "shared-memory"])
def test_a_barrier_timeout_reads_as_gloo_s(hosts):
    error, _ = run_threads(2, _barrier_without_rank_1, threading.Event(), transport="tcp", hosts=hosts,
                           pg_timeout=1, timeout=60)
    assert TORCH_TIMEOUT.search(error), error
    assert error.startswith("barrier (seq 1) on rank 0: Timed out waiting 1000ms for rank 1 ("), error


def _recv_from_silent_rank_1(rank: int, size: int, rank0_done: threading.Event) -> str:
    """Rank 1 sends nothing, and leaves only once rank 0 has timed out."""
    if rank == 1:
        assert rank0_done.wait(60)
        return "silent"
    work = pydist.irecv(np.zeros(2), src=1)
    assert work is not None
    try:
        work.wait()
    except pydist.DistBackendError as error:
        return str(error)
    finally:
        rank0_done.set()
    return "received"


def test_a_receive_timeout_reads_as_gloo_s():
    error, _ = run_threads(2, _recv_from_silent_rank_1, threading.Event(), transport="tcp", hosts=TWO_HOSTS,
                           pg_timeout=0.3, timeout=60)
    assert error == "recv from rank 1 (tag 0): Timed out waiting 300ms for rank 1", error


def _recv_after_rank_1_left(rank: int, size: int) -> str:
    pydist.barrier()
    if rank == 1:
        pydist.destroy_process_group()
        pydist.init_process_group(store=pydist.HashStore(), rank=0, world_size=1)  # the harness destroys it
        return "left"
    try:
        pydist.recv(np.zeros(2), src=1)
    except pydist.DistError as error:
        return str(error)
    return "received"


def test_a_peer_that_left_reads_as_a_closed_connection():
    error, _ = run_threads(2, _recv_after_rank_1_left, transport="tcp", hosts=TWO_HOSTS, timeout=60)
    assert "rank 1 on localhost (127.0.0.1, lo) has shut down its process group" in error, error
    assert error.endswith(": Connection closed by peer"), error
    assert TORCH_TIMEOUT.search(error), error


def _monitored_barrier_without_rank_1(rank: int, size: int, seconds: float, left: threading.Event) -> str:
    """Rank 1 stays away from monitored_barrier until rank 0 has left it."""
    if rank == 1:
        assert left.wait(60)
        return "away"
    try:
        pydist.monitored_barrier(timeout=timedelta(seconds=seconds))
    except pydist.DistBackendError as error:
        return str(error)
    finally:
        if rank == 0:
            left.set()
    return "passed"


def test_monitored_barrier_out_of_time_reads_as_gloo_s():
    """torch's test_monitored_barrier_gloo_rank_0_timeout: a zero timeout on rank 0."""
    error, _ = run_threads(2, _monitored_barrier_without_rank_1, 0, threading.Event(), transport="tcp",
                           hosts=TWO_HOSTS, timeout=60)
    assert error.startswith("Rank 0 timed out in monitoredBarrier after 0 ms"), error


def test_monitored_barrier_failures_read_as_gloo_s():
    """Rank 0 names the rank that did not come (rank 2 is told rank 0 gave up), as gloo does."""
    results = run_threads(3, _monitored_barrier_without_rank_1, 0.5, threading.Event(), transport="tcp",
                          hosts=["a", "b", "c"], timeout=60)
    assert results[0] == "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 500 ms", results
    assert results[2].startswith("Rank 2 successfully reached monitoredBarrier, but received errors while waiting "
                                 "for send/recv from rank 0"), results
