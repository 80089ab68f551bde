"""Misuse of ranks and groups: bad new_group ranks, bad src/dst, gather_list/scatter_list on
the wrong rank, a group argument of the wrong type; a rank outside a group gets a warning
and a no-op, members get none (helpers: tests/misuse_support.py)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from misuse_support import clean_process_world, misuse, run2, transport  # noqa: F401 - fixtures used by every test here

import pydist as dist
from pydist.testing import run_processes

# -- new_group ------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, exc, match", [
    ([0, 0], ValueError, "twice|duplicate"),
    ([1, 0, 1], ValueError, "twice|duplicate"),
    ([0, 2], ValueError, "2"),
    ([0, 7], ValueError, "7"),
    ([-1, 0], ValueError, "-1"),
    (["0"], TypeError, "ranks"),
])
def test_new_group_bad_ranks(ranks, exc, match, transport):
    def fn(rank, size):
        with pytest.raises(exc, match=match) as info:
            dist.new_group(ranks)
        assert "rank" in str(info.value)

    run2(fn, transport)


# -- bad src / dst --------------------------------------------------------------------------

BAD_PEER = {
    "broadcast-src-out-of-range": (lambda r: dist.broadcast(np.ones(2), src=2), ValueError, r"\bsrc\b"),
    "broadcast-src-negative": (lambda r: dist.broadcast(np.ones(2), src=-1), ValueError, r"\bsrc\b"),
    "broadcast-src-missing": (lambda r: dist.broadcast(np.ones(2)), ValueError, r"\bsrc\b"),
    "broadcast-src-str": (lambda r: dist.broadcast(np.ones(2), src="0"), TypeError, r"\bsrc\b"),
    "broadcast-group_src-out-of-range": (lambda r: dist.broadcast(np.ones(2), group_src=2), ValueError,
                                         r"\bgroup_src\b"),
    "broadcast-src-and-group_src": (lambda r: dist.broadcast(np.ones(2), src=0, group_src=0), ValueError,
                                    r"\bsrc\b"),
    "reduce-dst": (lambda r: dist.reduce(np.ones(2), dst=2), ValueError, r"\bdst\b"),
    "gather-dst": (lambda r: dist.gather(np.ones(2), dst=5), ValueError, r"\bdst\b"),
    "scatter-src": (lambda r: dist.scatter(np.ones(2), src=-3), ValueError, r"\bsrc\b"),
    "send-dst-out-of-range": (lambda r: dist.send(np.ones(2), dst=2), ValueError, r"\bdst\b"),
    "send-to-self": (lambda r: dist.send(np.ones(2), dst=r), ValueError, r"\bdst\b"),
    "recv-src-out-of-range": (lambda r: dist.recv(np.ones(2), src=9), ValueError, r"\bsrc\b"),
    "recv-from-self": (lambda r: dist.recv(np.ones(2), src=r), ValueError, r"\bsrc\b"),
    "isend-dst-negative": (lambda r: dist.isend(np.ones(2), dst=-1), ValueError, r"\bdst\b"),
    "irecv-src-out-of-range": (lambda r: dist.irecv(np.ones(2), src=7), ValueError, r"\bsrc\b"),
    "send-tag-str": (lambda r: dist.send(np.ones(2), dst=1 - r, tag="x"), TypeError, r"\btag\b"),
}


@pytest.mark.parametrize("case", list(BAD_PEER))
def test_bad_src_dst(case, transport):
    call, exc, match = BAD_PEER[case]

    def fn(rank, size):
        with pytest.raises(exc, match=match):
            call(rank)

    run2(fn, transport)


# -- a rank outside the group: no-op with a warning -----------------------------------------

def test_non_member_all_reduce_warns(transport):
    def fn(rank, size):
        group = dist.new_group([0])
        tensor = np.array([1.0, 2.0, 3.0]) * (rank + 1)
        if rank == 1:
            assert group is dist.GroupMember.NON_GROUP_MEMBER
            with pytest.warns(UserWarning, match="all_reduce"):
                assert dist.all_reduce(tensor, group=group) is None
            assert tensor.tolist() == [2.0, 4.0, 6.0]  # untouched
            assert (dist.get_rank(group), dist.get_world_size(group)) == (-1, -1)
        else:
            dist.all_reduce(tensor, group=group)
            assert tensor.tolist() == [1.0, 2.0, 3.0]

    run2(fn, transport)


@pytest.mark.slow
def test_non_member_calls_warn_process():
    results = run_processes(2, misuse.non_member_calls, init="tcp", timeout=60)
    outside = results[1]
    assert outside["is_non_member"] and outside["rank_in_group"] == (-1, -1)
    assert outside["tensor"] == [1.0, 2.0, 3.0]
    for name in ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "barrier", "isend",
                 "irecv"]:
        assert outside[name]["returned"] == "None", (name, outside[name])
        warned = outside[name]["warnings"]
        assert len(warned) == 1 and warned[0][0] == "UserWarning" and name in warned[0][1], (name, warned)
    assert results[0]["tensor"] == [0.0, 1.0, 2.0]


# -- gather_list / scatter_list on the wrong rank -------------------------------------------

def test_gather_list_on_non_dst(transport):
    def fn(rank, size):
        if rank == 1:
            with pytest.raises(ValueError, match="gather_list"):
                dist.gather(np.ones(2), [np.zeros(2), np.zeros(2)], dst=0)
            with pytest.raises(ValueError, match="scatter_list"):
                dist.scatter(np.ones(2), [np.zeros(2), np.zeros(2)], src=0)

    run2(fn, transport)


def test_group_argument_of_wrong_type(transport):
    def fn(rank, size):
        with pytest.raises(TypeError, match="group"):
            dist.all_reduce(np.ones(2), group="world")

    run2(fn, transport)


def test_no_warning_for_members(transport):
    """Control for the non-member tests: members calling on their group get no warning."""

    def fn(rank, size):
        group = dist.new_group([0, 1])
        tensor = np.ones(2)
        if rank == 1:  # catch_warnings is process-wide: one thread-rank only
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dist.all_reduce(tensor, group=group)
            assert not caught, [str(w.message) for w in caught]
        else:
            dist.all_reduce(tensor, group=group)
        return tensor.tolist()

    assert run2(fn, transport) == [[2.0, 2.0], [2.0, 2.0]]
