"""The shared-memory latency path of all_reduce (issue 40): a small call that repeats runs the
path its engine bound at the first call (allreduce_shm.latency_path, in the call's plan,
kept per call spec), with the results, the desync check and the failure reports of the
general path."""
import threading
from datetime import timedelta

import numpy as np
import pytest

import pydist as dist
from pydist.engines import native
from pydist.testing import run_threads
from pydist.transport.shm import atomics as _atomics

pytestmark = pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off")

OPS = [("SUM", np.float32), ("AVG", np.float64), ("PRODUCT", np.float32), ("MIN", np.int32),
       ("MAX", np.float64), ("BXOR", np.int64), ("BAND", np.uint8), ("BOR", np.int32)]


def _bound(engine) -> int:
    """How many call plans of the engine have a bound path."""
    return sum(plan.bound is not None for plan in engine._plans.values())


def _inputs(rank: int, call: int, dtype, count: int) -> np.ndarray:
    """Rank ``rank``'s input of call ``call``: small values, exact in every dtype."""
    return ((np.arange(count) + 3 * rank + 7 * call) % 5 + 1).astype(dtype)


def _expected(op: str, size: int, call: int, dtype, count: int) -> np.ndarray:
    parts = [_inputs(r, call, dtype, count) for r in range(size)]
    if op == "AVG":
        return (sum(p.astype(np.float64) for p in parts) / size).astype(dtype)
    combine = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
               "BXOR": np.bitwise_xor, "BAND": np.bitwise_and, "BOR": np.bitwise_or}[op]
    result = parts[0]
    for part in parts[1:]:
        result = combine(result, part).astype(dtype)
    return result


def _repeat_every_op(rank, size):
    """Each op three times on one shape, interleaved with another shape: every call's result
    and whether the engine kept the call's path."""
    engine = dist.group.WORLD.engine
    wrong = []
    for call in range(3):
        for op, dtype in OPS:
            for count in (1, 5):
                buf = _inputs(rank, call, dtype, count)
                dist.all_reduce(buf, op=getattr(dist.ReduceOp, op))
                if not np.array_equal(buf, _expected(op, size, call, dtype, count)):
                    wrong.append((op, count, call, buf.tolist()))
    kept = _bound(engine)
    return wrong, kept


@pytest.mark.parametrize("size", [2, 3])
def test_repeated_small_calls_take_the_kept_path_with_the_same_results(size):
    for wrong, kept in run_threads(size, _repeat_every_op, transport="tcp"):
        assert wrong == []
        assert kept == len(OPS) * 2  # every (op, dtype, count) of the loop: one path each


def _premul(rank, size):
    """PREMUL_SUM with a new factor each call: one spec (the factor is not part of it)."""
    results = []
    for factor in (2.0, 3.0, 0.5):
        buf = np.full(3, rank + 1.0, np.float64)
        dist.all_reduce(buf, op=dist._make_nccl_premul_sum(factor))
        results.append(buf.tolist())
    return results, _bound(dist.group.WORLD.engine)


def test_premul_sum_scales_by_each_calls_factor():
    for results, kept in run_threads(2, _premul, transport="tcp"):
        assert results == [[6.0] * 3, [9.0] * 3, [1.5] * 3]
        assert kept == 1


def _kept_bounded(rank, size):
    for count in range(1, 6):
        for _ in range(2):
            buf = np.full(count, rank + 1, np.int64)
            dist.all_reduce(buf)
            assert buf.tolist() == [3] * count
    return _bound(dist.group.WORLD.engine)


def test_the_kept_paths_are_bounded(monkeypatch):
    monkeypatch.setattr(native, "PLANS_KEPT", 2)
    assert run_threads(2, _kept_bounded, transport="tcp") == [1, 1]  # five shapes, cleared at the 3rd and 5th


def _desync_after_kept(rank, size):
    for _ in range(2):  # both ranks keep the 1-element path
        dist.all_reduce(np.ones(1, np.float32))
    with pytest.raises(dist.DistBackendError) as caught:
        dist.all_reduce(np.ones(1 if rank == 0 else 2, np.float32))
    return str(caught.value)


def test_ranks_calling_different_shapes_on_the_kept_path_all_raise():
    messages = run_threads(2, _desync_after_kept, transport="tcp", pg_timeout=10)
    for rank, message in enumerate(messages):
        assert "ranks called all_reduce with different sizes" in message and f"rank {1 - rank}" in message, message


def _destroyed(rank, size):
    dist.all_reduce(np.ones(1))
    dist.all_reduce(np.ones(1))
    engine = dist.group.WORLD.engine
    kept = _bound(engine)
    dist.destroy_process_group()
    return kept, _bound(engine)


def test_destroying_the_group_drops_the_kept_paths():
    assert run_threads(2, _destroyed, transport="tcp") == [(1, 0), (1, 0)]


def _recorded(rank, size):
    for _ in range(3):
        dist.all_reduce(np.ones(2, np.float32))
    entries = dist.group.WORLD._trace.entries()[-3:]
    return [(e.spec.name, e.state, e.algorithm) for e in entries], [e.seq for e in entries]


def test_the_flight_recorder_sees_kept_calls_as_any_other():
    from pydist.debug._format import COMPLETED
    for calls, seqs in run_threads(2, _recorded, transport="tcp"):
        assert calls == [("all_reduce", COMPLETED, "shm")] * 3
        assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2]


def _behind_an_async_call(rank, size):
    for _ in range(2):
        dist.all_reduce(np.ones(1, np.float64))  # kept from here on
    first = np.full(1 << 16, rank + 1.0)
    work = dist.all_reduce(first, async_op=True)
    second = np.full(1, rank + 1.0)
    dist.all_reduce(second)  # the group is busy (or was): queued behind, or run after it
    work.wait()
    return float(first[0]), float(first[-1]), float(second[0])


def test_a_kept_call_behind_an_async_one_runs_after_it():
    assert run_threads(2, _behind_an_async_call, transport="tcp") == [(3.0, 3.0, 3.0)] * 2


def _peer_stops(rank, size, done, call, last):
    """``call()`` twice on every rank (kept from the second on); then rank 1 stays alive
    without calling again until rank 0's ``last()`` has raised, whose message is returned."""
    for _ in range(2):
        call()
    if rank == 1:
        done.wait(60)
        return "stopped"
    try:
        with pytest.raises(dist.DistBackendError) as caught:
            last()
    finally:
        done.set()
    return str(caught.value)


@pytest.mark.slow
def test_a_kept_call_whose_peer_never_comes_times_out_naming_it():
    call = lambda: dist.all_reduce(np.ones(1, np.float32))  # noqa: E731
    message = run_threads(2, _peer_stops, threading.Event(), call, call, transport="tcp", pg_timeout=1)[0]
    assert "all_reduce (seq 3)" in message and "Timed out" in message and "rank 1" in message, message


def _broadcasts(rank, size):
    """Broadcasts from every root, three times, of two shapes; barriers between."""
    wrong = []
    for call in range(3):
        for root in range(size):
            for dtype, count in ((np.float32, 1), (np.int64, 7)):
                buf = _inputs(rank, call, dtype, count)
                dist.broadcast(buf, src=root)
                if not np.array_equal(buf, _inputs(root, call, dtype, count)):
                    wrong.append((root, count, call, buf.tolist()))
        dist.barrier()
    return wrong, _bound(dist.group.WORLD.engine)


@pytest.mark.parametrize("size", [2, 3])
def test_repeated_broadcasts_and_barriers_take_kept_paths(size):
    for wrong, kept in run_threads(size, _broadcasts, transport="tcp"):
        assert wrong == []
        assert kept == 2 * size + 1  # each (root, shape) broadcast, and the barrier


def _broadcast_desync(rank, size):
    for _ in range(2):
        dist.broadcast(np.ones(1, np.float32), src=0)
        dist.broadcast(np.ones(1, np.float32), src=1)
    with pytest.raises(dist.DistBackendError) as caught:
        dist.broadcast(np.ones(1, np.float32), src=rank)  # each rank names itself the root
    return str(caught.value)


def test_ranks_naming_different_roots_on_the_kept_path_all_raise():
    for rank, message in enumerate(run_threads(2, _broadcast_desync, transport="tcp", pg_timeout=10)):
        assert "ranks called broadcast with different roots" in message and f"rank {1 - rank}" in message, message
        assert f"root {rank}" in message and f"root {1 - rank}" in message, message


@pytest.mark.slow
def test_a_kept_barrier_keeps_its_own_timeout():
    message = run_threads(2, _peer_stops, threading.Event(), dist.barrier,
                          lambda: dist.barrier(timeout=timedelta(seconds=0.5)), transport="tcp", pg_timeout=60)[0]
    assert "barrier (seq 3)" in message and "500ms" in message and "rank 1" in message, message
