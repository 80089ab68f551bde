"""Work handles and the ordering of a group's operations."""
import concurrent.futures
import threading
import time

import numpy as np
import pytest

import pydist as dist
from pydist.groups.world import current, using_world
from pydist.testing import run_threads


def _work_api(rank, size):
    buf = np.full(4, rank + 1.0)
    work = dist.all_reduce(buf, async_op=True)
    assert isinstance(work.get_future(), concurrent.futures.Future)
    assert work.wait() is True and work.is_completed() and work.is_success() and work.exception() is None
    assert work.result()[0] is buf and work.get_future().result()[0] is buf
    return buf.tolist()


def test_work_api():
    assert run_threads(3, _work_api) == [[6.0] * 4] * 3


def _ordered(rank, size):
    """Many async ops then a blocking one: all run in issue order on every rank."""
    bufs = [np.full(1000, float(i * size + rank)) for i in range(20)]
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    last = np.full(3, rank)
    dist.broadcast(last, src=0)
    for w in works:
        assert w.is_completed()  # the blocking broadcast queued behind them
    return [float(b[0]) for b in bufs], last.tolist()


def test_async_then_blocking_keeps_issue_order():
    size = 4
    results = run_threads(size, _ordered)
    want = [sum(i * size + r for r in range(size)) for i in range(20)]
    assert all(r == (want, [0, 0, 0]) for r in results)


def _wait_timeout(rank, size):
    if rank == 0:
        work = dist.irecv(np.zeros(1), src=1, tag=5)
        start = time.monotonic()
        with pytest.raises(dist.DistBackendError, match=r"Work.wait timed out after 0.1 s; recv from rank 1"):
            work.wait(timeout=0.1)  # its own timeout, not the group's (30 s), ends it: the message says which
        elapsed = time.monotonic() - start
        assert not work.is_completed()
        dist.send(np.zeros(1), dst=1, tag=6)  # release rank 1, which then sends tag 5
        work.wait()
        return elapsed
    dist.recv(np.zeros(1), src=0, tag=6)
    dist.send(np.ones(1), dst=0, tag=5)
    return None


def test_wait_with_timeout_raises_then_can_wait_again():
    elapsed = run_threads(2, _wait_timeout)[0]
    assert elapsed >= 0.09  # it waited for its timeout


def _p2p_timeout(rank, size, done):
    if rank == 1:  # alive, but never sends
        done.wait(10)
        return
    try:
        with pytest.raises(dist.DistBackendError, match=r"recv from rank 1 \(tag 0\): Timed out waiting 300ms"):
            dist.recv(np.zeros(1), src=1)
    finally:
        done.set()


def test_recv_times_out_with_the_group_timeout():
    run_threads(2, _p2p_timeout, threading.Event(), pg_timeout=0.3)


def _collective_timeout(rank, size, done):
    if rank == 1:  # alive, but never joins the all_reduce
        done.wait(10)
        return
    try:
        with pytest.raises(dist.DistBackendError, match=r"all_reduce \(seq 1\) on rank 0: Timed out waiting 300ms "
                                                        r"for rank 1"):
            dist.all_reduce(np.zeros(1))
        with pytest.raises(dist.DistBackendError, match="broken"):
            dist.all_reduce(np.zeros(1))  # the group is broken: fails at once
    finally:
        done.set()


def test_collective_timeout_names_op_seq_and_peer_then_group_is_broken():
    run_threads(2, _collective_timeout, threading.Event(), pg_timeout=0.3)


def _peer_exits(rank, size):
    if rank == 1:
        return  # leaves: destroy_process_group closes its end
    with pytest.raises(dist.PeerFailedError, match="rank 1") as caught:
        dist.all_reduce(np.zeros(1))
    assert caught.value.rank == 1


@pytest.mark.parametrize("transport", ["loopback", "tcp"])
def test_a_peer_that_left_is_named(transport):
    run_threads(2, _peer_exits, transport=transport, pg_timeout=20)


def _irecv_before_isend(rank, size):
    peer = 1 - rank
    got = np.zeros(1 << 20, np.uint8)
    receive = dist.irecv(got, src=peer)
    send = dist.isend(np.full(1 << 20, rank + 1, np.uint8), dst=peer)
    receive.wait()
    send.wait()
    return int(got[0])


@pytest.mark.parametrize("transport", ["loopback", "tcp"])
def test_irecv_posted_before_isend_on_the_same_pair(transport):
    assert run_threads(2, _irecv_before_isend, transport=transport) == [2, 1]


def _runner_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pydist-callbacks-") and t.is_alive()]


def test_release_idle_ends_idle_callback_workers_at_once_and_later_tasks_still_run():
    from pydist.groups.callbacks import CallbackRunner

    runner = CallbackRunner(idle_seconds=3600.0)  # only release_idle can end its workers in time
    before = set(_runner_workers())
    ran = threading.Event()
    runner.run(ran.set)
    assert ran.wait(30)  # "did not hang" bound, generous for a loaded machine
    workers = set(_runner_workers()) - before
    assert len(workers) == 1
    runner.release_idle()
    for worker in workers:
        worker.join(30)  # would take an hour without the release
        assert not worker.is_alive()
    again = threading.Event()
    runner.run(again.set)
    assert again.wait(30)
    runner.release_idle()


def test_wait_until_done_waits_for_running_tasks_within_its_bound():
    from pydist.groups.callbacks import CallbackRunner

    runner, release = CallbackRunner(idle_seconds=3600.0), threading.Event()
    runner.run(lambda: release.wait(30))
    assert runner.wait_until_done(0.05) is False  # the task blocks: the bound ends the wait
    release.set()
    assert runner.wait_until_done(30) is True  # "did not hang" bound, generous for a loaded machine
    runner.release_idle()


def _in_a_forked_child(call) -> int | str:
    """Exit code of a forked child that runs ``call()`` (0 when it returns True), or "hung"
    when it has not ended within 10 s ("did not hang" bound, generous for a loaded machine)."""
    import os
    pid = os.fork()
    if pid == 0:
        os._exit(0 if call() else 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


def test_a_forked_child_starts_with_an_empty_callback_runner():
    """The parent's busy worker and a thread holding the runner's lock at the fork do not exist
    in the child: its exit (wait_until_done) neither waits for them nor hangs on the lock."""
    from pydist.groups.callbacks import CallbackRunner

    runner, started, release = CallbackRunner(idle_seconds=3600.0), threading.Event(), threading.Event()
    runner.run(lambda: (started.set(), release.wait(30)))
    assert started.wait(30)
    assert _in_a_forked_child(lambda: runner.wait_until_done(5.0)) == 0  # the parent's task is not the child's
    release.set()
    assert runner.wait_until_done(30)
    holding, let_go = threading.Event(), threading.Event()

    def hold():
        with runner._cond:
            holding.set()
            let_go.wait(30)
    threading.Thread(target=hold, daemon=True).start()
    assert holding.wait(30)
    try:
        assert _in_a_forked_child(lambda: runner.wait_until_done(5.0)) == 0
    finally:
        let_go.set()
    runner.release_idle()


def _destroy_while_inside_a_blocking_call(rank, size, draining):
    """Rank 0's helper thread is inside a blocking broadcast on ``group`` when rank 0 destroys
    ``group``: the destroy waits for that call (drain), rank 1's part ends it, and the destroy
    returns then, not at the group's timeout (30 s)."""
    group = dist.new_group([0, 1])
    if rank == 1:
        assert draining.wait(20), "rank 0 never started destroying the group"
        dist.broadcast(np.ones(1), src=1, group=group)
        dist.destroy_process_group(group)
        return None
    queue = group._queue
    inside, waits = threading.Event(), queue._idle_within
    claim = queue.claim

    def claimed():  # the helper is inside its call once it claimed the queue
        seq = claim()
        inside.set()
        return seq
    queue.claim = claimed

    def idle_within(seconds):  # under the queue's lock: the call cannot end before this waits
        draining.set()
        return waits(seconds)
    queue._idle_within = idle_within
    world, got = current(), np.zeros(1)

    def in_rank_0(call, *args, **kwargs):  # a thread of rank 0 (a thread-rank's World is per thread)
        with using_world(world):
            call(*args, **kwargs)
    helper = threading.Thread(target=in_rank_0, args=(dist.broadcast, got), kwargs={"src": 1, "group": group},
                              name="rank-0-blocking-broadcast", daemon=True)
    helper.start()
    assert inside.wait(20), "the helper's broadcast never started"
    destroyer = threading.Thread(target=in_rank_0, args=(dist.destroy_process_group, group), daemon=True)
    destroyer.start()
    destroyer.join(15)  # a bound well under the group's timeout (30 s), for a loaded machine
    helper.join(15)
    return destroyer.is_alive(), helper.is_alive(), got.tolist()


def test_destroying_a_group_waits_for_a_blocking_call_in_another_thread_not_the_timeout():
    assert run_threads(2, _destroy_while_inside_a_blocking_call, threading.Event(), pg_timeout=30)[0] == \
        (False, False, [1.0])
