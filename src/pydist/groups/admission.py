"""Ranks joining a running job, and the ranks in it admitting them at a point they choose.

The store (the job's, which must outlive any rank: pydist-run's agent store, or one given
to every rank) holds, outside every world namespace:

- ``pydist/job``: where the transport's records are and how many ranks started (written
  by the rank that founds the world);
- ``pydist/joiners``: a counter; the k-th rank to join takes transport rank ``size + k - 1``
  (transport ranks are never reused: a dead rank's number stays its own);
- ``pydist/joiner/<transport rank>``: a joiner's "I am listening" mark, then
  ``.../decision``: what the ranks in the job decided about it;
- ``pydist/job/ended``: set when the job's rank 0 leaves (destroy_process_group): nobody
  admits joiners any more, and one waiting for a decision stops waiting.

A **joiner** (``join``) builds its transport in joining mode (listening, its record
published), marks itself ready and waits for a decision. The ranks in the job call
``admit`` together at a boundary of their choosing (between training steps): the default
group's rank 0 reads which joiners are ready and broadcasts them; every rank dials them
(a joiner whose process is gone refuses at once); they agree, with one all_reduce, on
those every rank reached; rank 0 writes each joiner its decision. Then every member
builds the grown world: the survivors in their order, then the joiners by transport rank
(global ranks 0..n-1), a new store namespace, a new default group, whose first operation
(a barrier) confirms it. A joiner that dies after the decision fails that barrier and the
members shrink it away (as shrink_group does for a rank dying during a shrink).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import DistBackendError, DistStoreError
from ..store import Store
from .world import World, group_digest

JOB, JOINERS, ENDED = "pydist/job", "pydist/joiners", "pydist/job/ended"
#: seconds between a waiting joiner's looks at its decision and whether the job ended, at most
ENDED_POLL_SECONDS = 0.5
#: seconds the members give a ready joiner to take their connections, and it them
CONNECT_SECONDS = 30.0
#: joiners admitted at one boundary, at most (the broadcast's fixed size)
MAX_AT_ONCE = 64
_log = logging.getLogger("pydist")


def base_store(store: Store) -> Store:
    """The store under a world's namespace (where the job's keys live): a PrefixStore's, or a
    torch store's (pydist.torch._store.TorchStore.prefixed)."""
    return getattr(store, "underlying_store", None) or store


def found_job(base: Store, transport_namespace: str, size: int) -> None:
    """Rank 0 of a new job: tell later joiners where the transport's records are."""
    base.set(JOB, json.dumps({"transport": transport_namespace, "size": size}))


@dataclass(frozen=True)
class Ticket:
    """A joiner's place: its transport rank, the transport's store namespace, the job's size at start."""

    transport_rank: int
    namespace: str
    size: int


def take_ticket(base: Store, timeout: float) -> Ticket:
    """A transport rank for a joining process (see the module note)."""
    base.wait([JOB], timedelta(seconds=timeout))
    job = json.loads(base.get(JOB))
    number = base.add(JOINERS, 1)
    return Ticket(job["size"] + number - 1, job["transport"], job["size"])


def mark_ready(base: Store, ticket: Ticket) -> None:
    """The joiner listens and its record is published: the members may dial it."""
    base.set(f"pydist/joiner/{ticket.transport_rank}", b"ready")


class JobEnded(DistBackendError):
    """The job's rank 0 left before admitting this joiner: nobody will (see await_decision)."""


def end_job(base: Store) -> None:
    """The job's rank 0 leaves: no joiner will be admitted any more (see await_decision)."""
    base.set(ENDED, b"1")


def await_decision(base: Store, ticket: Ticket, timeout: float) -> dict[str, Any]:
    """The members' decision about this joiner (DistBackendError when refused; JobEnded when
    the job ended first)."""
    key = f"pydist/joiner/{ticket.transport_rank}/decision"
    deadline = Deadline.after(timeout)
    pause = 0.01  # looks and pauses, never short waits: torch's TCPStore logs each wait that expires
    while not base.check([key]):
        if base.check([ENDED]):
            raise JobEnded(f"rank joining as transport rank {ticket.transport_rank}: the job ended before "
                           "admitting it (its rank 0 left the job)")
        if deadline.expired():
            raise DistStoreError(f"rank joining as transport rank {ticket.transport_rank}: no decision about it "
                                 f"(store key {key!r}) within {timeout:g} s")
        left = deadline.remaining()
        _deadline.pause(pause if left is None else min(pause, left))  # on pydist's clock, as the deadline
        pause = min(2 * pause, ENDED_POLL_SECONDS)
    decision = json.loads(base.get(key))
    if not decision["admitted"]:
        raise DistBackendError(f"rank joining as transport rank {ticket.transport_rank}: the job's ranks did not "
                               f"admit it ({decision['why']})")
    return decision


def ready_joiners(base: Store, handled: set[int], size: int) -> tuple[list[int], list[int]]:
    """(the transport ranks of joiners marked ready and not yet decided, those among the ones
    not in ``handled`` that were decided already): the leader's look. A leader that itself
    joined later did not handle the joiners decided before it came: the decision tells."""
    count = base.add(JOINERS, 0)
    ready, decided = [], []
    for rank in (size + k for k in range(count) if size + k not in handled):
        if base.check([f"pydist/joiner/{rank}/decision"]):
            decided.append(rank)
        elif base.check([f"pydist/joiner/{rank}"]):
            ready.append(rank)
    return ready[:MAX_AT_ONCE], decided


def encode_joiners(ranks: list[int]) -> np.ndarray:
    """The fixed-size int64 array the leader broadcasts: count, then the ranks."""
    message = np.zeros(MAX_AT_ONCE + 1, np.int64)
    message[0] = len(ranks)
    message[1:1 + len(ranks)] = ranks
    return message


def decode_joiners(message: np.ndarray) -> list[int]:
    return message[1:1 + int(message[0])].tolist()


def decide(base: Store, admitted: list[int], refused: list[int], members: list[int], generation: int,
           group_id: int, why: str = "the ranks in the job could not reach it") -> None:
    """Rank 0 of the members: write each joiner its decision."""
    for rank in admitted:
        base.set(f"pydist/joiner/{rank}/decision", json.dumps(
            {"admitted": True, "members": members, "generation": generation, "group_id": group_id}))
    for rank in refused:
        base.set(f"pydist/joiner/{rank}/decision", json.dumps({"admitted": False, "why": why}))


def grown_group_id(group_id: int, members: list[int]) -> int:
    """The id of the default group grown from ``group_id`` to ``members`` (equal everywhere)."""
    return group_digest(f"grown:{group_id:x}:{','.join(map(str, members))}")


def connect_deadline(world: World) -> Deadline:
    """How long the members and joiners give each other to connect."""
    timeout = world.default_group.timeout if world.default_group is not None else CONNECT_SECONDS
    return Deadline.after(min(CONNECT_SECONDS, timeout))
