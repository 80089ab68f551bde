"""Ranks joining a running job (admit_joiners, a joining init_process_group): thread-ranks over
the loopback and over tcp with shared memory; the cases a replacement meets: one joiner, two at
once, one that dies while joining, one arriving while the members shrink, one on a host the
job has no rank on. Real processes (pydist-run --on-failure replace) are tests/test_launcher_replace.py."""
from __future__ import annotations

import threading
from datetime import timedelta

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
                                                                    world.started)[0]) < count:
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


# -- Elastic: admission, healing and recovery in a training loop ------------------------------
def _training(job_state, steps: int = STEPS, leave_at: tuple[int, int] | None = None):
    """A loop on pydist.Elastic over a numpy "model" every rank updates alike; ``leave_at``:
    (global rank at start, step) of a rank that goes. Returns (steps run, final weights, world
    size, step, whether a sync saw the world change)."""
    def run(rank=None, size=None, join=None):
        if join is not None:
            join()
        weights = np.zeros(1000)
        job = dist.Elastic({"weights": weights, **job_state()}, progress={"step": 0})
        changes = 0
        first = dist.get_rank()
        while job.progress["step"] < steps:
            changes += job.sync()
            if leave_at is not None and join is None and (first, job.progress["step"]) == leave_at:
                current().transport.close()
                return "gone"
            try:
                grad = np.full(1000, 1.0)
                dist.all_reduce(grad)
                weights += grad / dist.get_world_size()  # every rank: + 1
                job.progress["step"] += 1
            except dist.DistError as error:
                job.recover(error)
        return job.progress["step"], float(weights[0]), dist.get_world_size(), changes
    return run


def test_elastic_heals_a_joiner_with_the_members_state_and_progress():
    run = _training(dict)
    joiner_ready = threading.Event()

    def member(rank, size):
        if rank == 0:
            _await_joiners(1)
        return run(rank, size)

    results = run_threads(3, member, joiners=[(lambda join: run(join=join), None)])
    assert [r[:3] for r in results] == [(STEPS, float(STEPS), 4)] * 4  # the joiner's weights are the members'
    assert results[3][3] == 1 and joiner_ready is not None


def test_stripes_cover_the_bytes_once_and_small_states_go_whole():
    from pydist.api.heal import ALIGN, stripes_of
    assert stripes_of(100, 4) == [(0, 100)]  # under a MiB: one sender
    cuts = stripes_of(10 << 20, 4)
    assert len(cuts) == 4 and cuts[0][0] == 0 and cuts[-1][1] == 10 << 20
    assert all(a % ALIGN == 0 and cuts[k][1] == cuts[k + 1][0] for k, (a, _) in enumerate(cuts[:-1]))


def test_elastic_heals_torch_modules_and_optimizers_striped_over_members():
    """4 MiB of parameters and momentum, sent in two stripes by two members."""
    torch = pytest.importorskip("torch")

    def model_from(seed: int):
        """A model whose parameters come from its own generator (threads share torch's)."""
        model = torch.nn.Sequential(torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4))
        numbers = np.random.default_rng(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.from_numpy(numbers.standard_normal(tuple(p.shape)).astype(np.float32)))
        return model

    def torch_state():
        model = model_from(100)  # the members hold the same state, as data-parallel ranks do
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(2, 1024)).sum().backward()
        optimizer.step()  # momentum buffers exist on the members
        return {"model": model, "optimizer": optimizer}

    def member(rank, size):
        state = torch_state()
        if rank == 0:
            _await_joiners(1)
        job = dist.Elastic(state, progress={"step": 7}, stripes=2)
        job.sync()
        return [p.detach().clone() for p in state["model"].parameters()], state["optimizer"].state_dict()

    def joiner(join):
        join()
        state = {"model": model_from(7), "optimizer": None}
        state["optimizer"] = torch.optim.SGD(state["model"].parameters(), lr=0.5)
        job = dist.Elastic(state, progress={})
        job.sync()
        return [p.detach().clone() for p in state["model"].parameters()], state["optimizer"].state_dict(), job.progress

    results = run_threads(3, member, joiners=[(joiner, None)])
    params, optimizer, progress = results[3]
    assert progress == {"step": 7}
    assert all(torch.equal(a, b) for a, b in zip(params, results[0][0], strict=True))
    assert optimizer["param_groups"][0]["lr"] == 0.1 and len(optimizer["state"]) == 4
    assert all(torch.equal(optimizer["state"][k]["momentum_buffer"], results[0][1]["state"][k]["momentum_buffer"])
               for k in optimizer["state"])


def test_elastic_recovers_from_a_lost_rank_and_takes_its_replacement_in():
    left = threading.Event()
    run = _training(dict, leave_at=(3, 2))

    def member(rank, size):
        result = run(rank, size)
        if result == "gone":
            left.set()
        return result

    def joiner(join):
        left.wait(30)
        return run(join=join)

    results = run_threads(4, member, joiners=[(joiner, None)])
    assert results[3] == "gone"
    finished = [results[0], results[1], results[2], results[4]]
    assert [r[:2] for r in finished] == [(STEPS, float(STEPS))] * 4  # no step lost or counted twice
    assert all(r[3] >= 1 for r in finished)


def _rank_2_leaves_the_others_recover(rank: int, job) -> bool:
    """Rank 2 leaves (True there); the others fail an all_reduce and ``job.recover`` from it."""
    if rank == 2:
        current().transport.close()
        return True
    try:
        dist.all_reduce(np.ones(1))
    except dist.DistError as error:
        job.recover(error)
    return False


def test_elastic_recovery_resyncs_survivors_whose_progress_differs():
    """Rank 1 finished the step the others failed in (its progress and weights are ahead):
    after recover, every survivor holds rank 0's."""
    def member(rank: int, size: int):
        weights = np.full(10, float(rank == 1))
        job = dist.Elastic({"weights": weights}, progress={"step": 5 + (rank == 1)})
        if _rank_2_leaves_the_others_recover(rank, job):
            return "gone"
        return job.progress["step"], weights.tolist(), dist.get_world_size()

    results = run_threads(3, member)
    assert results[:2] == [(5, [0.0] * 10, 2)] * 2 and results[2] == "gone"


def test_elastic_sync_recovers_from_a_rank_lost_during_the_admission():
    """Rank 2 goes before the step boundary: the others fail inside sync (admit_joiners'
    broadcast), which shrinks past it and reports the change; the loop goes on."""
    def member(rank: int, size: int):
        weights = np.zeros(10)
        job = dist.Elastic({"weights": weights}, progress={"step": 0})
        if rank == 2:
            current().transport.close()
            return "gone"
        changed = job.sync()
        ones = np.ones(1)
        dist.all_reduce(ones)
        return changed, dist.get_world_size(), float(ones[0])

    results = run_threads(3, member)
    assert results[:2] == [(True, 2, 2.0)] * 2 and results[2] == "gone"


def test_a_leader_that_joined_later_does_not_take_in_joiners_decided_before_it_came():
    """Rank 0 may itself be a replacement (the first ranks were lost): it never handled the
    joiners decided before it came, whose ready marks stay in the store. The decision tells
    it; the chaos demo's members otherwise waited for a long-dead joiner and failed."""
    from pydist.store import HashStore
    base = HashStore()
    for _ in range(3):  # transport ranks 4, 5, 6 of a job that started with 4 ranks
        base.add(admission.JOINERS, 1)
    admission.mark_ready(base, admission.Ticket(4, "pydist/1", 4))
    admission.decide(base, [4], [], [0, 1, 2, 4], 2, 7)
    admission.mark_ready(base, admission.Ticket(5, "pydist/1", 4))
    assert admission.ready_joiners(base, set(), 4) == ([5], [4])
    assert admission.ready_joiners(base, {4}, 4) == ([5], [])


def test_after_recovering_in_a_step_the_next_sync_runs_no_admission():
    """A rank that recovered in a step (``recover``) and one that recovered inside ``sync``
    (it failed in the admission's broadcast, which others had passed: a tree broadcast over
    tcp) must go on with the same collectives: the next ``sync`` of the first reports the
    change without admitting anyone. Rank 1 here stands for the second kind (its sync is done)."""
    def member(rank: int, size: int):
        job = dist.Elastic({"weights": np.zeros(10)}, progress={"step": 0})
        if _rank_2_leaves_the_others_recover(rank, job):
            return "gone"
        changed = job.sync() if rank == 0 else True
        check = np.ones(1)
        dist.all_reduce(check)
        return changed, dist.get_world_size(), float(check[0])

    results = run_threads(3, member)
    assert results[:2] == [(True, 2, 2.0)] * 2 and results[2] == "gone"


@pytest.mark.parametrize("case", ["finished", "finished, rank 0 last", "its group failed"])
def test_only_a_healthy_rank_0_leaving_ends_the_job_for_joiners(case):
    """destroy_process_group on rank 0 tells waiting joiners the job ended, unless rank 0 is
    leaving a job that goes on without it (its group failed, or it was evicted: the chaos
    run's resumed rank 0 ended the job for its own replacement). Peers that left before it
    (the usual end of a job) do not make it unhealthy."""
    rank_1_left = threading.Event()

    def member(rank: int, size: int):
        base = admission.base_store(current().store)
        if case == "its group failed" and rank == 1:
            current().transport.close()
            return "gone"
        try:
            dist.all_reduce(np.ones(1))
        except dist.DistError:
            pass
        if case == "finished, rank 0 last" and rank == 0:
            assert rank_1_left.wait(60)  # generous: a loaded machine
        dist.destroy_process_group()
        rank_1_left.set()
        if case != "its group failed":
            base.wait([admission.ENDED], timedelta(seconds=60))  # rank 0 may leave after rank 1
        return base.check([admission.ENDED])

    results = run_threads(2, member)
    assert results == ([False, "gone"] if case == "its group failed" else [True, True])
