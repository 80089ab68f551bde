"""Where worlds are joined and groups are made: the one place a ProcessGroup is built.

- ``join_native(world, ...)``: the world's transport over a store (tcp and shared memory
  from the registry, or the world's ``transport_factory``), its progress board, a barrier
  of every rank; then ``World.join``.
- ``join_mpi(world, ...)``: a world on MPI.COMM_WORLD (no store, no transport).
- ``make_group(world, global_ranks, ...)``: a group of the world: its engine (native over
  the world's transport, or MPI), its state kept by the world's GroupStates, its progress
  board and flight recorder; kept by the world.
- ``standalone_world(...)`` / ``standalone_mpi_world(...)``: a private world of one default
  group, outside the process's state: what the torch plugin makes for each torch group.
"""
from __future__ import annotations

import os
from typing import Any

from ..algorithms.barrier_dissemination import barrier
from ..algorithms.comm import Comm
from ..core.deadline import Deadline
from ..core.settings import settings
from ..store import PrefixStore, Store
from ..transport.world import WorldTransport
from .process_group import ProcessGroup
from .progress import ProgressBoard
from .state import GroupStates
from .world import World, local_host

MPI = "mpi"  # the engine name of MPI worlds (torch's Backend.MPI)


def default_transport(rank: int, size: int, store: Any, deadline: Deadline, events: GroupStates) -> WorldTransport:
    """The world transport (tcp + shared memory) of ``rank``, met through ``store``."""
    from ..debug._registry import note_endpoint
    from ..transport.identity import advertise_address, host_identity
    found = settings()
    transport = WorldTransport(rank, size, store, deadline, events, found, advertise_address(store, found),
                               local_host(), host_identity(found))
    note_endpoint(rank, transport.network.endpoint())
    return transport


def join_native(world: World, rank: int, size: int, store: Any, timeout: float, backend_name: str,
                owned_store: Store | None = None, store_host: int | None = None) -> None:
    """Make ``world`` rank ``rank`` of ``size``: its transport met through a new namespace of
    ``store`` (a pydist Store; another, a torch group's prefixed store, is used as it is),
    its progress board, then a barrier of every rank over the transport. The store may live
    in one of the ranks (env://): without the barrier, that rank could return, finish and
    exit while a slower one still needs the store for its own setup. Releases what it made
    (and ``owned_store``) when it fails."""
    prefixed = namespace(world, store)
    deadline = Deadline.after(timeout)
    transport = progress = None
    try:
        factory = world.transport_factory or default_transport
        transport = factory(rank, size, prefixed, deadline, world.states)
        progress = ProgressBoard(prefixed, rank)  # writes its first record: before the barrier
        barrier(Comm(transport, 0, list(range(size)), rank, 0, deadline, "init_process_group"))  # group id 0: none
    except BaseException:
        for each in (progress, transport, owned_store):
            if each is not None:
                each.close()
        raise
    world.join(rank, size, backend_name, prefixed, owned_store, transport, progress, store_host)


def namespace(world: World, store: Any) -> Any:
    """A new namespace of ``store`` for ``world``'s keys (a torch store, already one per torch
    group, is used as it is)."""
    generation = world.next_generation()
    return PrefixStore(f"pydist/{generation}", store) if isinstance(store, Store) else store


def join_mpi(world: World, rank: int = -1, size: int = -1, transport_ranks: list[int] | None = None) -> None:
    """Make ``world`` a world on MPI.COMM_WORLD: rank and size from MPI (a ``rank``/``size``
    other than -1 must equal MPI's); ``transport_ranks``: the MPI ranks of its members (a
    torch group's private world), None for COMM_WORLD itself."""
    from ..engines.mpi import rank_and_size
    if transport_ranks is None:
        rank, size = rank_and_size(rank, size)
    world.next_generation()
    world.join(rank, size, MPI, transport_ranks=transport_ranks)


def make_group(world: World, global_ranks: list[int], group_id: int, name: str, timeout: float, desc: str = "",
               default: bool = False) -> ProcessGroup:
    """Group ``group_id`` of ``world``'s ranks ``global_ranks`` (this rank among them), kept by
    the world (``default``: as its default group)."""
    transport_ranks = [world.transport_rank(g) for g in global_ranks]
    state = world.states.register(group_id, transport_ranks)
    engine: Any
    if world.backend_name == MPI:
        from ..engines.mpi import group_engine
        engine = group_engine(transport_ranks, labels=list(global_ranks))
    else:
        from ..engines.native import NativeEngine
        assert world.transport is not None  # join_native made it before any group
        engine = NativeEngine(world.transport, group_id, transport_ranks, global_ranks.index(world.rank), state,
                              settings())
    group = ProcessGroup(name, group_id, global_ranks, world.rank, engine, state, timeout, desc=desc,
                         job=world.job_rank_and_size(), progress=world.progress, transport_ranks=transport_ranks)
    return world.add_group(group, default)


def _job() -> tuple[int, int] | None:
    """This process's rank and size in its whole job, from the launcher (RANK, WORLD_SIZE),
    for a private world (one torch group of the job); None when they are not set."""
    job_rank, job_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return (int(job_rank), int(job_size)) if job_rank.isdigit() and job_size.isdigit() else None


def standalone_world(store: Any, rank: int, size: int, timeout: float, name: str) -> World:
    """A private world of ``size`` ranks met through ``store``, with one default group named
    ``name``; ``world.leave()`` releases it."""
    world = World(job=_job())
    join_native(world, rank, size, store, timeout, "pydist", store_host=0)
    group_id, _ = world.group_id(list(range(size)))
    make_group(world, list(range(size)), group_id, name, timeout, default=True)
    return world


def standalone_mpi_world(global_ranks: list[int] | None, rank: int, size: int, timeout: float, name: str) -> World:
    """``standalone_world`` over MPI: ``global_ranks`` are the members' MPI world ranks (None
    or empty: the MPI world, whose rank and size must then be ``rank`` and ``size``)."""
    from ..engines.mpi import check_group_rank
    world = World(job=_job())
    join_mpi(world, rank, size, check_group_rank(global_ranks, rank, size))
    group_id, _ = world.group_id(list(range(size)))
    make_group(world, list(range(size)), group_id, name, timeout, default=True)
    return world
