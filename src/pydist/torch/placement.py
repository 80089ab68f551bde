"""Which pydist world and group a torch group of the "pydist" backend runs on.

torch makes a backend per group (its default group and each ``new_group``), handing it a
store, the group rank and size, and the members' world ranks. The default group gets a
private pydist World of its own (its transport: connections to every rank, the host's
shared-memory rings; met through torch's store), which becomes the process's *host* world
(``host``). A later ``new_group`` on the native engine is a group of the host world, as
pydist's own ``new_group`` is: it shares the world's connections and rings, and costs only
its shared-memory arena, made at its first collective (a private world per group reserved
a set of rings each: 56 MiB at 8 ranks of one host). A group the host world cannot hold
gets a private world as the default group does: one on MPI, one whose default group is not
on this backend (``init_process_group("gloo")`` then ``new_group(backend="pydist")``), or
one whose members are not ranks of the host world.

``release(world, group)`` is what shutting a torch group down does: a private world (the
group is its default) is left; a group of the host world is destroyed, unless the world
already destroyed it (a shrink of the default group, or the default group shut down first:
torch shuts groups down in name order).
"""
from __future__ import annotations

from typing import Any

import torch.distributed as tdist

from ..groups.factory import leave, make_group, standalone_mpi_world, standalone_world
from ..groups.process_group import ProcessGroup
from ..groups.world import World
from ._store import TorchStore

_host: list[World] = []  # the latest default torch group's native world (at most one)


def host(world: World) -> None:
    """``world`` is the default torch group's (native) world: later groups join it."""
    _host[:] = [world]


def place(store: Any, rank: int, size: int, timeout: float, engine: str,
          global_ranks: list[int] | None) -> tuple[World, ProcessGroup]:
    """The world and group of a new torch group: group rank ``rank`` of ``size``, members
    ``global_ranks`` (torch's world ranks; None or empty: the default group), met through
    ``store`` where it needs a world of its own (see the module note)."""
    shared = _host_for(rank, size, engine, global_ranks)
    if shared is not None:
        assert global_ranks  # _host_for holds only groups with members
        group_id, name = shared.group_id(global_ranks)
        return shared, make_group(shared, global_ranks, group_id, name, timeout, desc="torch")
    if engine == "mpi":
        world = standalone_mpi_world(global_ranks, rank, size, timeout, "torch")
    else:
        world = standalone_world(TorchStore(store), rank, size, timeout, "torch",
                                 job=_job_position(rank, size, global_ranks))
    assert world.default_group is not None
    return world, world.default_group


def _host_for(rank: int, size: int, engine: str, global_ranks: list[int] | None) -> World | None:
    """The host world, when it can hold this group: a native one, alive, of which
    ``global_ranks`` are ranks, this process being member ``rank``."""
    if engine != "pydist" or not global_ranks or not _host:
        return None
    world = _host[0]
    if world.default_group is None or world.transport is None or len(global_ranks) != size:
        return None
    if len(set(global_ranks)) != size or not all(0 <= g < world.size for g in global_ranks):
        return None
    return world if global_ranks[rank] == world.rank else None


def release(world: World, group: ProcessGroup) -> None:
    """Shut a torch group down (see the module note)."""
    if group is world.default_group:
        leave(world)
    elif group in world.groups:
        group.destroy(timeout=group.timeout)
        world.remove_group(group)


def _job_position(rank: int, size: int, global_ranks: list[int] | None) -> tuple[int, int]:
    """This process's (rank, size) in torch's world: a subgroup's member ``rank`` is world rank
    ``global_ranks[rank]`` (of torch's world size; outside one, at least its highest member's);
    the default group (no ``global_ranks``) is the world."""
    if not global_ranks:
        return rank, size
    return global_ranks[rank], tdist.get_world_size() if tdist.is_initialized() else max(global_ranks) + 1
