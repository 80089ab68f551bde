"""Ranks joining a running job (admit_joiners, a joining init_process_group): thread-ranks over
the loopback and over tcp with shared memory; the cases a replacement meets: one joiner, two at
once, one that dies while joining, one arriving while the members shrink, one on a host the
job has no rank on. Real processes (pydist-run --on-failure replace) are tests/test_launcher_replace.py."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pydist as dist
from pydist.api.grow import admit_joiners
from pydist.core.deadline import Deadline
from pydist.groups import admission
from pydist.groups.factory import joining_transport
from pydist.groups.world import current
from pydist.testing import run_threads

STEPS = 6


def _step(step: int, admit: bool = True) -> tuple[int, float]:
    """One step of a member: admit joiners (the step number goes to them), then an all_reduce
    of ones; (world size, the sum)."""
    if admit and admit_joiners():
        counter = np.array([step], np.int64)
        dist.broadcast(counter, src=0)
    ones = np.ones(4)
    dist.all_reduce(ones)
    return dist.get_world_size(), float(ones[0])


def _member(rank: int, size: int, steps: int = STEPS) -> list[tuple[int, float]]:
    return [_step(step) for step in range(steps)]


def _joiner(join, steps: int = STEPS) -> list[tuple[int, float]]:
    """Join, take the step the members are at, and run the rest of the steps with them."""
    join()
    counter = np.zeros(1, np.int64)
    dist.broadcast(counter, src=0)
    step = int(counter[0])
    done = [_step(step, admit=False)]  # admitted inside the members' admit_joiners of this step
    done += [_step(s) for s in range(step + 1, steps)]
    return done


def _sizes_and_sums_agree(results: list[list[tuple[int, float]]]) -> bool:
    return all(size == total for steps in results for size, total in steps)


@pytest.mark.parametrize("transport", ["loopback", "tcp"])
def test_a_joiner_is_admitted_and_the_world_grows_back(transport):
    results = run_threads(3, _member_waiting_for(1, before_step=2), transport=transport, joiners=[(_joiner, None)])
    assert _sizes_and_sums_agree(results)
    sizes = [size for size, _ in results[0]]
    assert sizes == sorted(sizes) and set(sizes) <= {3, 4} and [steps[-1][0] for steps in results] == [4, 4, 4, 4]
    assert results[3] == results[0][-len(results[3]):]  # the joiner ran the last steps with the members


def _await_joiners(count: int) -> None:
    """Rank 0 of the members: wait until ``count`` joiners are ready or were handled."""
    world = current()
    base = admission.base_store(world.store)
    while len(world.joiners_handled) + len(admission.ready_joiners(base, world.joiners_handled,
                                                                    world.started)) < count:
        threading.Event().wait(0.01)


def _member_waiting_for(count: int, before_step: int = 0):
    """A member whose rank 0 waits, before step ``before_step``, until ``count`` joiners are
    ready (or were handled), so that the steps do not all end before they come."""
    def member(rank: int, size: int) -> list[tuple[int, float]]:
        done = []
        for step in range(STEPS):
            if rank == 0 and step == before_step:
                _await_joiners(count)
            done.append(_step(step))
        return done
    return member


def test_two_joiners_are_admitted_at_once_in_transport_rank_order():
    def joiner(join):
        steps = _joiner(join)
        return dist.get_rank(), current().transport_rank(dist.get_rank()), steps

    results = run_threads(2, _member_waiting_for(2), joiners=[(joiner, None), (joiner, None)])
    assert all(steps[0][0] == 4 for steps in results[:2])  # admitted together, before the first step
    joined = sorted(results[2:])
    assert [(rank, transport_rank) for rank, transport_rank, _ in joined] == [(2, 2), (3, 3)]
    assert all(steps == results[0] for _, _, steps in joined)


def test_a_joiner_that_dies_while_joining_is_left_out_and_the_next_one_admitted():
    first_gone = threading.Event()

    def dies(join):
        """Takes a ticket, listens, says it is ready, then goes (before the members dial it)."""
        world, store = current(), join.store
        ticket = admission.take_ticket(store, 30)
        transport = joining_transport(world, ticket, store, Deadline.after(30))
        admission.mark_ready(store, ticket)
        transport.close()
        first_gone.set()
        return "gone"

    def later(join):
        first_gone.wait(30)
        return _joiner(join)

    def member(rank: int, size: int) -> list[tuple[int, float]]:
        done = []
        for step in range(STEPS):
            if rank == 0 and step in (0, 2):
                _await_joiners(1 if step == 0 else 2)  # the dead one by step 0, the next by step 2
            done.append(_step(step))
        return done

    results = run_threads(2, member, transport="tcp", joiners=[(dies, None), (later, None)])
    assert results[2] == "gone"
    assert _sizes_and_sums_agree(results[:2] + [results[3]])
    assert [steps[-1][0] for steps in (results[0], results[1], results[3])] == [3, 3, 3]


def test_a_joiner_on_a_host_the_job_has_no_rank_on():
    """The members share host h0; the joiner is alone on h1: the grown group spans two hosts
    (hierarchical algorithms), its results are exact."""
    results = run_threads(3, _member_waiting_for(1, before_step=1), transport="tcp", hosts=["h0", "h0", "h0"],
                          joiners=[(_joiner, "h1")])
    assert _sizes_and_sums_agree(results) and results[3][-1] == (4, 4.0)


def test_a_joiner_arriving_while_the_members_shrink_is_admitted_after():
    """Rank 3 leaves (its transport closes, as a killed rank's does) and the joiner comes at
    that moment: the members' step fails, they shrink to 3, then admit the joiner: 4 again."""
    left = threading.Event()

    def member(rank: int, size: int):
        sizes, step = [], 0
        while step < STEPS:
            if rank == 3 and step == 2:
                current().transport.close()  # gone, mid-job
                left.set()
                return "gone"
            if step == 4 and dist.get_rank() == 0:
                _await_joiners(1)  # it comes in by step 4 at the latest
            try:
                sizes.append(_step(step))
                step += 1
            except dist.DistError as error:
                dist.shrink_group(sorted(error.dead_ranks))
        return sizes

    def joiner(join):
        left.wait(30)
        return _joiner(join)

    results = run_threads(4, member, joiners=[(joiner, None)])
    assert results[3] == "gone"
    assert _sizes_and_sums_agree([results[0], results[1], results[2], results[4]])
    assert results[0][-1] == (4, 4.0) and results[4][-1] == (4, 4.0)
