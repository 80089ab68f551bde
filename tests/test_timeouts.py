"""Timeouts that explain: the error names the operation, its sequence number, the rank
waited for and the ranks that never reached the operation (from the progress every rank
publishes in the store). monitored_barrier names the ranks that did not arrive. Receives
that time out, and Work.wait(timeout=...) expiring, raise a DistBackendError naming the peer."""
from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

import pydist
import pydist as dist
from misuse_support import misuse, run2, transport  # noqa: F401 - transport is a fixture
from pydist.testing import run_processes, run_threads
from pydist.testing.threads import RankFailed

HOSTS = ["a", "b", "c", "d"]


def _ranks_2_and_3_stall(rank: int, size: int) -> None:
    t = np.ones(8, np.float32)
    pydist.all_reduce(t)
    if rank in (2, 3):
        time.sleep(4)
        return
    pydist.all_reduce(t)


def test_a_timeout_names_the_ranks_that_never_reached_the_operation():
    with pytest.raises(RankFailed) as failed:
        run_threads(4, _ranks_2_and_3_stall, transport="tcp", hosts=HOSTS, pg_timeout=2, timeout=60)
    error = failed.value.__cause__
    assert isinstance(error, pydist.OpTimeoutError)
    text = str(failed.value)
    assert "all_reduce (seq 2) on rank 0 timed out after 2 s waiting for rank" in text
    assert "ranks that never reached it: 2 (last started all_reduce, seq 1), 3 (last started all_reduce, seq 1)" \
        in text


def _stall_then_barrier(rank: int, size: int, late: list[int], wait_all: bool) -> str:
    if rank in late:
        time.sleep(2.5)
    try:
        pydist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=wait_all)
    except pydist.DistBackendError as error:
        return str(error)
    return "ok"


def test_monitored_barrier_passes_when_everyone_arrives():
    assert run_threads(3, _stall_then_barrier, [], False, transport="tcp", hosts=HOSTS[:3]) == ["ok"] * 3


@pytest.mark.parametrize("wait_all, expected", [(False, "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1 s"),
                                                (True, "[Rank 0]: Ranks 2, 3 failed to pass monitoredBarrier in 1 s")])
def test_monitored_barrier_names_the_missing_ranks(wait_all, expected):
    results = run_threads(4, _stall_then_barrier, [2, 3], wait_all, transport="tcp", hosts=HOSTS, timeout=60)
    assert results[0] == expected, results
    assert all("got no answer from rank 0" in r for r in results[1:]), results


def _behind(rank: int, size: int) -> str:
    t = np.ones(4, np.float32)
    if rank != 1:
        try:
            pydist.barrier()
            pydist.all_reduce(t)
        except pydist.DistBackendError as error:
            return str(error)
    else:
        time.sleep(3)
    return "ok"


def test_processes_over_shared_memory_explain_too():
    results = run_processes(3, _behind, timeout=60, pg_timeout=1.5)
    assert "ranks that never reached it: 1 (no operation on this group yet)" in results[0], results


# -- p2p and collective timeouts, Work.wait(timeout=...) (formerly in test_errors.py) --------

def _check_timeouts(observed: dict, short: float) -> None:
    recv = observed["recv"]
    assert recv["error"] == "DistBackendError", recv
    assert "recv" in recv["message"] and "rank 1" in recv["message"], recv
    assert short * 0.9 <= recv["seconds"] < short + 5, recv
    wait = observed["wait"]
    assert wait["error"] == "DistBackendError" and wait["seconds"] < short * 0.9, wait
    assert "recv" in wait["message"] and "rank 1" in wait["message"], wait
    assert observed["wait_completed"] is False
    assert observed["wait_timedelta"]["error"] == "DistBackendError", observed["wait_timedelta"]
    anyone = observed["any_source"]
    assert anyone["error"] == "DistBackendError" and "any" in anyone["message"], anyone


def test_recv_timeout_threads(transport):
    results = run_threads(2, misuse.recv_times_out, 1.0, transport=transport, timeout=60)
    _check_timeouts(results[0], 1.0)


def test_recv_timeout_processes():
    results = run_processes(2, misuse.recv_times_out, 1.0, init="file", timeout=60)
    _check_timeouts(results[0], 1.0)


def test_collective_timeout_names_op_and_rank(transport):
    results = run_threads(2, misuse.collective_times_out, 1.0, transport=transport, timeout=60)
    error = results[0]["all_reduce"]
    assert error["error"] == "OpTimeoutError" and 0.9 <= error["seconds"] < 6, error  # a DistBackendError
    assert "all_reduce" in error["message"] and "rank 1" in error["message"], error
    assert "ranks that never reached it: 1 (" in error["message"], error


def test_work_wait_timeout_on_async_collective(transport):
    """Work.wait(timeout=...) on an all_reduce that rank 1 has not joined yet raises;
    once rank 1 joins, the operation completes."""

    def fn(rank, size):
        tensor = np.ones(2) * (rank + 1)
        if rank == 0:
            work = dist.all_reduce(tensor, async_op=True)
            start = time.monotonic()
            with pytest.raises(dist.DistBackendError, match="all_reduce"):
                work.wait(timeout=timedelta(milliseconds=100))
            assert time.monotonic() - start < 1.0
            dist.send(np.ones(1), dst=1)  # now let rank 1 join
            work.wait()
        else:
            dist.recv(np.zeros(1), src=0)
            dist.all_reduce(tensor)
        return tensor.tolist()

    assert run2(fn, transport) == [[3.0, 3.0], [3.0, 3.0]]
