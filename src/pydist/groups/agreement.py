"""Agreeing on who is left after failures, over the survivors' own connections (no store).

``agree(transport, channel, candidates, excluded, deadline, extra_for)``: the ranks of
``candidates`` (world ranks of the transport) that call it get the same Decision: the
members, and the bytes the leader adds (``extra_for(members)``: the new group's id, its
store). The lowest candidate not excluded leads. Every other one sends it the ranks it
excludes (those given, and those its transport knows dead); the leader waits for each
candidate's proposal (a candidate whose receive fails, being dead, is excluded), takes the
union and sends the decision to every candidate it heard from, excluded ones too (they then
raise, saying so). A follower whose leader dies before deciding excludes it and proposes to
the next candidate. Messages go by (channel, leader, kind): a proposal to a leader that
died is never read, and one to the next leader cannot be taken for it.

Not covered: a leader dying while it sends its decision leaves the followers it reached
with a group that holds it (their next operation fails naming it) and the others with the
next leader, who waits for those until the deadline and raises naming them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from ..algorithms.comm import as_bytes
from ..core.deadline import Deadline
from ..core.errors import DistBackendError, PeerFailedError, timed_out_waiting
from ..transport.base import MessageKey, Request
from ..transport.world import WorldTransport

PROPOSE, DECIDE = 1, 2
#: Bytes the leader adds to its decision (``extra_for``'s result is padded to this).
EXTRA_BYTES = 64


class Decision(NamedTuple):
    members: list[int]  # transport ranks, sorted
    leader: int
    extra: bytes  # EXTRA_BYTES from the leader's extra_for(members)


def agree(transport: WorldTransport, channel: int, candidates: list[int], excluded: set[int], deadline: Deadline,
          extra_for: Callable[[list[int]], bytes], dead: Mapping[int, BaseException],
          what: str = "shrink_group") -> Decision:
    """The Decision of the candidates that call it (see the module note); ``dead``: the
    transport ranks this rank knows gone (read again as the agreement goes on).
    DistBackendError when this rank is excluded by it or the deadline passes, naming the
    ranks waited for."""
    me = transport.rank
    excluded = set(excluded) | set(dead)
    while True:
        alive = [r for r in candidates if r not in excluded]
        leader = alive[0]
        if leader == me:
            decision: Decision | None = _lead(transport, channel, alive, excluded, deadline, extra_for, what)
        else:
            decision = _follow(transport, channel, leader, excluded, deadline, dead, what)
        if decision is None:  # the leader died before deciding
            excluded.add(leader)
            continue
        if me not in decision.members:
            raise DistBackendError(f"{what}: rank {me} was excluded by the survivors' agreement (rank "
                                   f"{decision.leader} decided the members {decision.members})")
        return decision


def _lead(transport: WorldTransport, channel: int, alive: list[int], excluded: set[int], deadline: Deadline,
          extra_for: Callable[[list[int]], bytes], what: str) -> Decision:
    me, size = transport.rank, transport.size
    proposals = {r: np.zeros(size, np.uint8) for r in alive if r != me}
    requests = {r: transport.irecv(r, as_bytes(buf), MessageKey(channel, me, PROPOSE))
                for r, buf in proposals.items()}
    heard = []
    for rank, request in requests.items():
        _wait(request, deadline, transport, f"{what}: the proposal of rank {rank}")
        if request.error is not None:  # dead (or its connection broke): excluded
            excluded.add(rank)
            continue
        heard.append(rank)
        excluded |= set(np.flatnonzero(proposals[rank]).tolist())
    members = [r for r in alive if r not in excluded]
    decision = Decision(members, me, extra_for(members).ljust(EXTRA_BYTES, b"\0"))
    message = _encode(decision, size)
    sends = [transport.isend(r, as_bytes(message), MessageKey(channel, me, DECIDE)) for r in heard]
    for request in sends:  # a rank that died meanwhile fails its send: nothing to do about it
        _wait(request, deadline, transport, f"{what}: sending the decision")
    return decision


def _follow(transport: WorldTransport, channel: int, leader: int, excluded: set[int], deadline: Deadline,
            dead: Mapping[int, BaseException], what: str) -> Decision | None:
    """Propose to ``leader`` and wait for its decision; None when it died first."""
    size = transport.size
    proposal = np.zeros(size, np.uint8)
    proposal[sorted(excluded)] = 1
    answer = np.zeros(size + 8 + EXTRA_BYTES, np.uint8)
    decided = transport.irecv(leader, as_bytes(answer), MessageKey(channel, leader, DECIDE))
    sent = transport.isend(leader, as_bytes(proposal), MessageKey(channel, leader, PROPOSE))
    _wait(sent, deadline, transport, f"{what}: the proposal to rank {leader}")
    _wait(decided, deadline, transport, f"{what}: the decision of rank {leader}")
    if decided.error is not None:
        if isinstance(decided.error, PeerFailedError) or leader in dead:
            return None
        raise decided.error
    return _decode(answer, size)


def _wait(request: Request, deadline: Deadline, transport: WorldTransport, waiting_for: str) -> None:
    if not deadline.wait(request.wait):
        transport.cancel(request)
        raise DistBackendError(f"{waiting_for}: {timed_out_waiting(None)} (the deadline passed)")


def _encode(decision: Decision, size: int) -> np.ndarray:
    message = np.zeros(size + 8 + EXTRA_BYTES, np.uint8)
    message[decision.members] = 1
    message[size:size + 8] = np.frombuffer(np.int64(decision.leader).tobytes(), np.uint8)
    message[size + 8:] = np.frombuffer(decision.extra, np.uint8)
    return message


def _decode(message: np.ndarray, size: int) -> Decision:
    members = np.flatnonzero(message[:size]).tolist()
    leader = int(message[size:size + 8].view(np.int64)[0])
    return Decision(members, leader, message[size + 8:].tobytes())
