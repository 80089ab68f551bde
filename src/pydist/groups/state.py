"""A group's lifecycle on this rank: one small state machine, its transitions in one table.

States (``GroupState.state``)::

                 abort                                   fail
      READY ───────────────────► ABORTED ─────────────────────────┐
        │                          │                              ▼
        │  fail ───────────────────┼──────────────────────────► BROKEN
        │                          │                              │
        └── destroy ───────────────┴──────── destroy ─────────────┴──► DESTROYED

- READY: operations run; receives of the group are posted normally.
- ABORTED: a peer aborted the group (its ABORT frame, read by the transport's I/O thread),
  or this rank saw a message of another call for one of its operations (desync, seen by
  the matcher in a user, progress or I/O thread). Receives of the group fail with the
  abort from now on; operations still run (the next one usually fails on a receive).
- BROKEN: an operation of the group failed on this rank with a DistError (the executor, in
  the caller's or the progress thread). Later operations fail at once, naming that failure,
  instead of hanging on peers that have moved on. Receives still fail only if the group
  was (or is later) aborted: point-to-point calls bypass the operation queue.
- DESTROYED: destroy_process_group finished the queue (``OpQueue.close``). Terminal; a new
  group (new_group, a later shrink/split) gets a new GroupState.

Events and who fires them: ``abort(error)`` (GroupStates, told by the transport or the
group layer), ``fail(error)`` (the executor), ``destroy()`` (the executor, from
ProcessGroup.destroy). Every event is allowed in every state (aborts and failures race with
each other and with destroy across threads, so a late one must not raise); TRANSITIONS says
where each leads. No event leads back to READY, out of DESTROYED, or from BROKEN to ABORTED:
``ALLOWED`` lists the legal moves and the state refuses any other (IllegalTransition), so a
wrong edit of the table fails loudly.

Recorded facts, first one wins (later ones of the same kind are ignored):
``error``: the error that moved the group out of READY; ``aborted``: the abort receives fail
with (recorded in any state, also after destroy); ``failed``: the operation failure later
operations cite. Members known dead (``dead``) are not stored per group: they are the ranks
the rank's GroupStates knows gone, plus those a peer's abort named dead.

GroupStates is everything this rank knows of its groups and peers, in one place above the
transport (it implements transport.base.Events): each group's GroupState, the ranks gone
from the transport, the calls this rank started (to find desynchronised ranks). The
transport reports to it; once it has recorded a failure it tells its ``carrier`` (the world
transport) to fail the receives and sends waiting on it.

Thread safety: transitions hold the group's own lock and call nothing while holding it;
readers of ``state``/``aborted``/``failed`` take no lock (one attribute read: the
executor's latency path). Lock order: the matcher's or the queue's lock, then the
GroupStates table's, then a group's.
"""
from __future__ import annotations

import threading
from typing import Protocol

from ..core.errors import EvictedError, PeerFailedError
from ..transport.base import MessageKey
from ..transport.matching import call_mismatch, differ

#: Operations per group whose calls are remembered, to check messages that arrive late.
RECENT_CALLS = 64

READY, ABORTED, BROKEN, DESTROYED = "ready", "aborted", "broken", "destroyed"
ABORT, FAIL, DESTROY = "abort", "fail", "destroy"

#: state -> event -> next state.
TRANSITIONS: dict[str, dict[str, str]] = {
    READY: {ABORT: ABORTED, FAIL: BROKEN, DESTROY: DESTROYED},
    ABORTED: {ABORT: ABORTED, FAIL: BROKEN, DESTROY: DESTROYED},
    BROKEN: {ABORT: BROKEN, FAIL: BROKEN, DESTROY: DESTROYED},
    DESTROYED: {ABORT: DESTROYED, FAIL: DESTROYED, DESTROY: DESTROYED},
}
#: Every legal (from, to) move, staying put included.
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {(READY, ABORTED), (READY, BROKEN), (READY, DESTROYED), (ABORTED, BROKEN), (ABORTED, DESTROYED),
     (BROKEN, DESTROYED)} | {(state, state) for state in TRANSITIONS})


class IllegalTransition(RuntimeError):
    """A move the lifecycle does not allow (a bug in pydist, never a user error)."""


class Carrier(Protocol):
    """What GroupStates tells once it has recorded a failure (transport.world.WorldTransport)."""

    rank: int  # this rank's transport rank

    def failed_peer(self, peer: int, error: BaseException) -> None: ...
    def failed_group(self, group: int, error: BaseException) -> None: ...
    def held_calls(self, group: int, seq: int) -> list[tuple[int, MessageKey, int]]: ...
    def cut_off(self, peer: int, error: BaseException) -> None: ...


def _named_rank(error: BaseException) -> int | None:
    """The rank a PeerFailedError names dead (None for any other error)."""
    return getattr(error, "rank", None) if isinstance(error, PeerFailedError) else None


class GroupState:
    """The lifecycle of group ``group`` (its id) on this rank; ``members``: its transport
    ranks, None while unknown (a peer's abort can arrive before this rank makes the group);
    ``registry``: the GroupStates that keeps it (the ranks gone, the calls started), None for
    a group on its own."""

    def __init__(self, group: int = 0, members: list[int] | None = None, registry: GroupStates | None = None):
        self.group = group
        self._registry = registry
        self.members: frozenset[int] | None = None if members is None else frozenset(members)
        self.state = READY
        self.error: BaseException | None = None
        self.aborted: BaseException | None = None
        self.failed: BaseException | None = None
        self._gone: dict[int, BaseException] = registry.dead if registry is not None else {}  # shared, read only
        self._named: dict[int, BaseException] = {}  # members a peer's abort named dead
        self._lock = threading.Lock()

    # -- events ---------------------------------------------------------------------------
    def abort(self, error: BaseException) -> None:
        """The group was aborted (a peer's abort, or a desync seen here): its receives fail
        with ``error`` from now on; a PeerFailedError records the rank it names as dead."""
        with self._lock:
            if self.aborted is None:
                self.aborted = error
            rank = _named_rank(error)
            if rank is not None:
                self._named.setdefault(rank, error)
            self._move(ABORT, error)

    def fail(self, error: BaseException) -> None:
        """An operation of the group failed here with ``error`` (a DistError): later
        operations fail at once, citing it."""
        with self._lock:
            if self.failed is None:
                self.failed = error
            self._move(FAIL, error)

    def destroy(self) -> None:
        """The group was destroyed (idempotent)."""
        with self._lock:
            self._move(DESTROY, None)

    def started(self, seq: int, call: int) -> None:
        """This rank starts operation ``seq`` as ``call`` (see GroupStates.started)."""
        if self._registry is not None:
            self._registry.started(self.group, seq, call)

    def set_members(self, members: list[int]) -> None:
        """The group's transport ranks are now known."""
        self.members = frozenset(members)

    # -- queries --------------------------------------------------------------------------
    @property
    def dead(self) -> dict[int, BaseException]:
        """Members known dead (transport rank -> the error that told), a copy: ranks gone from
        the transport, then ranks a peer's abort named."""
        known = {**self._named, **self._gone}
        return {rank: error for rank, error in known.items() if self._member(rank)}

    def evicted(self) -> BaseException | None:
        """The EvictedError saying the other ranks declared this rank dead, if they did."""
        return self._registry.evicted_by if self._registry is not None else None

    def failure(self, sources: list[int]) -> BaseException | None:
        """Why an operation waiting on ``sources`` (transport ranks) cannot go on: the abort,
        else the first of them known dead; None if neither."""
        if self.aborted is not None:
            return self.aborted
        gone, named = self._gone, self._named
        return next((gone.get(s) or named[s] for s in sources if s in gone or s in named), None)

    def _member(self, rank: int) -> bool:
        return self.members is None or rank in self.members
    def _move(self, event: str, error: BaseException | None) -> None:
        """Fire ``event`` (lock held): the one place ``state`` changes."""
        before = self.state
        after = TRANSITIONS[before].get(event)
        if after is None or (before, after) not in ALLOWED:
            raise IllegalTransition(f"group {self.group:#x}: {event} may not move it from {before} to {after}")
        if before == READY and after != READY and self.error is None:
            self.error = error
        self.state = after

    def __repr__(self) -> str:
        return f"<GroupState {self.group:#x} {self.state} dead={sorted(self.dead)} error={self.error!r}>"


class GroupStates:
    """What this rank knows of its groups and peers (implements transport.base.Events): one
    GroupState per group id, the ranks gone from the transport, and the calls this rank
    started per group (the last RECENT_CALLS). A group's state is made when the group
    registers or at the first abort naming it, whichever comes first; it is kept after
    destroy (as the abort must be, for receives posted later)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: group id -> its state; written under the lock, read without it (one dict read)
        self.by_id: dict[int, GroupState] = {}
        #: transport rank -> why it is gone (first error wins); same locking
        self.dead: dict[int, BaseException] = {}
        self._calls: dict[int, dict[int, int]] = {}  # group -> {seq: call} of this rank's recent operations
        #: told once a failure is recorded (the world transport); None: nothing to tell
        self.carrier: Carrier | None = None
        #: the EvictedError saying this rank's peers declared it dead (it takes part in nothing then)
        self.evicted_by: BaseException | None = None

    def register(self, group: int, members: list[int]) -> GroupState:
        """The state of ``group`` whose transport ranks are ``members`` (the same object each time)."""
        state = self._get_or_make(group)
        state.set_members(members)
        return state

    # -- from the group layer -------------------------------------------------------------
    def started(self, group: int, seq: int, call: int) -> None:
        """This rank starts operation ``seq`` of ``group`` as ``call`` (a fingerprint): a
        message of that operation carrying another call aborts the group as desynchronised.
        Recorded first, the messages already held looked at after (see Matcher.arrive)."""
        recent = self._calls.get(group)
        if recent is None:
            recent = self._calls[group] = {}
        recent[seq] = call
        recent.pop(seq - RECENT_CALLS, None)
        if self.carrier is None or not call:
            return
        for source, key, theirs in self.carrier.held_calls(group, seq):
            if differ(call, theirs):
                self.abort_group(group, call_mismatch(call, source, key, theirs))
                return

    # -- transport.base.Events ------------------------------------------------------------
    def peer_gone(self, peer: int, error: BaseException) -> None:
        """Transport rank ``peer`` is gone (or, with an EvictedError, it declared this rank
        dead and went on): recorded (first error wins), then its waiters fail."""
        with self._lock:
            if isinstance(error, EvictedError) and self.evicted_by is None:
                self.evicted_by = error
            error = self.dead.setdefault(peer, error)
        if self.carrier is not None:
            self.carrier.failed_peer(peer, error)

    def abort_group(self, group: int, error: BaseException) -> None:
        """Abort ``group`` (see GroupState.abort), registered or not; then its waiters fail. A
        rank the abort names dead is cut off here too: every rank then agrees it is out."""
        self._get_or_make(group).abort(error)
        if self.carrier is not None:
            self.carrier.failed_group(group, error)
            rank = _named_rank(error)
            if rank is not None and rank == self.carrier.rank:  # the others declared this rank dead
                self._declared_dead(error, rank)
            elif rank is not None:
                self.carrier.cut_off(rank, error)

    def _declared_dead(self, error: BaseException, me: int) -> None:
        """A peer's abort names this rank dead: it was (stopped, or cut off), and is out."""
        with self._lock:
            if self.evicted_by is None:
                rank, host = getattr(error, "witness", None) or (None, "?")
                who = f"rank {rank} on {host}" if rank is not None else "the other ranks"
                self.evicted_by = EvictedError(
                    f"{who} declared rank {me} dead and went on without it: "
                    f"{getattr(error, 'reason', None) or error}", rank=rank, host=host if rank is not None else None)

    def refusal(self, source: int | None, group: int) -> BaseException | None:
        state = self.by_id.get(group)
        if state is not None and state.aborted is not None:
            return state.aborted
        return self.dead.get(source) if source is not None else None

    def call_of(self, group: int, seq: int) -> int:
        recent = self._calls.get(group)
        return recent.get(seq, 0) if recent is not None else 0

    def _get_or_make(self, group: int) -> GroupState:
        with self._lock:
            state = self.by_id.get(group)
            if state is None:
                state = self.by_id[group] = GroupState(group, registry=self)
            return state
