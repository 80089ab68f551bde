"""shrink_group and split_group: survivors of a SIGKILL (any rank, the store's host, two at
once; shared memory and tcp) agree on one smaller group and all_reduce on it correctly; torch's
argument errors; split_group's groups (harness: tests/run_scripts/shrink_ranks.py)."""
from __future__ import annotations

import numpy as np
import pytest
from run_scripts import shrink_ranks

import pydist as dist
from pydist.testing import run_threads

TCP = {"PYDIST_SHM": "0"}


@pytest.mark.slow
@pytest.mark.parametrize("victims, env", [([2], {}), ([2], TCP), ([0], {}), ([0], TCP), ([1, 3], {})],
                         ids=["rank 2, shm", "rank 2, tcp", "rank 0 (store host), shm", "rank 0 (store host), tcp",
                              "ranks 1 and 3 at once, shm"])
def test_survivors_of_a_sigkill_shrink_the_world_and_all_reduce_on_it(victims, env):
    trial = shrink_ranks.shrink_trial(4, victims, delay=0.3, env=env)
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)
    survivors = [r for r in range(4) if r not in victims]
    reports = [trial["reports"][r] for r in survivors]
    assert sorted(r["new_rank"] for r in reports) == list(range(len(survivors)))  # renumbered in launch order
    assert [r["new_rank"] for r in reports] == list(range(len(survivors)))
    assert all(r["world_size"] == len(survivors) and r["members"] == list(range(len(survivors))) for r in reports)
    assert all(set(r["dead_ranks"]) <= set(victims) and r["dead_ranks"] for r in reports)
    assert [trial["exit_codes"][v] for v in victims] == [-9] * len(victims)
    assert all(trial["exit_codes"][r] == 0 for r in survivors)


@pytest.mark.slow
def test_a_rank_dying_during_the_shrink_is_shrunk_away_too():
    """Rank 2 is killed; rank 3 dies inside shrink_group, after its proposal reached the
    leader (so the decision still holds it): the new group's confirming barrier fails at
    every survivor, which shrink again; ranks 0 and 1 end in one group of 2."""
    trial = shrink_ranks.shrink_trial(4, [2], delay=0.3, env={"PYDIST_TEST_DIES_IN_SHRINK": "3"})
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)
    assert [trial["reports"][r]["members"] for r in (0, 1)] == [[0, 1], [0, 1]]
    assert trial["exit_codes"][2] == trial["exit_codes"][3] == -9


@pytest.mark.slow
def test_a_subgroup_shrinks_and_the_world_keeps_its_numbering():
    trial = shrink_ranks.shrink_trial(4, [1], delay=0.3, subgroup=True)
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)
    for rank in (0, 2, 3):
        report = trial["reports"][rank]
        assert report["members"] == [0, 2, 3] and report["world_rank"] == rank and report["world_size"] == 4


@pytest.mark.slow
def test_shrink_abort_fails_the_queued_work_and_shrinks():
    trial = shrink_ranks.shrink_trial(4, [3], delay=0.3, flags=dist.SHRINK_ABORT, async_in_flight=True)
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)


def _excluded_rank_stays_out(rank: int, size: int) -> list:
    if rank == 2:  # excluded while alive: it does not call shrink_group (torch's rule)
        return []
    shrunk = dist.shrink_group([2])
    buf = np.full(3, rank + 1.0)
    dist.all_reduce(buf)
    return [shrunk.rank(), shrunk.size(), dist.get_rank(), buf.tolist()]


def test_a_live_rank_can_be_excluded():
    results = run_threads(3, _excluded_rank_stays_out)
    assert results == [[0, 2, 0, [3.0] * 3], [1, 2, 1, [3.0] * 3], []]


@pytest.mark.parametrize("arguments, error, words", [
    (((1,),), TypeError, "ranks_to_exclude must be a list"),
    (([],), ValueError, "ranks_to_exclude cannot be empty"),
    (([5],), ValueError, "Rank 5 at index 0 is out of bounds for group size 3"),
    (([1, 1],), ValueError, "Duplicate rank 1"),
    (([1.0],), TypeError, "must be integers"),
    (([0, 1, 2],), ValueError, "Cannot exclude all 3 ranks"),
    (([1], None, 7), ValueError, "Invalid shrink_flags value: 7"),
])
def test_shrink_group_checks_its_arguments_as_torch_does(arguments, error, words):
    def check(rank, size):
        with pytest.raises(error, match=words.replace("(", r"\(")):
            dist.shrink_group(*arguments)
        return True
    assert run_threads(3, check) == [True] * 3


def test_an_excluded_rank_calling_shrink_group_is_an_error():
    def check(rank, size):
        with pytest.raises(RuntimeError, match=f"Current rank {rank} is in the exclusion list"):
            dist.shrink_group([rank])
        return True
    assert run_threads(2, check) == [True] * 2


def _split(rank: int, size: int) -> list:
    mine = dist.split_group(split_ranks=[[0, 2], [1, 3]])
    buf = np.full(2, rank, np.int64)
    dist.all_reduce(buf, group=mine)
    return [dist.get_process_group_ranks(mine), mine.rank(), buf.tolist()]


def test_split_group_gives_each_rank_its_split():
    assert run_threads(4, _split) == [[[0, 2], 0, [2, 2]], [[1, 3], 0, [4, 4]], [[0, 2], 1, [2, 2]],
                                      [[1, 3], 1, [4, 4]]]


def test_split_group_checks_its_lists():
    def check(rank, size):
        with pytest.raises(ValueError, match="rank 1 appears in more than one split"):
            dist.split_group(split_ranks=[[0, 1], [1]])
        with pytest.raises(ValueError, match="rank 7 is not a rank of the parent group"):
            dist.split_group(split_ranks=[[0, 7]])
        return dist.split_group(split_ranks=[[0]]) is None if rank == 1 else True
    assert run_threads(2, check) == [True, True]
