"""Creating and destroying process groups: torch's names, signatures and errors."""
from __future__ import annotations

import atexit
import os
import warnings
from datetime import timedelta
from typing import Any

from ..algorithms.comm import Comm
from ..core.deadline import DEFAULT_PG_TIMEOUT, Deadline, to_seconds
from ..groups.process_group import ProcessGroup
from ..groups.progress import ProgressBoard
from ..groups.world import World, current, process_world
from ..algorithms.barrier_dissemination import barrier
from ..engines.native import NativeBackend
from ..rendezvous import rendezvous
from ..store import PrefixStore, TCPStore


class Backend(str):
    """torch's Backend: a lower-case backend name; ``Backend.PYDIST``, ``Backend.MPI``."""

    PYDIST = "pydist"
    MPI = "mpi"
    UNDEFINED = "undefined"
    backend_list = [PYDIST, MPI]

    def __new__(cls, name: str) -> "Backend":
        if not isinstance(name, str):
            raise TypeError(f"backend: expected a string, got {type(name).__name__}")
        value = name.lower()
        if value not in cls.backend_list:
            raise ValueError(f"backend: {name!r} is not a pydist backend; valid names: "
                             f"{', '.join(repr(b) for b in cls.backend_list)} (or None)")
        return super().__new__(cls, value)


class _NonGroupMember:
    """What new_group returns on ranks outside the group (torch's NON_GROUP_MEMBER)."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonGroupMember()


class _WorldProperty(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 - torch's name
        return current().default_group


class GroupMember(metaclass=_WorldProperty):
    """``GroupMember.WORLD`` (the default group, None before init) and ``NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


class group(metaclass=_WorldProperty):  # noqa: N801 - torch's name
    """``group.WORLD``: the default process group."""


def _not_initialized() -> ValueError:
    return ValueError("Default process group has not been initialized, please make sure to call "
                      "init_process_group.")


def _default_world() -> World:
    world = current()
    if world.default_group is None:
        raise _not_initialized()
    return world


def resolve_group(group: Any) -> ProcessGroup | None:
    """The ProcessGroup a call targets (None: the default); None for NON_GROUP_MEMBER."""
    if group is NON_GROUP_MEMBER:
        return None
    if group is None:
        return _default_world().default_group
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group: expected a ProcessGroup from new_group() or None, got {type(group).__name__}")
    return group


def member_group(group: Any, op: str) -> ProcessGroup | None:
    """The ProcessGroup that call ``op`` targets; None, with torch's warning, on a rank that
    is not a member (the call is then a no-op, as in torch)."""
    if group is None:  # the common case first
        target = current().default_group
        if target is not None:
            return target
    target = resolve_group(group)
    if target is None:
        warnings.warn(f"Running {op} on global rank {current().rank} which does not belong to the given group.",
                      stacklevel=3)
    return target


def _timeout_seconds(timeout: Any) -> float:
    seconds = to_seconds(timeout, DEFAULT_PG_TIMEOUT.total_seconds())
    assert seconds is not None  # a default was given
    if seconds <= 0:
        raise ValueError(f"timeout: expected a positive duration, got {timeout!r}")
    return seconds


def default_transport(rank: int, size: int, store, deadline: Deadline):
    """The world transport (tcp + shared memory) of ``rank``, met through ``store``."""
    from ..debug._registry import note_endpoint
    from ..transport.identity import advertise_address, host_identity
    from ..transport.world import WorldTransport
    from ..groups.world import local_host
    transport = WorldTransport(rank, size, store, deadline, advertise_address(store), local_host(), host_identity())
    note_endpoint(rank, transport.network.records[rank].where)
    return transport


def _make_transport(world: World, rank: int, size: int, store, deadline: Deadline):
    if world.transport_factory is not None:
        return world.transport_factory(rank, size, store, deadline)
    return default_transport(rank, size, store, deadline)


def _all_ready(transport, rank: int, size: int, deadline: Deadline) -> None:
    """The last step of setting up ranks: a barrier over the transport (group id 0, which no
    group has). The store may live in one of the ranks (env://): without it, that rank could
    return, finish and exit while a slower one still needs the store for its own setup."""
    barrier(Comm(transport, 0, list(range(size)), rank, 0, deadline, "init_process_group"))


def _job_rank_and_size(rank: int, size: int) -> tuple[int, int]:
    """This process's rank and size in its whole job, for a group outside pydist's world (the
    torch plugin's, in group ranks): RANK and WORLD_SIZE from the launcher, else the group's."""
    job_rank, job_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if job_rank.isdigit() and job_size.isdigit():
        return int(job_rank), int(job_size)
    return rank, size


def standalone_group(store, rank: int, size: int, timeout: float, name: str) -> ProcessGroup:
    """A group with a transport of its own, outside pydist's global state (what the torch
    plugin makes for each torch group); ``destroy()`` closes its transport too."""
    deadline = Deadline.after(timeout)
    transport = default_transport(rank, size, store, deadline)
    try:
        _all_ready(transport, rank, size, deadline)
    except BaseException:
        transport.close()
        raise
    ranks = list(range(size))
    group = ProcessGroup(name, 1, ranks, rank, NativeBackend(transport, 1, ranks, rank), timeout,
                         world=_job_rank_and_size(rank, size))
    group.owned_transport = transport
    return group


def standalone_mpi_group(global_ranks: list[int] | None, rank: int, size: int, timeout: float,
                         name: str) -> ProcessGroup:
    """``standalone_group`` over MPI: ``global_ranks`` are the members' MPI world ranks (see
    backends.mpi.standalone_backend)."""
    from ..engines.mpi import standalone_backend
    backend = standalone_backend(global_ranks, rank, size)
    return ProcessGroup(name, 1, list(range(size)), rank, backend, timeout, world=_job_rank_and_size(rank, size))


def _group_backend(world: World, group_id: int, members: list[int]):
    """The backend object of a new group of ``members`` (world ranks) on this rank, per the world's backend."""
    if world.backend_name == Backend.MPI:
        from ..engines.mpi import group_backend
        return group_backend(members)
    assert world.transport is not None  # init_process_group made it before any group
    return NativeBackend(world.transport, group_id, [world.transport_rank(m) for m in members],
                         members.index(world.rank))


def _init_mpi(world: World, rank: int, world_size: int, seconds: float, group_name: str) -> None:
    """The default group over MPI.COMM_WORLD: no store, no rendezvous (mpiexec did it), as
    torch's MPI backend; ``rank``/``world_size`` other than -1 must equal MPI's."""
    from ..engines.mpi import group_backend, rank_and_size
    rank, world_size = rank_and_size(rank, world_size)
    ranks = list(range(world_size))
    backend = group_backend(ranks)
    world.generation += 1
    world.store = world.owned_store = world.transport = None
    world.rank, world.size, world.backend_name = rank, world_size, Backend(Backend.MPI)
    group_id, _name = world.group_id(ranks)
    world.default_group = ProcessGroup(group_name or "default_pg", group_id, ranks, rank, backend, seconds)
    world.groups.append(world.default_group)


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None) -> None:
    """Join the default process group (torch's signature and rendezvous rules).

    ``backend="mpi"``: under mpiexec/srun, rank and world size come from MPI.COMM_WORLD
    (a ``rank``/``world_size`` that differs raises ValueError naming both); ``init_method``
    and ``store`` are not used, as by torch's MPI backend (MPI's launcher did the rendezvous).
    """
    world = current()
    if world.default_group is not None:
        raise ValueError("trying to initialize the default process group twice!")
    backend_name = Backend(backend or Backend.PYDIST)
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    seconds = _timeout_seconds(timeout)
    if backend_name == Backend.MPI:
        _init_mpi(world, rank, world_size, seconds, group_name)
        return
    owned = None
    if store is None:
        store, rank, world_size = rendezvous(init_method or "env://", rank, world_size,
                                             timedelta(seconds=seconds))
        owned = store
    elif world_size <= 0:
        raise ValueError(f"world_size: must be positive when store is given, got {world_size}")
    elif rank < 0:
        raise ValueError(f"rank: must be non-negative when store is given, got {rank}")
    if not 0 <= rank < world_size:
        if owned is not None:
            owned.close()
        raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
    world.generation += 1
    prefixed = PrefixStore(f"pydist/{world.generation}", store)
    deadline = Deadline.after(seconds)
    transport = progress = None
    try:
        transport = _make_transport(world, rank, world_size, prefixed, deadline)
        progress = ProgressBoard(prefixed, rank)  # writes its first record: before the barrier
        _all_ready(transport, rank, world_size, deadline)
    except BaseException:
        for each in (progress, transport, owned):
            if each is not None:
                each.close()
        raise
    world.store, world.owned_store, world.transport = prefixed, owned, transport
    world.rank, world.size, world.backend_name = rank, world_size, backend_name
    world.transport_ranks, world.store_host = None, 0 if isinstance(owned, TCPStore) else None
    ranks = list(range(world_size))
    group_id, name = world.group_id(ranks)
    default = ProcessGroup(group_name or "default_pg", group_id, ranks, rank,
                           _group_backend(world, group_id, ranks), seconds)
    world.progress = default.progress = progress
    world.default_group = default
    world.groups.append(default)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Destroy one group, or (None) every group, the transport and the store."""
    world = current()
    if group is NON_GROUP_MEMBER:
        return
    if world.default_group is None:
        raise _not_initialized()
    if group is not None and group is not world.default_group:
        group.destroy(timeout=group.timeout)
        if group in world.groups:
            world.groups.remove(group)
        return
    for each in reversed(world.groups):
        each.destroy(timeout=each.timeout)
    world.groups.clear()
    world.default_group = None
    if world.progress is not None:
        world.progress.close()
        world.progress = None
    if world.transport is not None:  # None for MPI
        world.transport.close()
    if world.owned_store is not None:
        world.owned_store.close()
    world.store = world.owned_store = world.transport = None
    world.rank = world.size = -1
    world.transport_ranks = world.store_host = None


def is_initialized() -> bool:
    return current().default_group is not None


def is_available() -> bool:
    return True


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 outside the group."""
    target = resolve_group(group)
    return -1 if target is None else target.rank()


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The size of ``group`` (default: the world); -1 outside the group."""
    target = resolve_group(group)
    return -1 if target is None else target.size()


def get_backend(group: ProcessGroup | None = None) -> Backend:
    target = resolve_group(group)
    if target is None:
        raise ValueError("Invalid process group specified")
    return Backend(target.backend.name)


def get_backend_config(group: ProcessGroup | None = None) -> str:
    """torch's device:backend string of the group: "cpu:pydist" or "cpu:mpi"."""
    return f"cpu:{get_backend(group)}"


def _check_ranks(ranks: list[int], world_size: int, what: str = "ranks") -> list[int]:
    checked = []
    for rank in ranks:
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"{what}: expected integers, got {rank!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"{what}: rank {rank} is outside the world [0, {world_size})")
        if rank in checked:
            raise ValueError(f"{what}: rank {rank} appears twice")
        checked.append(rank)
    return checked


def new_group(ranks: list[int] | None = None, timeout: timedelta | None = None, backend: str | None = None,
              pg_options: Any = None, use_local_synchronization: bool = False, group_desc: str | None = None,
              device_id: Any = None, sort_ranks: bool = True) -> ProcessGroup | _NonGroupMember:
    """A group of some ranks of the world; non-members get NON_GROUP_MEMBER.

    Groups share the world's connections; creating one sends nothing (MPI: the members
    create a communicator, MPI_Comm_create_group). A group's backend is the world's.
    """
    world = _default_world()
    if backend is not None and Backend(backend) != world.backend_name:
        raise ValueError(f"backend: {backend!r} differs from the default group's {world.backend_name!r}; "
                         "a group uses the backend init_process_group chose")
    members = _check_ranks(list(range(world.size)) if ranks is None else list(ranks), world.size)
    if not members:
        raise ValueError("ranks: a group needs at least one rank")
    if sort_ranks:
        members.sort()
    group_id, name = world.group_id(members)
    if world.rank not in members:
        return NON_GROUP_MEMBER
    assert world.default_group is not None  # _default_world() raises before init
    seconds = world.default_group.timeout if timeout is None else _timeout_seconds(timeout)
    created = ProcessGroup(name, group_id, members, world.rank, _group_backend(world, group_id, members),
                           seconds, desc=group_desc or "", world=(world.rank, world.size))
    created.progress = world.progress
    world.groups.append(created)
    return created


def new_subgroups_by_enumeration(ranks_per_subgroup_list: list[list[int]], timeout: timedelta | None = None,
                                 backend: str | None = None, pg_options: Any = None,
                                 group_desc: str | None = None):
    """(this rank's subgroup, all subgroups) for explicit disjoint rank lists."""
    if not ranks_per_subgroup_list:
        raise ValueError("ranks_per_subgroup_list: expected a non-empty list of rank lists")
    seen: dict[int, int] = {}
    for index, ranks in enumerate(ranks_per_subgroup_list):
        for rank in ranks:
            if rank in seen:
                raise ValueError(f"Rank {rank} has appeared in both subgroup {seen[rank]} and subgroup {index}")
            seen[rank] = index
    current_group, subgroups = None, []
    for ranks in ranks_per_subgroup_list:
        created = new_group(ranks, timeout=timeout, backend=backend, group_desc=group_desc)
        subgroups.append(created)
        if created is not NON_GROUP_MEMBER:
            current_group = created
    return current_group, subgroups


def new_subgroups(group_size: int | None = None, group: ProcessGroup | None = None,
                  timeout: timedelta | None = None, backend: str | None = None, pg_options: Any = None,
                  group_desc: str | None = None):
    """Split ``group`` (default: world) into consecutive subgroups of ``group_size`` ranks."""
    parent = resolve_group(group)
    ranks = parent.ranks if parent is not None else list(range(_default_world().size))
    if group_size is None:
        raise ValueError("group_size: required on CPU (torch defaults it to the number of GPUs per node)")
    if group_size <= 0 or len(ranks) % group_size:
        raise ValueError(f"group_size: must be positive and divide the group size {len(ranks)}, got {group_size}")
    lists = [ranks[i:i + group_size] for i in range(0, len(ranks), group_size)]
    return new_subgroups_by_enumeration(lists, timeout=timeout, backend=backend, group_desc=group_desc)


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    target = resolve_group(group)
    if target is None:
        raise ValueError("group: this rank is not a member (NON_GROUP_MEMBER has no ranks)")
    return target.ranks


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    target = resolve_group(group)
    index = None if target is None else target.group_rank_of(global_rank)
    if index is None:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return index


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    target = resolve_group(group)
    if target is None or not 0 <= group_rank < target.size():
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return target.ranks[group_rank]


@atexit.register
def _destroy_at_exit() -> None:
    """Destroy the process's groups at interpreter exit (best effort: the process is ending)."""
    if process_world().default_group is not None:
        try:
            destroy_process_group()
        except Exception:  # noqa: BLE001 - nothing can be reported any more
            pass
