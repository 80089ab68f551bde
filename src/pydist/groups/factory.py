"""Where worlds are joined and groups are made: the one place a ProcessGroup is built.

- ``join_native(world, ...)``: the world's transport over a store (tcp and shared memory
  from the registry, or the world's ``transport_factory``), its progress board, a barrier
  of every rank; then ``World.join``.
- ``join_mpi(world, ...)``: a world on MPI.COMM_WORLD (no store, no transport).
- ``make_group(world, global_ranks, ...)``: a group of the world: its engine (native over
  the world's transport, or MPI), its state kept by the world's GroupStates, its progress
  board and flight recorder; kept by the world. A default group's engine sets up its shared
  memory there (``Engine.prepare``), not in its first operation: every member makes it.
- ``standalone_world(...)`` / ``standalone_mpi_world(...)``: a private world of one default
  group, outside the process's state: what the torch plugin makes for its default group
  (its new_groups are groups of that world) and for a group that world cannot hold (on
  MPI, beside a default group of another backend, or of ranks outside it: see
  pydist.torch.placement).
"""
from __future__ import annotations

import os
from typing import Any

from ..algorithms.barrier_dissemination import barrier
from ..algorithms.comm import Comm
from ..core import init_marks
from ..core.deadline import Deadline
from ..core.errors import DistError, DistNetworkError
from ..core.settings import settings
from ..net.auth import warn_if_open
from ..rendezvous import launch_attempt
from ..store import PrefixStore, Store
from ..transport.world import SETUP_GROUP, WorldTransport
from .admission import Ticket, base_store, end_job, found_job
from .process_group import ProcessGroup
from .progress import ProgressBoard
from .state import GroupStates
from .world import World, local_host

MPI = "mpi"  # the engine name of MPI worlds (torch's Backend.MPI)


def default_transport(rank: int, size: int, store: Any, deadline: Deadline, events: GroupStates,
                      joining: bool = False) -> WorldTransport:
    """The world transport (tcp + shared memory) of ``rank``, met through ``store`` (``joining``:
    a rank joining a running job, see groups.admission)."""
    from ..debug._registry import note_endpoint
    from ..transport.identity import advertise_address, host_identity
    found = settings()
    transport = WorldTransport(rank, size, store, deadline, events, found, advertise_address(store, found),
                               local_host(), host_identity(found), joining=joining)
    note_endpoint(rank, transport.network.endpoint())
    return transport


def join_native(world: World, rank: int, size: int, store: Any, timeout: float, backend_name: str,
                owned_store: Store | None = None, store_host: int | None = None) -> None:
    """Make ``world`` rank ``rank`` of ``size``: its transport met through a new namespace of
    ``store`` (a pydist Store, or a torch group's: pydist.torch._store.TorchStore),
    its progress board, then a barrier of every rank over the transport (a peer whose setup
    failed aborts it, see WorldTransport: this rank then fails at once, naming why). The
    store may live in one of the ranks (env://): without the barrier, that rank could
    return, finish and exit while a slower one still needs the store for its own setup.
    Releases what it made (and ``owned_store``) when it fails. The job's rank 0 (``world.job``'s rank, else ``rank``)
    warns when the job is open (net.auth.warn_if_open, once its listeners are bound): a torch
    subgroup's rank 0 does not."""
    scoped = namespace(world, store)
    deadline = Deadline.after(timeout)
    transport = progress = None
    try:
        factory = world.transport_factory or default_transport
        transport = factory(rank, size, scoped, deadline, world.states, False)
        world.states.carrier = transport  # a peer's death or abort fails the barrier below at once
        init_marks.mark(init_marks.TRANSPORT_READY)
        if (world.job or (rank, size))[0] == 0 and world.transport_factory is None:  # is anyone let in?
            warn_if_open(store, transport.network.listening_addresses())
        progress = ProgressBoard(scoped, rank, size)  # writes its first record: before the barrier
        barrier(Comm(transport, SETUP_GROUP, list(range(size)), rank, 0, deadline, "init_process_group"))
    except BaseException:
        for each in (progress, transport, owned_store):
            if each is not None:
                each.close()
        world.leave()  # empty again, what it learnt of its peers too: a retry starts afresh
        raise
    world.join(rank, size, backend_name, scoped, owned_store, transport, progress, store_host)
    if rank == 0:  # ranks may join this job later
        found_job(store, f"pydist/{world.generation}", size)


def namespace(world: World, store: Any) -> Any:
    """A new namespace of ``store`` (a pydist store or a torch group's, see
    pydist.torch._store) for ``world``'s keys."""
    return prefixed(store, f"pydist/{world.next_generation()}")


def prefixed(store: Any, prefix: str) -> Any:
    """The namespace ``prefix`` of ``store``."""
    return PrefixStore(prefix, store) if isinstance(store, Store) else store.prefixed(prefix)


def join_mpi(world: World, rank: int = -1, size: int = -1, transport_ranks: list[int] | None = None) -> None:
    """Make ``world`` a world on MPI.COMM_WORLD: rank and size from MPI (a ``rank``/``size``
    other than -1 must equal MPI's); ``transport_ranks``: the MPI ranks of its members (a
    torch group's private world: every torch group on MPI has one), None for COMM_WORLD itself."""
    from ..engines.mpi import rank_and_size
    if transport_ranks is None:
        rank, size = rank_and_size(rank, size)
    world.next_generation()
    world.join(rank, size, MPI, transport_ranks=transport_ranks)


def joining_transport(world: World, ticket: Ticket, base: Store, deadline: Deadline) -> WorldTransport:
    """A joining rank's transport (listening; the job's ranks connect to it when they admit it)."""
    factory = world.transport_factory or default_transport
    return factory(ticket.transport_rank, ticket.size, prefixed(base, ticket.namespace), deadline, world.states,
                   True)


def join_admitted(world: World, transport: WorldTransport, ticket: Ticket, decision: dict[str, Any], base: Store,
                  timeout: float, owned_store: Store | None) -> ProcessGroup:
    """A joiner the job admitted (``decision``, see groups.admission): connect to the members,
    join the world in the members' namespace, make the default group they made."""
    members = decision["members"]
    unreachable = transport.connect(members, Deadline.after(timeout))
    if unreachable:
        raise DistNetworkError(f"rank joining as transport rank {ticket.transport_rank}: could not reach the "
                               f"job's ranks {unreachable} (transport ranks) after they admitted it")
    store = prefixed(base, f"pydist/{world.next_generation(at_least=decision['generation'])}")
    rank = members.index(ticket.transport_rank)
    world.join(rank, len(members), "pydist", store, owned_store, transport, ProgressBoard(store, rank, len(members)),
               transport_ranks=members, started=ticket.size)
    return make_group(world, list(range(len(members))), decision["group_id"], _group_name(decision["group_id"]),
                      timeout, "default:grown", default=True)


def rebuild_default(world: World, members: list[int], group_id: int, timeout: float, desc: str, drain: float,
                    owned_store: Store | None = None, store_host: int | None = None) -> ProcessGroup:
    """The world's default group, shrunk or grown to ``members`` (transport ranks): every
    group destroyed (the default one first given ``drain`` seconds to finish its queue),
    global ranks 0..n-1, a new namespace of the store (``owned_store``: a new store, served
    by ``store_host``, when the old one's host is gone), a new progress board."""
    parent = world.default_group
    for each in reversed(world.groups):
        each.destroy(timeout=drain if each is parent else 0.0)
        world.remove_group(each)
    assert world.store is not None  # a native world keeps its store
    store = namespace(world, owned_store or base_store(world.store))
    me = members.index(world.transport_rank(world.rank))
    world.renumber(members, store, ProgressBoard(store, me, len(members)), owned_store, store_host)
    return make_group(world, list(range(len(members))), group_id, _group_name(group_id), timeout, desc, default=True)


def _group_name(group_id: int) -> str:
    return f"pg-{group_id:016x}"[:20]


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
    if default:  # every member makes it now (init, a shrink or grow, a torch group): set up ahead
        try:
            engine.prepare(Deadline.after(timeout))
        except BaseException:
            engine.close()
            raise
    group = ProcessGroup(name, group_id, global_ranks, world.rank, engine, state, timeout, desc=desc,
                         job=world.job_rank_and_size(), progress=world.progress, transport_ranks=transport_ranks)
    return world.add_group(group, default)


def launch_position() -> tuple[int, int] | None:
    """This process's rank and size in its whole job, from the launcher (RANK, WORLD_SIZE),
    for a world the torch plugin makes (standalone_world, join_standalone); None when they are not set."""
    job_rank, job_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    return (int(job_rank), int(job_size)) if job_rank.isdigit() and job_size.isdigit() else None


def attempt_store(store: Any) -> Any:
    """``store``'s namespace of this launch attempt (see rendezvous.launch_attempt), or ``store`` itself."""
    scope = launch_attempt()
    return prefixed(store, scope) if scope else store


def standalone_world(store: Any, rank: int, size: int, timeout: float, name: str,
                     job: tuple[int, int] | None = None) -> World:
    """A private world of ``size`` ranks met through ``store`` (in this launch attempt's
    namespace), with one default group named ``name``; ``world.leave()`` releases it. ``job``:
    this process's (rank, size) in the whole job (default: launch_position()). The store
    lives in rank 0 (torch's env://) unless a launcher's agent serves it
    (TORCHELASTIC_USE_AGENT_STORE=True, as torch reads it): then a shrink past rank 0 keeps it."""
    world = World(job=job or launch_position())
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    join_native(world, rank, size, attempt_store(store), timeout, "pydist", store_host=None if agent_store else 0)
    group_id, _ = world.group_id(list(range(size)))
    make_group(world, list(range(size)), group_id, name, timeout, default=True)
    return world


def standalone_mpi_world(global_ranks: list[int] | None, rank: int, size: int, timeout: float, name: str) -> World:
    """``standalone_world`` over MPI: ``global_ranks`` are the members' MPI world ranks (None
    or empty: the MPI world, whose rank and size must then be ``rank`` and ``size``)."""
    from ..engines.mpi import check_group_rank
    world = World(job=launch_position())
    join_mpi(world, rank, size, check_group_rank(global_ranks, rank, size))
    group_id, _ = world.group_id(list(range(size)))
    make_group(world, list(range(size)), group_id, name, timeout, default=True)
    return world


def leave(world: World, finished: bool = True) -> None:
    """``world.leave()``; when the job ``finished`` (destroy_process_group called, not at
    exit), its rank 0, healthy, first tells the joiners still waiting that the job ended
    (nobody will admit them: see admission.await_decision). A rank 0 that was evicted, or
    whose group failed, is leaving a job that goes on without it; peers that left before it
    (known dead now) are the usual end of a job, not a failure."""
    group = world.default_group
    healthy = (group is not None and world.states.evicted_by is None and group.state.failed is None
               and group.state.aborted is None)
    if finished and healthy and world.rank == 0 and world.backend_name == "pydist" and world.store is not None:
        try:
            end_job(base_store(world.store))
        except (DistError, OSError):  # best effort: the store may be gone with its host
            pass
    world.leave()
