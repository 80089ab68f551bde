"""A queued operation whose Work is waited on at once runs in the waiting thread (issue 49:
torch's blocking calls reach pydist async, then wait): in issue order, its error on its
Work, and never while an operation queued ahead of it has not run. An async call still
never waits for its peers in the caller's thread."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pydist as dist
from pydist.core.errors import DistBackendError
from pydist.groups.process_group import QueuedWork
from pydist.groups.queue import OpQueue
from pydist.testing import run_threads


@pytest.fixture
def queue(monkeypatch) -> OpQueue:
    """A queue whose progress thread never starts: only waiters run its operations."""
    monkeypatch.setattr(OpQueue, "_start_thread", lambda self: None)
    return OpQueue("test")


def _submit(queue: OpQueue, ran: list, name: str, error: BaseException | None = None) -> QueuedWork:
    def operation(seq: int) -> None:
        ran.append((name, seq, threading.current_thread()))
        if error is not None:
            raise error
    work = QueuedWork(name, [], queue)
    queue.submit(operation, work, blocking=False)
    return work


def test_a_wait_runs_the_next_queued_operation_in_the_waiting_thread(queue):
    ran: list = []
    work = _submit(queue, ran, "first")
    assert ran == [] and not work.is_completed()
    assert work.wait() is True
    assert ran == [("first", 1, threading.current_thread())] and work.is_success()
    assert queue.drain(0) is True  # the group is idle again


def test_a_wait_runs_the_operations_queued_ahead_first_and_none_behind(queue):
    ran: list = []
    first, second, third = (_submit(queue, ran, name) for name in ("first", "second", "third"))
    second.wait()
    assert [(name, seq) for name, seq, _ in ran] == [("first", 1), ("second", 2)]
    assert first.is_success() and not third.is_completed()
    third.wait()
    assert [seq for _, seq, _ in ran] == [1, 2, 3]


def test_a_wait_runs_nothing_while_another_thread_runs_an_operation(queue):
    ran: list = []
    running, finish = threading.Event(), threading.Event()
    first = QueuedWork("first", [], queue)
    queue.submit(lambda seq: (running.set(), finish.wait(30)), first, blocking=False)
    second = _submit(queue, ran, "second")
    runner = threading.Thread(target=first.wait)
    runner.start()
    assert running.wait(30)
    queue.run_through(second)  # the group is busy: nothing to run here
    assert ran == []
    finish.set()
    runner.join(30)
    second.wait()
    assert [name for name, _, _ in ran] == ["second"]


def test_a_wait_with_a_timeout_leaves_the_operation_queued(queue):
    ran: list = []
    work = _submit(queue, ran, "first")
    with pytest.raises(DistBackendError, match="Work.wait timed out after 0.05 s; first is still running"):
        work.wait(timeout=0.05)
    assert ran == [] and not work.is_completed()
    work.wait()
    assert len(ran) == 1


def test_the_error_of_an_operation_its_waiter_ran_lands_on_its_work(queue):
    ran: list = []
    failing = _submit(queue, ran, "failing", ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        failing.wait()
    assert failing.is_completed() and not failing.is_success() and isinstance(failing.exception(), ValueError)
    after = _submit(queue, ran, "after")
    assert after.wait() is True  # the queue was released


def _lazy_queue(monkeypatch) -> tuple[OpQueue, list]:
    """A queue whose first operation its waiter ran (no progress thread yet): lazy."""
    queue, ran = OpQueue("lazy"), []
    with monkeypatch.context() as patch:
        patch.setattr(OpQueue, "_start_thread", lambda self: None)
        _submit(queue, ran, "waited").wait()
    assert queue._lazy and ran[0][2] is threading.current_thread()
    return queue, ran


def test_an_operation_nobody_waits_on_starts_by_itself_after_waiters_ran_others(monkeypatch):
    queue, ran = _lazy_queue(monkeypatch)
    alone = _submit(queue, ran, "alone")  # starts the progress thread; lazy: it looks by itself
    assert alone.wait(timeout=30) is True  # (with a timeout: not run by this thread)
    assert ran[-1][0] == "alone" and ran[-1][2] is not threading.current_thread()
    assert not queue._lazy  # nobody waited on it: submissions wake the progress thread again
    queue.close(5)


def test_a_lazy_progress_thread_sleeps_until_woken_after_idle_looks(monkeypatch):
    monkeypatch.setattr("pydist.groups.queue.IDLE_POLLS", 3)
    queue, ran = _lazy_queue(monkeypatch)
    queue._start_thread()
    for _ in range(3000):  # three empty looks (1 ms each) end the lazy mode; generous on a busy machine
        if not queue._lazy:
            break
        threading.Event().wait(0.01)
    assert not queue._lazy
    assert _submit(queue, ran, "woken").wait(timeout=30) is True  # woken at its submission
    queue.close(5)


def _async_then_wait(rank, size):
    buf = np.full(3, rank + 1.0)
    work = dist.all_reduce(buf, async_op=True)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (work.wait(), done.set()), daemon=True)
    waiter.start()
    return done.wait(30), buf.tolist()


def test_an_async_collective_completes_by_its_wait_without_the_progress_thread(monkeypatch):
    monkeypatch.setattr(OpQueue, "_start_thread", lambda self: None)
    assert run_threads(2, _async_then_wait, transport="tcp") == [(True, [3.0] * 3)] * 2


def crossed_calls(rank, size, library="pydist"):
    """Rank 0 starts an async all_reduce on group a, then a blocking one on group b; rank 1
    calls b first, then a. The async call must not wait for rank 1 in rank 0's thread
    (torch's backends run async calls off the caller's thread: gloo's worker, NCCL's stream).
    ``library``: "pydist" on numpy arrays, or "torch" (torch.distributed on tensors)."""
    if library == "torch":
        import torch
        import torch.distributed as api

        def full(value):
            return torch.full((2,), value)
    else:
        api = dist

        def full(value):
            return np.full(2, value)
    a, b = api.new_group([0, 1]), api.new_group([0, 1])
    first, second = full(rank + 1.0), full(10.0 * (rank + 1))
    if rank == 0:
        work = api.all_reduce(first, group=a, async_op=True)
        api.all_reduce(second, group=b)
        work.wait()
    else:
        api.all_reduce(second, group=b)
        api.all_reduce(first, group=a)
    return first.tolist(), second.tolist()


def test_an_async_collective_does_not_wait_for_peers_in_the_callers_thread():
    assert run_threads(2, crossed_calls, transport="tcp", pg_timeout=30) == [([3.0] * 2, [30.0] * 2)] * 2
