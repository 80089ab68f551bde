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

Events and who fires them: ``abort(error)`` (transport matcher), ``fail(error)`` (executor),
``destroy()`` (executor, from ProcessGroup.destroy). Every event is allowed in every state
(aborts and failures race with each other and with destroy across threads, so a late one
must not raise); TRANSITIONS says where each leads. No event leads back to READY, out of
DESTROYED, or from BROKEN to ABORTED: ``ALLOWED`` lists the legal moves and the state
refuses any other (IllegalTransition), so a wrong edit of the table fails loudly.

Recorded facts, first one wins (later ones of the same kind are ignored):
``error``: the error that moved the group out of READY; ``aborted``: the abort receives fail
with (recorded in any state, also after destroy); ``failed``: the operation failure later
operations cite; ``dead``: members known dead, with the error that told (a rank gone from
the transport, or a peer's abort naming the rank it saw die).

Thread safety: transitions hold the group's own lock and call nothing while holding it;
readers of ``state``/``aborted``/``failed`` take no lock (one attribute read: the
executor's latency path). Lock order: the matcher's or the queue's lock, then the
GroupStates table's, then a group's. This module imports only
``_errors``, so transports (below groups and backends) own the table.
"""
from __future__ import annotations

import threading

from ..core.errors import PeerFailedError

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


class GroupState:
    """The lifecycle of group ``group`` (its id) on this rank; ``members``: its world
    ranks, None while unknown (a peer's abort can arrive before this rank makes the group)."""

    def __init__(self, group: int = 0, members: list[int] | None = None):
        self.group = group
        self.members: frozenset[int] | None = None if members is None else frozenset(members)
        self.state = READY
        self.error: BaseException | None = None
        self.aborted: BaseException | None = None
        self.failed: BaseException | None = None
        self._dead: dict[int, BaseException] = {}
        self._lock = threading.Lock()

    # -- events ---------------------------------------------------------------------------
    def abort(self, error: BaseException) -> None:
        """The group was aborted (a peer's abort, or a desync seen here): its receives fail
        with ``error`` from now on; a PeerFailedError records the rank it names as dead."""
        with self._lock:
            if self.aborted is None:
                self.aborted = error
            rank = getattr(error, "rank", None) if isinstance(error, PeerFailedError) else None
            if rank is not None and self._member(rank):
                self._dead.setdefault(rank, error)
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

    def set_members(self, members: list[int]) -> None:
        """The group's world ranks are now known: forget dead non-members recorded before."""
        with self._lock:
            self.members = frozenset(members)
            self._dead = {rank: error for rank, error in self._dead.items() if rank in self.members}

    def rank_gone(self, rank: int, error: BaseException) -> None:
        """World rank ``rank`` left this rank's transport (died, or shut down): recorded as
        dead if it is a member. Changes no state: the operations that needed it fail."""
        with self._lock:
            if self._member(rank):
                self._dead.setdefault(rank, error)

    # -- queries --------------------------------------------------------------------------
    @property
    def dead(self) -> dict[int, BaseException]:
        """Members known dead (world rank -> the error that told), a copy."""
        with self._lock:
            return dict(self._dead)

    def failure(self, sources: list[int]) -> BaseException | None:
        """Why an operation waiting on ``sources`` (world ranks) cannot go on: the abort,
        else the first of them known dead; None if neither."""
        if self.aborted is not None:
            return self.aborted
        dead = self._dead
        return next((dead[s] for s in sources if s in dead), None)

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
        return f"<GroupState {self.group:#x} {self.state} dead={sorted(self._dead)} error={self.error!r}>"


class GroupStates:
    """One rank's GroupState per group id (kept by its transport's matcher), and the world
    ranks gone from that transport. A group's state is made when the group registers or at
    the first abort naming it, whichever comes first; it is kept after destroy (as the
    abort must be, for receives posted later)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: group id -> its state; written under the lock, read without it (one dict read)
        self.by_id: dict[int, GroupState] = {}
        #: world rank -> why it is gone (first error wins); same locking
        self.dead: dict[int, BaseException] = {}

    def register(self, group: int, members: list[int]) -> GroupState:
        """The state of ``group`` whose world ranks are ``members`` (the same object each
        time), knowing which of them are already gone."""
        state = self._get_or_make(group)
        with self._lock:
            state.set_members(members)
            for rank, error in self.dead.items():
                state.rank_gone(rank, error)
        return state

    def abort(self, group: int, error: BaseException) -> None:
        """Abort ``group`` (see GroupState.abort), registered or not."""
        self._get_or_make(group).abort(error)

    def rank_gone(self, rank: int, error: BaseException) -> None:
        """World rank ``rank`` is gone: recorded here (first error wins) and in every group
        with it as a member."""
        with self._lock:
            error = self.dead.setdefault(rank, error)
            for state in self.by_id.values():
                if state.members is not None:  # else register() records it
                    state.rank_gone(rank, error)

    def _get_or_make(self, group: int) -> GroupState:
        with self._lock:
            state = self.by_id.get(group)
            if state is None:
                state = self.by_id[group] = GroupState(group)
            return state
