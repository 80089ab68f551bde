"""Live recovery: ``shrink_group`` and ``split_group``, torch 2.13's API, on pydist's engine.

``shrink_group(ranks_to_exclude, group=None, shrink_flags=SHRINK_DEFAULT)`` is called by the
survivors of ``group`` (never by an excluded rank). They agree, over their own connections
(groups.agreement: no store, whose host may be the rank that died), on the members left: the
group ranks given, plus every rank found dead before or during the shrink. The result is a
new group of them (its id chosen by the agreement's leader); the old one is destroyed.
Shrinking the default group makes the new group the default world, its ranks renumbered
0..n-1 (``get_rank()`` changes; the transport and its error messages keep the launch
ranks), and destroys every other group, as torch does. When the store's host (rank 0 under
env:// and tcp://) is gone, the leader serves a new store and the decision says where.
``SHRINK_ABORT`` first aborts the group's operations still in flight (they fail at once
instead of waiting for a dead rank); ``SHRINK_DEFAULT`` lets them finish or fail first. The
new group's first operation is a barrier: a member that died during the shrink (after its
proposal reached the leader) fails it at every survivor, and they shrink again without it.
``shrink(world, parent, ...)`` does it for any World: the process's, or the one a torch
group runs on (pydist.torch.shrink): the default torch group's, which its new_groups share,
or a private one (see pydist.torch.placement).

``split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None,
group_desc=None)``: every member of the parent calls it with the same list of disjoint rank
lists (global ranks) and gets the group it is in (None when it is in none); no store, no
message: the members agree on the id from the parent's and the list's.
"""
from __future__ import annotations

import logging
import struct
from datetime import timedelta
from typing import Any, NamedTuple

from ..core.deadline import Deadline
from ..core.errors import DistError, GroupAbortedError
from ..engines.native import NativeEngine
from ..groups.agreement import agree
from ..groups.factory import make_group, rebuild_default
from ..groups.process_group import ProcessGroup
from ..groups.world import World, current, group_digest
from ..store import Store, TCPStore
from .collectives import barrier
from .groups import get_rank, resolve_group, timeout_seconds

SHRINK_DEFAULT = 0x00
SHRINK_ABORT = 0x01

_EXTRA = struct.Struct("<QH54s")  # new group id, store port (0: keep the store), store host
_log = logging.getLogger("pydist")


class Shrunk(NamedTuple):
    """What the survivors agreed on: the members (transport ranks, sorted), the parent's
    group ranks of them, the new group's id, and the store the leader serves when the old
    one's host is gone (port 0: none)."""
    members: list[int]
    kept: list[int]
    group_id: int
    store_host: str
    store_port: int
    server: Store | None  # the leader's server of that store


def _agree(world: World, parent: ProcessGroup, ranks_to_exclude: list[int], shrink_flags: int,
           store_host: int | None) -> Shrunk:
    """Check the arguments, abort in-flight work if asked, and agree with the other
    survivors (see the module note); ``store_host``: the transport rank serving the store
    (None: elsewhere, it survives)."""
    _check_arguments(ranks_to_exclude, shrink_flags)
    if world.states.evicted_by is not None:  # its peers went on without it: nothing to agree with
        raise world.states.evicted_by
    if parent.size() <= 1:
        raise ValueError(f"Cannot shrink a process group with size {parent.size()}. "
                         "Group must have at least 2 ranks to support shrinking.")
    excluded = _check_excluded(ranks_to_exclude, parent)
    engine = parent.engine
    if not isinstance(engine, NativeEngine):
        raise TypeError(f"Process group backend for '{parent.group_name}' does not support shrinking operations.")
    transport, me = engine.transport, parent.ranks[parent.rank()]
    if shrink_flags & SHRINK_ABORT:
        world.states.abort_group(parent.group_id, GroupAbortedError(
            f"{parent.group_name}: aborted by shrink_group on rank {me}", rank=me))
    members = engine.transport_ranks  # in group order
    served: list[Store] = []

    def extra(left: list[int]) -> bytes:
        group_id = group_digest(f"shrunk:{parent.group_id:x}:{','.join(map(str, left))}")
        if store_host is None or store_host in left:
            return _EXTRA.pack(group_id, 0, b"")
        served.append(TCPStore(transport.address, 0, None, is_master=True, wait_for_workers=False,
                               multi_tenant=True))
        return _EXTRA.pack(group_id, served[0].port, transport.address.encode())  # type: ignore[attr-defined]

    decision = agree(transport, group_digest(f"shrink:{parent.group_id:x}"), sorted(members),
                     {members[g] for g in excluded}, Deadline.after(parent.timeout), extra, world.states.dead)
    group_id, port, host = _EXTRA.unpack(decision.extra[:_EXTRA.size])
    _log.info("shrink_group %s: members now %s (transport ranks)", parent.group_name, decision.members)
    left = set(decision.members)
    return Shrunk(decision.members, [g for g, r in enumerate(members) if r in left], group_id,
                  host.rstrip(b"\0").decode(), port, served[0] if served else None)


def _store_of(shrunk: Shrunk, timeout: float) -> Store:
    """The store the leader serves (its own server object on the leader)."""
    return shrunk.server or TCPStore(shrunk.store_host, shrunk.store_port, None, is_master=False,
                                     wait_for_workers=False, timeout=timedelta(seconds=timeout))


def shrink_group(ranks_to_exclude: list[int], group: ProcessGroup | None = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any = None) -> ProcessGroup:
    """A new group of ``group``'s ranks without ``ranks_to_exclude`` (group ranks) and without
    the ranks found dead meanwhile; see the module note."""
    get_rank()  # raises before init, as torch does
    parent = resolve_group(group)
    if parent is None:
        raise RuntimeError("shrink_group: this rank is not a member of the group (NON_GROUP_MEMBER)")
    return shrink(current(), parent, ranks_to_exclude, shrink_flags)


def shrink(world: World, parent: ProcessGroup, ranks_to_exclude: list[int],
           shrink_flags: int = SHRINK_DEFAULT) -> ProcessGroup:
    """``shrink_group`` of ``world``'s group ``parent``."""
    is_default = parent is world.default_group
    shrunk = _agree(world, parent, ranks_to_exclude, shrink_flags, world.store_host if is_default else None)
    drain = 0.0 if shrink_flags & SHRINK_ABORT else parent.timeout
    if not is_default:
        parent.destroy(timeout=drain)
        world.remove_group(parent)
        created = make_group(world, [parent.ranks[g] for g in shrunk.kept], shrunk.group_id,
                             f"pg-{shrunk.group_id:016x}"[:20], parent.timeout, f"{parent.group_desc}:shrunk")
    else:  # the default group's shrink renumbers: the other groups cannot stay
        owned = _store_of(shrunk, parent.timeout) if shrunk.store_port else None
        created = rebuild_default(world, shrunk.members, shrunk.group_id, parent.timeout, "default:shrunken", drain,
                                  owned, shrunk.members[0] if owned else None)
    return confirmed(world, created)


def confirmed(world: World, group: ProcessGroup) -> ProcessGroup:
    """``group`` once its members all reached it: a barrier on it, which a member that died
    meanwhile (after the agreement that made the group) fails at every survivor; they then
    shrink it away, as often as it takes."""
    try:
        barrier(group=group)
    except DistError as error:
        dead = sorted(g for g in map(group.group_rank_of, error.dead_ranks) if g is not None)
        if not dead:
            raise
        _log.info("ranks %s died before the new group's first operation; shrinking again", dead)
        return shrink(world, group, dead, SHRINK_ABORT)
    return group


def split_group(parent_pg: ProcessGroup | None = None, split_ranks: list[list[int]] | None = None,
                timeout: timedelta | None = None, pg_options: Any = None,
                group_desc: str | None = None) -> ProcessGroup | None:
    """The group of this rank among ``split_ranks`` (disjoint lists of global ranks, all in
    ``parent_pg``), called by every member of the parent; None when this rank is in none."""
    world = current()
    get_rank()  # raises before init, as torch does
    parent = resolve_group(parent_pg)
    if parent is None:
        raise ValueError("parent_pg: this rank is not a member of it")
    if not isinstance(split_ranks, list) or not split_ranks or not all(isinstance(s, list) for s in split_ranks):
        raise ValueError(f"split_ranks: expected a non-empty list of rank lists, got {split_ranks!r}")
    seen: set[int] = set()
    for ranks in split_ranks:
        for rank in ranks:
            if not isinstance(rank, int) or isinstance(rank, bool) or parent.group_rank_of(rank) is None:
                raise ValueError(f"split_ranks: rank {rank!r} is not a rank of the parent group {parent.ranks}")
            if rank in seen:
                raise ValueError(f"split_ranks: rank {rank} appears in more than one split")
            seen.add(rank)
    mine = next((sorted(s) for s in split_ranks if world.rank in s), None)
    if mine is None:
        return None
    group_id = world.split_id(parent.group_id, mine)
    seconds = parent.timeout if timeout is None else timeout_seconds(timeout)
    return make_group(world, mine, group_id, f"pg-{group_id:016x}"[:20], seconds,
                      group_desc or f"{parent.group_desc}:split")


def _check_arguments(ranks_to_exclude: Any, shrink_flags: Any) -> None:
    """torch's checks of shrink_group's arguments, with its wording."""
    if not isinstance(ranks_to_exclude, list):
        raise TypeError(f"ranks_to_exclude must be a list, but got {type(ranks_to_exclude).__name__}. "
                        "Example: [1, 3, 5] to exclude ranks 1, 3, and 5.")
    if not ranks_to_exclude:
        raise ValueError("ranks_to_exclude cannot be empty. To shrink a group, you must specify at least "
                         "one rank to exclude. Example: [failed_rank_id]")
    if not isinstance(shrink_flags, int) or shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(f"Invalid shrink_flags value: {shrink_flags}. Must be one of: SHRINK_DEFAULT "
                         f"({SHRINK_DEFAULT}) or SHRINK_ABORT ({SHRINK_ABORT}). Use SHRINK_ABORT to abort "
                         "ongoing operations before shrinking.")


def _check_excluded(ranks_to_exclude: list[Any], parent: ProcessGroup) -> set[int]:
    """The group ranks to exclude, checked as torch checks them."""
    size, excluded = parent.size(), set()
    for index, rank in enumerate(ranks_to_exclude):
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"All elements in ranks_to_exclude must be integers. Element at index {index} is "
                            f"{type(rank).__name__}: {rank}")
        if not 0 <= rank < size:
            raise ValueError(f"Rank {rank} at index {index} is out of bounds for group size {size}. "
                             f"Valid ranks are in range [0, {size - 1}].")
        if rank in excluded:
            raise ValueError(f"Duplicate rank {rank} found in ranks_to_exclude at index {index}. "
                             "Each rank can only be excluded once.")
        excluded.add(rank)
    if len(excluded) >= size:
        raise ValueError(f"Cannot exclude all {size} ranks from process group. At least one rank must remain. "
                         f"Excluding {len(excluded)} ranks.")
    if parent.rank() in excluded:
        raise RuntimeError(f"Current rank {parent.rank()} is in the exclusion list and should not call "
                           "shrink_group(). Only non-excluded ranks should participate in the shrinking "
                           "operation. Excluded ranks should terminate their processes instead.")
    return excluded
