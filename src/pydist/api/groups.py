"""Groups and ranks: torch's names, signatures and errors (new_group, get_rank, Backend, ...).
Creating and destroying the default group is api.init's."""
from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

from ..core.deadline import DEFAULT_PG_TIMEOUT, to_seconds
from ..engines.base import Engine
from ..groups.factory import make_group
from ..groups.process_group import ProcessGroup
from ..groups.world import World, current


class Backend(str):
    """torch's Backend: a lower-case backend name; ``Backend.PYDIST``, ``Backend.MPI``."""

    PYDIST = "pydist"
    MPI = "mpi"
    UNDEFINED = "undefined"
    backend_list = [PYDIST, MPI]

    def __new__(cls, name: str) -> Backend:
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


def not_initialized() -> ValueError:
    return ValueError("Default process group has not been initialized, please make sure to call "
                      "init_process_group.")


def _default_world() -> World:
    world = current()
    if world.default_group is None:
        raise not_initialized()
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


def timeout_seconds(timeout: Any) -> float:
    seconds = to_seconds(timeout, DEFAULT_PG_TIMEOUT.total_seconds())
    assert seconds is not None  # a default was given
    if seconds <= 0:
        raise ValueError(f"timeout: expected a positive duration, got {timeout!r}")
    return seconds


def is_initialized() -> bool:
    """True between init_process_group and destroy_process_group."""
    return current().default_group is not None


def is_available() -> bool:
    """True: pydist is always available (torch.distributed's query)."""
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
    """The backend name of ``group`` (default: the world); ValueError outside the group."""
    target = resolve_group(group)
    if target is None:
        raise ValueError("Invalid process group specified")
    return Backend(target.engine.name)


def get_backend_impl(group: str | ProcessGroup | None = None, device: Any = None) -> Engine:
    """The engine that runs ``group``'s operations (default: the world's group; a group may be
    given by its name), as torch 2.14's get_backend_impl returns a group's backend
    implementation: pydist's native engine or its MPI one (an ``Engine``). Not the same result
    as torch's ``torch.distributed.get_backend_impl`` on a group of the torch plugin, which
    returns that torch group itself (the plugin's group is its own CPU backend). ``device``:
    None or the CPU (pydist runs host memory only); ValueError outside the group."""
    if isinstance(group, str):
        named = [g for g in current().groups if g.group_name == group]
        if not named:
            raise ValueError(f"group: no process group named {group!r} on this rank")
        group = named[0]
    target = resolve_group(group)
    if target is None:
        raise ValueError("Invalid process group specified")
    kind = getattr(device, "type", device)
    if kind is not None and (not isinstance(kind, str) or kind.split(":")[0] != "cpu"):
        raise ValueError(f"device: {device!r}; a pydist group runs host memory only (device None or 'cpu')")
    return target.engine


def set_timeout(timeout: timedelta, group: ProcessGroup | None = None) -> None:
    """Make ``timeout`` the default timeout of ``group``'s later operations (default: the
    world's group), overriding the one it was created with, as torch 2.14's set_timeout;
    ValueError outside the group."""
    target = resolve_group(group)
    if target is None:
        raise ValueError("Invalid process group specified")
    if timeout is None:
        raise TypeError("timeout: expected datetime.timedelta or seconds, got None")
    target.set_timeout(timeout_seconds(timeout))


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
    seconds = world.default_group.timeout if timeout is None else timeout_seconds(timeout)
    return make_group(world, members, group_id, name, seconds, desc=group_desc or "")


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
    """The global ranks of ``group``'s members, in group-rank order; ValueError for a non-member."""
    target = resolve_group(group)
    if target is None:
        raise ValueError("group: this rank is not a member (NON_GROUP_MEMBER has no ranks)")
    return target.ranks


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """The rank in ``group`` of ``global_rank``; ValueError if it is not a member."""
    target = resolve_group(group)
    index = None if target is None else target.group_rank_of(global_rank)
    if index is None:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return index


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank``; ValueError if out of range."""
    target = resolve_group(group)
    if target is None or not 0 <= group_rank < target.size():
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return target.ranks[group_rank]
