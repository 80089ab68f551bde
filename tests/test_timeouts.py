"""Timeouts that explain: the error names the operation, its sequence number, the rank
waited for and the ranks that never reached the operation (from the progress every rank
publishes in the store). monitored_barrier names the ranks that did not arrive."""
from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

import pydist
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
