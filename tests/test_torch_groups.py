"""torch's new_groups on the "pydist" backend are groups of the default group's world, as
pydist's own new_groups are (pydist.torch.placement): no connections, rings or threads of
their own, only an arena at their first collective. A group the default group's world
cannot hold (the default group on gloo) gets a world of its own. Destroying, shrinking and
shutting down keep torch's semantics. (Their /dev/shm use: tests/test_adversarial_shm_full.py.)"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

from pydist.testing import run_processes  # noqa: E402
from pydist.torch.regroup import regrouping_supported  # noqa: E402


def _shared(rank, size):
    world = tdist.group.WORLD.pydist_world
    pair, every = tdist.new_group([0, 1]), tdist.new_group()
    out = {"pair_shares": rank < 2 and pair.pydist_world is world, "every_shares": every.pydist_world is world,
           "groups_in_world": len(world.groups)}
    t = torch.full((2,), rank + 1.0)
    if rank < 2:
        tdist.all_reduce(t, group=pair)
        out["pair"] = t.tolist()
        tdist.destroy_process_group(pair)
        with pytest.raises(ValueError, match="was shut down"):
            pair.pydist_group  # noqa: B018 - the property raises
    t = torch.ones(1)
    tdist.all_reduce(t, group=every)  # the world and the other groups live on
    out["every"] = t.item()
    t = torch.ones(1)
    tdist.all_reduce(t)
    out["default"] = t.item()
    out["groups_left"] = len(world.groups)
    return out


@pytest.mark.slow
def test_new_groups_are_groups_of_the_default_groups_world():
    results = run_processes(3, _shared, init="torch", timeout=180)
    assert [r["pair_shares"] for r in results] == [True, True, False]
    assert all(r["every_shares"] for r in results)
    assert [r["groups_in_world"] for r in results] == [3, 3, 2]  # the default group, the pair (ranks 0, 1), every
    assert [r.get("pair") for r in results] == [[3.0, 3.0], [3.0, 3.0], None]
    assert all(r["every"] == 3.0 and r["default"] == 3.0 for r in results)
    assert [r["groups_left"] for r in results] == [2, 2, 2]  # the pair destroyed alone


def _on_gloo(rank, size):
    import pydist.torch  # noqa: F401 - registers the backend
    group = tdist.new_group(backend="pydist")
    t = torch.full((1,), rank + 1.0)
    tdist.all_reduce(t, group=group)
    return group.pydist_world.default_group is group.pydist_group, t.item()


@pytest.mark.slow
def test_a_pydist_group_beside_a_gloo_default_group_gets_a_world_of_its_own():
    assert run_processes(2, _on_gloo, init="gloo", timeout=180) == [(True, 3.0)] * 2


def _subgroup_shrinks(rank, size):
    import pydist.torch
    sub = tdist.new_group()
    if rank == 2:
        return None
    shrunk = pydist.torch.shrink_group([2], group=sub)
    t = torch.ones(1)
    tdist.all_reduce(t, group=shrunk)
    return shrunk.size(), t.item(), shrunk.pydist_world is tdist.group.WORLD.pydist_world


@pytest.mark.slow
@pytest.mark.skipif(not regrouping_supported(), reason="this torch lacks the internals a regrouping needs")
def test_a_new_group_shrinks_in_the_default_groups_world():
    """Rank 2 leaves the subgroup (it stays in the job): ranks 0 and 1 shrink the subgroup to a new
    group of the same world, torch DDP's way of going on without a rank."""
    assert run_processes(3, _subgroup_shrinks, init="torch", timeout=180) == [(2, 2.0, True)] * 2 + [None]
