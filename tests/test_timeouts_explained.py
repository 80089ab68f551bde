"""Timeouts that explain: the error names the operation, its sequence number, the rank
waited for and the ranks that never reached the operation (from the progress every rank
publishes in the store). monitored_barrier names the ranks that did not arrive. Receives
that time out, and Work.wait(timeout=...) expiring, raise a DistBackendError naming the peer."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import numpy as np
import pytest
from misuse_support import misuse, run2, transport  # noqa: F401 - transport is a fixture

import pydist
import pydist as dist
from pydist.testing import run_processes, run_threads
from pydist.testing.clock import MockClock
from pydist.testing.threads import RankFailed

HOSTS = ["a", "b", "c", "d"]


def _ranks_2_and_3_stall(rank: int, size: int, timed_out: threading.Barrier) -> None:
    """Ranks 2 and 3 stay away from the second all_reduce until ranks 0 and 1 have timed out
    in it (all four meet at ``timed_out``)."""
    t = np.ones(8, np.float32)
    pydist.all_reduce(t)
    if rank in (2, 3):
        timed_out.wait()
        return
    try:
        pydist.all_reduce(t)
    finally:
        timed_out.wait()


@pytest.mark.slow
def test_a_timeout_names_the_ranks_that_never_reached_the_operation():
    timed_out = threading.Barrier(4, timeout=60)
    with pytest.raises(RankFailed) as failed:
        run_threads(4, _ranks_2_and_3_stall, timed_out, transport="tcp", hosts=HOSTS, pg_timeout=2, timeout=60)
    error = failed.value.__cause__
    # Ranks 0 and 1 time out at about the same moment: the first to do so explains, then
    # aborts the group, so the other raises GroupAbortedError carrying that explanation and
    # naming rank 1 by the host name its TCP connection reported (every rank here: localhost).
    assert isinstance(error, (pydist.OpTimeoutError, pydist.GroupAbortedError)), repr(error)
    text = str(failed.value)
    own = "all_reduce (seq 2) on rank 0: Timed out waiting 2000ms for rank"
    relayed = "rank 1 (localhost) failed and aborted the group: all_reduce (seq 2) on rank 1: Timed out waiting 2000ms"
    assert own in text or relayed in text, text
    assert "ranks that never reached it: 2 (last started all_reduce, seq 1), 3 (last started all_reduce, seq 1)" \
        in text


def _stall_then_barrier(rank: int, size: int, late: list[int], wait_all: bool, rank0_done: threading.Event) -> str:
    """The ``late`` ranks enter monitored_barrier only once rank 0 has left it (timed out)."""
    if rank in late:
        assert rank0_done.wait(60), "rank 0 never left monitored_barrier"
    try:
        pydist.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=wait_all)
    except pydist.DistBackendError as error:
        return str(error)
    finally:
        if rank == 0:
            rank0_done.set()
    return "ok"


def test_monitored_barrier_passes_when_everyone_arrives():
    assert run_threads(3, _stall_then_barrier, [], False, threading.Event(), transport="tcp",
                       hosts=HOSTS[:3]) == ["ok"] * 3


@pytest.mark.slow
@pytest.mark.parametrize("wait_all, expected",
                         [(False, "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms"),
                          (True, "[Rank 0]: Ranks 2, 3 failed to pass monitoredBarrier in 1000 ms")])
def test_monitored_barrier_names_the_missing_ranks(wait_all, expected):
    results = run_threads(4, _stall_then_barrier, [2, 3], wait_all, threading.Event(), transport="tcp", hosts=HOSTS,
                          timeout=60)
    assert results[0] == expected, results
    assert all(f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
               "send/recv from rank 0: it got no answer within 1000 ms" in r
               for rank, r in enumerate(results) if rank), results


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


@pytest.mark.slow
def test_processes_over_shared_memory_explain_too():
    results = run_processes(3, _behind, timeout=60, pg_timeout=1.5)
    assert "ranks that never reached it: 1 (no operation on this group yet)" in results[0], results


# -- p2p and collective timeouts, Work.wait(timeout=...) (formerly in test_errors.py) --------

#: Seconds within which a timed-out wait must have ended: it only tells "did not hang" apart,
#: generous for a loaded machine. Which timeout ended a wait, its message says.
NOT_HUNG = 30.0


def _check_timeouts(observed: dict, short: float) -> None:
    """Each wait ended by its own timeout (the message names it), not before it."""
    recv = observed["recv"]
    assert recv["error"] == "DistBackendError", recv
    assert recv["message"] == f"recv from rank 1 (tag 0): Timed out waiting {short * 1000:.0f}ms for rank 1", recv
    assert short * 0.9 <= recv["seconds"] < NOT_HUNG, recv
    for name in ("wait", "wait_timedelta"):  # Work.wait(timeout=0.1) and (timedelta(milliseconds=100))
        wait = observed[name]
        assert wait["error"] == "DistBackendError", wait
        assert wait["message"] == "Work.wait timed out after 0.1 s; recv from rank 1 (tag 5) is still running", wait
        assert 0.09 <= wait["seconds"] < NOT_HUNG, wait
    assert observed["wait_completed"] is False
    anyone = observed["any_source"]
    assert anyone["error"] == "DistBackendError", anyone
    assert anyone["message"] == f"recv from any rank (tag 6): Timed out waiting {short * 1000:.0f}ms for any rank", \
        anyone


def _fake_time(ranks: int = 2) -> MockClock:
    """A MockClock for thread-ranks that all end up blocked: when both are (rank 0 on the
    operation under test, rank 1 on the receive that releases it) for 0.2 s of real time, the
    clock jumps to rank 0's deadline. 0.2 s, not less: a peer's message may take that long
    to land on a loaded machine, and a jump before it lands would time out a healthy wait."""
    return MockClock(parties=ranks, autojump_threshold=0.2)


def test_recv_timeout_threads(transport):
    """The timeouts under test are fake time (MockClock): 1 s, taken in about 0.2 s."""
    with _fake_time().installed() as clock:
        results = run_threads(2, misuse.recv_times_out, 1.0, transport=transport, timeout=60)
    _check_timeouts(results[0], 1.0)
    assert clock.jumps >= 2  # recv and any-source recv timed out by the fake clock


@pytest.mark.slow
def test_recv_timeout_processes():
    results = run_processes(2, misuse.recv_times_out, 1.0, init="file", timeout=60)
    _check_timeouts(results[0], 1.0)


@pytest.mark.slow
def test_collective_timeout_names_op_and_rank(transport):
    """Real time: thread-ranks of one host wait in the shared arena (transport/shm/signal.py), whose
    futex sleeps do not go through the injectable clock."""
    results = run_threads(2, misuse.collective_times_out, 1.0, transport=transport, timeout=60)
    error = results[0]["all_reduce"]
    # at its 1 s timeout; the upper bound only tells it from the group's 30 s default, generously
    assert error["error"] == "OpTimeoutError" and 0.9 <= error["seconds"] < 20, error  # a DistBackendError
    assert "all_reduce" in error["message"] and "rank 1" in error["message"], error
    assert "ranks that never reached it: 1 (" in error["message"], error


def test_work_wait_timeout_on_async_collective(transport):
    """Work.wait(timeout=...) on an all_reduce that rank 1 has not joined yet raises;
    once rank 1 joins, the operation completes."""

    def fn(rank, size):
        tensor = np.ones(2) * (rank + 1)
        if rank == 0:
            work = dist.all_reduce(tensor, async_op=True)
            with pytest.raises(dist.DistBackendError, match="Work.wait timed out after 0.1 s; all_reduce"):
                work.wait(timeout=timedelta(milliseconds=100))  # by its 0.1 s timeout, not the group's
            dist.send(np.ones(1), dst=1)  # now let rank 1 join
            work.wait()
        else:
            dist.recv(np.zeros(1), src=0)
            dist.all_reduce(tensor)
        return tensor.tolist()

    assert run2(fn, transport) == [[3.0, 3.0], [3.0, 3.0]]


class _StoreThatNeverAnswers:
    """A store whose host stopped answering (SIGSTOP, partition): every call blocks."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.asked = threading.Event()

    def set(self, key, value) -> None:
        self.asked.set()
        if not self.released.wait(60):
            raise TimeoutError("store")

    def multi_get(self, keys):
        self.set(None, None)
        return []


def test_explaining_a_timeout_is_bounded_when_the_store_does_not_answer():
    """The timeout error must not wait for the store's own timeout to name the ranks behind:
    past its budget it says that it could not find out."""
    from pydist.groups.progress import ProgressBoard
    store = _StoreThatNeverAnswers()
    board = ProgressBoard.__new__(ProgressBoard)  # no publishing thread: only explain is under test
    board._store, board._rank, board._latest = store, 0, {}
    try:
        text = board.explain(1, 2, [0, 1], budget=0.2)
    finally:
        store.released.set()
    assert "the store did not answer within 0.2 s" in text, text


class _StoreThatFails:
    def set(self, key, value):
        raise ConnectionResetError("the store's host closed the connection")


def test_explaining_a_timeout_says_so_when_the_store_is_gone():
    """The store's process exited first (it raised and left): the timeout says why it cannot
    name the ranks behind, rather than nothing."""
    from pydist.groups.progress import ProgressBoard
    board = ProgressBoard.__new__(ProgressBoard)  # no publishing thread: only explain is under test
    board._store, board._rank, board._latest = _StoreThatFails(), 0, {}
    text = board.explain(1, 2, [0, 1], budget=5.0)
    assert text == ("; which ranks never reached it is unknown: the store failed (ConnectionResetError: the store's "
                    "host closed the connection)"), text


def test_progress_is_published_once_settled_or_once_a_second_while_it_changes():
    """A rank waiting inside an operation (its record no longer changing) is published at the
    next tick, not up to a second later; one running operations back to back, once a second;
    an idle one once a second too (its record's time says it is still heard from)."""
    from pydist.groups.progress import PUBLISH_INTERVAL, publication_due
    assert not publication_due(version=5, seen=5, published=5, since_publication=0.3)  # nothing new
    assert publication_due(version=6, seen=6, published=5, since_publication=0.1)  # settled
    assert not publication_due(version=7, seen=6, published=5, since_publication=0.3)  # still changing
    assert publication_due(version=9, seen=8, published=5, since_publication=PUBLISH_INTERVAL)
    assert publication_due(version=5, seen=5, published=5, since_publication=PUBLISH_INTERVAL)  # heartbeat


def test_a_large_worlds_boards_stay_within_the_stores_budget():
    """10,000 ranks each publishing once a second (and at every settled change) would send the
    store's one thread more than it answers: the pace stretches with the world."""
    from pydist.groups.progress import PUBLISH_INTERVAL, STORE_SETS_PER_SECOND, Pace, publication_due
    small, large = Pace(8), Pace(10_000)
    assert (small.interval, small.stale) == (PUBLISH_INTERVAL, 2 * PUBLISH_INTERVAL)
    assert publication_due(version=6, seen=6, published=5, since_publication=0.1, pace=small)  # as before
    assert not publication_due(version=6, seen=6, published=5, since_publication=0.1, pace=large)
    assert publication_due(version=6, seen=6, published=5, since_publication=large.gap, pace=large)
    assert not publication_due(version=5, seen=5, published=5, since_publication=PUBLISH_INTERVAL, pace=large)
    assert 10_000 / large.gap <= STORE_SETS_PER_SECOND and large.stale == 2 * large.interval


def test_a_rank_not_heard_from_lately_is_named_with_the_age_of_its_record():
    """Rank 2 could not publish for 7 s (cut off from the store): its record may be stale, so
    it is given apart, with its age; rank 1's fresh record names it as behind."""
    import json
    import time as clock

    from pydist.groups.progress import Pace, ProgressBoard

    class Store:
        def set(self, key, value):
            pass

        def multi_get(self, keys):
            now = clock.time()
            return [json.dumps({"5": [3, "all_reduce"], "at": now - age}).encode() for age in (0.3, 7.0)]

    board = ProgressBoard.__new__(ProgressBoard)  # no publishing thread: only explain is under test
    board._store, board._rank, board._latest, board.pace = Store(), 0, {}, Pace(2)
    text = board._ask(5, 4, [1, 2])
    assert "ranks that never reached it: 1 (last started all_reduce, seq 3); not heard from lately (cut off " \
           "from the store, or stopped): 2 (last started all_reduce, seq 3, 7." in text, text


def test_destroy_does_not_wait_for_a_store_that_does_not_answer(monkeypatch):
    """The progress thread is inside a store call that never returns (its host is stopped or
    partitioned away): closing the board returns anyway (it used to join the thread)."""
    from pydist.groups import progress
    from pydist.groups.progress import ProgressBoard
    monkeypatch.setattr(progress, "CLOSE_WAIT", 0.05)  # its bound on the join, shortened: the same check
    store = _StoreThatNeverAnswers()
    store.released.set()  # the first record (written by the constructor) goes through
    board = ProgressBoard(store, 0)
    store.released.clear()
    store.asked.clear()
    try:
        board.started(1, 1, "all_reduce")  # the thread publishes it soon and blocks there
        assert store.asked.wait(30)
        closed = threading.Thread(target=board.close)
        closed.start()
        closed.join(30)  # generous: close waits CLOSE_WAIT; without the bound it would wait for the store
        assert not closed.is_alive(), "closing the progress board waited for the store"
    finally:
        store.released.set()


def _late_first_shm_collective(rank: int, size: int, rank1_done: threading.Event) -> str:
    """Rank 0 comes to the group's first (shared-memory) collective only after rank 1 has
    given up on it."""
    t = np.ones(8, np.float32)
    if rank == 0:
        assert rank1_done.wait(60)
        return "late"
    try:
        pydist.all_reduce(t)
    except Exception as error:  # noqa: BLE001 - what it raises is the point
        return f"{type(error).__name__}: {error}"
    finally:
        rank1_done.set()
    return "ok"


@pytest.mark.slow
def test_a_late_rank_at_the_first_shared_memory_collective_is_named_in_an_op_timeout():
    """The group's arena is made at init (engines.native.prepare), so the first shared-memory
    collective waits for the late rank like any other: at the timeout an OpTimeoutError naming
    it, not a store error about a key."""
    _late, error = run_threads(2, _late_first_shm_collective, threading.Event(), transport="tcp", pg_timeout=2,
                               timeout=60)
    assert error.startswith("OpTimeoutError: all_reduce (seq 1) on rank 1: Timed out waiting 2000ms for rank 0"), \
        error
    assert "never reached it: 0" in error and "Store" not in error, error


def _creator_leaves(rank: int, size: int) -> str:
    """Rank 0, which creates the arena, shuts down instead of coming to the first collective."""
    if rank == 0:
        pydist.destroy_process_group()
        pydist.init_process_group(store=pydist.HashStore(), rank=0, world_size=1)  # for the harness's destroy
        return "left"
    started = time.monotonic()
    try:
        pydist.all_reduce(np.ones(8, np.float32))
    except Exception as error:  # noqa: BLE001 - what it raises is the point
        return f"{type(error).__name__} after {time.monotonic() - started:.1f} s: {error}"
    return "ok"


def test_a_creator_of_shared_memory_that_leaves_is_named_at_once():
    """Rank 0 made the arena at init and left: rank 1 finds it gone (PeerFailedError when it
    attached first and waits on rank 0, DistStoreError naming rank 0's departure when the
    segment was unlinked before it attached), at once, not at the 120 s timeout."""
    _left, error = run_threads(2, _creator_leaves, transport="tcp", pg_timeout=120, timeout=180)
    assert error.startswith(("PeerFailedError", "DistStoreError")) and "rank 0" in error, error
    seconds = float(error.split(" after ")[1].split(" s")[0])
    assert seconds < NOT_HUNG, f"waited {seconds} s: the 120 s timeout, not the departure, ended the wait"
