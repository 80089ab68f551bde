"""Growing the job back: ``admit_joiners()`` (the ranks in the job) and the joining side of
``init_process_group`` (a replacement rank); the protocol is groups.admission's.

``admit_joiners(timeout=None)`` is called by every rank of the default group at the same
point of its program (between training steps); it returns the global ranks of the joiners it
admitted (empty, the usual case: one store read on rank 0 and one small broadcast). When it
admits some, the default group is replaced by a grown one (every other group is destroyed,
as by a shrink of the default group): the members keep their order and the joiners follow;
``get_rank()`` and ``get_world_size()`` change; the new group's first operation is a barrier,
and a joiner that died meanwhile is shrunk away. Collectives queued on the old group finish
first (or fail).
"""
from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Any

import numpy as np

from ..core.deadline import Deadline
from ..core.ops import ReduceOp
from ..groups import admission
from ..groups.factory import attempt_store, join_admitted, joining_transport, launch_position, rebuild_default
from ..groups.process_group import ProcessGroup
from ..groups.world import World, current
from ..store import Store
from .collectives import all_reduce, broadcast
from .shrink import confirmed

_log = logging.getLogger("pydist")


def admit_joiners(timeout: timedelta | float | None = None) -> list[int]:
    """Admit the ranks waiting to join the job into the default group (see the module note);
    the global ranks they got. Called by every rank of the default group."""
    world = current()
    group = world.default_group
    if group is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    assert world.store is not None and world.transport is not None  # a native world (checked below)
    if world.states.evicted_by is not None:  # its peers went on without it
        raise world.states.evicted_by
    if world.backend_name != "pydist":
        raise ValueError(f"admit_joiners: the {world.backend_name!r} backend takes in no ranks (pydist's does)")
    base = admission.base_store(world.store)
    ready: list[int] = []
    if group.rank() == 0:
        ready, decided_before = admission.ready_joiners(base, world.joiners_handled, world.started)
        world.handled(decided_before)
    message = admission.encode_joiners(ready)
    broadcast(message, src=0)
    joiners = admission.decode_joiners(message)
    if not joiners:
        return []
    world.handled(joiners)
    unreachable = world.transport.connect(joiners, admission.connect_deadline(world))
    refused_mask = np.array([j in unreachable for j in joiners], np.int32)
    all_reduce(refused_mask, op=ReduceOp.MAX)  # a joiner some member cannot reach is left out by all
    admitted = [j for j, refused in zip(joiners, refused_mask) if not refused]
    refused = [j for j, no in zip(joiners, refused_mask) if no]
    members = world.members() + admitted
    group_id = admission.grown_group_id(group.group_id, members)
    if group.rank() == 0:
        admission.decide(base, admitted, refused, members, world.generation + 1, group_id)
    if refused:
        _log.info("admit_joiners: ranks %s (transport ranks) could not be reached; left out", refused)
    if not admitted:
        return []
    seconds = group.timeout if timeout is None else _seconds(timeout)
    grown = confirmed(world, rebuild_default(world, members, group_id, seconds, "default:grown", group.timeout))
    return [g for g, t in enumerate(world.members()) if t in admitted and grown is world.default_group]


def join_running_job(world: World, store: Store, timeout: float, owned_store: Store | None) -> ProcessGroup:
    """This process joins the job whose ranks meet through ``store``: it waits until they
    admit it (their next ``admit_joiners``), then has its default group (see the module note).
    When the job ends first (its rank 0 left), the process has nothing to do: it says so on
    stderr and exits with status 0 (SystemExit), so that its launcher counts no failure."""
    ticket = admission.take_ticket(store, timeout)
    transport = joining_transport(world, ticket, store, Deadline.after(timeout))
    try:
        admission.mark_ready(store, ticket)
        try:
            decision = admission.await_decision(store, ticket, timeout)
        except admission.JobEnded as ended:
            print(f"pydist: {ended}; this process has nothing to do and exits", file=sys.stderr, flush=True)
            raise SystemExit(0) from None
        group = join_admitted(world, transport, ticket, decision, store, timeout, owned_store)
    except BaseException:
        if world.transport is None:  # not joined: the transport is this function's to close
            transport.close()
        raise
    _log.info("joined the job as rank %d of %d (transport rank %d)", group.rank(), group.size(),
              ticket.transport_rank)
    return confirmed(world, group)


def join_standalone(store: Any, timeout: float) -> World:
    """The World of a replacement rank's default torch group (what
    groups.factory.standalone_world is at launch; its new_groups are groups of it, see
    pydist.torch.placement), joined to the running job met through ``store``: its default
    group is the grown one."""
    world = World(job=launch_position())
    join_running_job(world, attempt_store(store), timeout, None)
    return world


def _seconds(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
