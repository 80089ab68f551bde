"""Rank functions for the misuse tests (tests/test_misuse_*.py, test_misuse_size_mismatch.py,
test_timeouts_explained.py), importable by thread-ranks and process-ranks.

Each returns what it observed (plain dicts: error type, whether it is a DistError, the
message, seconds taken), so the test asserts in the parent process with the same code for
``run_threads`` and ``run_processes``.
"""
from __future__ import annotations

import warnings
from datetime import timedelta

import numpy as np

import pydist as dist
from pydist.core import deadline as _deadline

GUARD = 4
SENTINEL = -7.0


def outcome(call) -> dict:
    """Run ``call()``; report its error (type, DistError or not, message) and duration (on
    pydist's clock: a MockClock's fake seconds where one is installed)."""
    start = _deadline.now()
    try:
        call()
    except Exception as error:  # noqa: BLE001 - reported to the test
        return {"error": type(error).__name__, "dist_error": isinstance(error, dist.DistError),
                "message": str(error), "seconds": _deadline.now() - start}
    return {"error": None, "dist_error": False, "message": "", "seconds": _deadline.now() - start}


def guarded(count: int, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """(base, view): ``count`` elements of ``fill`` between guard zones of SENTINEL."""
    base = np.full(count + 2 * GUARD, SENTINEL)
    view = base[GUARD:GUARD + count]
    view[:] = fill
    return base, view


def intact(base: np.ndarray) -> bool:
    return bool((base[:GUARD] == SENTINEL).all() and (base[-GUARD:] == SENTINEL).all())


def size_mismatch(rank: int, size: int, op: str = "all_reduce", n: int = 10, extra: int = 2) -> dict:
    """Rank 0 passes ``n`` elements, the others ``n + extra``; then a follow-up all_reduce."""
    count = n if rank == 0 else n + extra
    bases = []

    def make(fill: float, elements: int = count) -> np.ndarray:
        base, view = guarded(elements, fill)
        bases.append(base)
        return view

    tensor = make(rank + 1.0)
    calls = {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "broadcast": lambda: dist.broadcast(tensor, src=0),
        "reduce": lambda: dist.reduce(tensor, dst=size - 1),
        "all_gather": lambda: dist.all_gather([make(0.0) for _ in range(size)], tensor),
        "reduce_scatter": lambda: dist.reduce_scatter(tensor, [make(1.0) for _ in range(size)]),
        "scatter": lambda: dist.scatter(tensor, [make(1.0) for _ in range(size)] if rank == 0 else None, src=0),
        "gather": lambda: dist.gather(tensor, [make(0.0) for _ in range(size)] if rank == 0 else None, dst=0),
        "all_to_all": lambda: dist.all_to_all([make(0.0) for _ in range(size)], [make(1.0) for _ in range(size)]),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(make(0.0, count * size), tensor),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(tensor, make(1.0, count * size)),
    }
    result = outcome(calls[op])
    result["intact"] = all(intact(base) for base in bases)
    result["follow_up"] = outcome(lambda: dist.all_reduce(np.ones(3)))
    return result


def recv_times_out(rank: int, size: int, short: float = 1.0) -> dict:
    """Rank 0 receives from rank 1, which sends nothing, on a group whose timeout is
    ``short`` seconds: recv must raise; then irecv + Work.wait(timeout=0.1) must raise
    after 0.1 s; then irecv from any rank. Rank 1 stays alive (waits on the default group)
    until rank 0 is done."""
    group = dist.new_group([0, 1], timeout=timedelta(seconds=short))
    observed: dict = {}
    if rank == 0:
        observed["recv"] = outcome(lambda: dist.recv(np.zeros(2), src=1, group=group))
        work = dist.irecv(np.zeros(2), src=1, group=group, tag=5)
        observed["wait"] = outcome(lambda: work.wait(timeout=0.1))
        observed["wait_completed"] = work.is_completed()
        observed["wait_timedelta"] = outcome(lambda: work.wait(timeout=timedelta(milliseconds=100)))
        anyone = dist.irecv(np.zeros(2), group=group, tag=6)
        observed["any_source"] = outcome(lambda: anyone.wait())
        dist.send(np.ones(1), dst=1)  # release rank 1
    elif rank == 1:
        dist.recv(np.zeros(1), src=0)
    return observed


def collective_times_out(rank: int, size: int, short: float = 1.0) -> dict:
    """Only rank 0 enters all_reduce on a group with a ``short`` timeout; rank 1 waits."""
    group = dist.new_group([0, 1], timeout=timedelta(seconds=short))
    observed: dict = {}
    if rank == 0:
        observed["all_reduce"] = outcome(lambda: dist.all_reduce(np.ones(2), group=group))
        dist.send(np.ones(1), dst=1)
    elif rank == 1:
        dist.recv(np.zeros(1), src=0)
    return observed


def non_member_calls(rank: int, size: int) -> dict:
    """new_group([0]); every other rank calls collectives and p2p on it: no-ops + warnings."""
    group = dist.new_group([0])
    observed: dict = {"is_non_member": group is dist.GroupMember.NON_GROUP_MEMBER}
    tensor = np.arange(3.0) + rank
    if rank == 0:
        dist.all_reduce(tensor, group=group)
    else:
        calls = {
            "all_reduce": lambda: dist.all_reduce(tensor, group=group),
            "broadcast": lambda: dist.broadcast(tensor, src=0, group=group),
            "reduce": lambda: dist.reduce(tensor, dst=0, group=group),
            "all_gather": lambda: dist.all_gather([np.zeros(3)], tensor, group=group),
            "gather": lambda: dist.gather(tensor, dst=0, group=group),
            "scatter": lambda: dist.scatter(tensor, src=0, group=group),
            "barrier": lambda: dist.barrier(group=group),
            "isend": lambda: dist.isend(tensor, dst=0, group=group),
            "irecv": lambda: dist.irecv(tensor, src=0, group=group),
        }
        for name, call in calls.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                returned = call()
            observed[name] = {"returned": repr(returned),
                              "warnings": [(w.category.__name__, str(w.message)) for w in caught]}
        observed["rank_in_group"] = (dist.get_rank(group), dist.get_world_size(group))
    observed["tensor"] = tensor.tolist()
    dist.barrier()
    return observed


def init_twice(rank: int, size: int) -> dict:
    """A second init_process_group in a process that already has one."""
    observed = {"again": outcome(lambda: dist.init_process_group("pydist", rank=rank, world_size=size,
                                                                   store=dist.HashStore()))}
    tensor = np.ones(2)
    dist.all_reduce(tensor)
    observed["still_works"] = tensor.tolist()
    return observed
