"""The one path a failed operation takes on this rank, for collectives and point-to-point.

Engines and algorithms only raise (after withdrawing their own pending receives). What a
failure means for the group is decided here, in this order:

1. a collective's timeout is *explained*: the ranks that never reached the operation are
   appended (a bounded look at the progress board, see progress);
2. the peers are *told* (``Engine.abort_peers``: ABORT frames), so that they fail naming the
   root cause instead of hanging or blaming this rank later: for a collective, any DistError
   but one that is itself a peer's abort; for point-to-point, a dead peer only (a receive's
   timeout concerns the pair, not the group);
3. ``error.dead_ranks`` is set: the members this rank knows dead, in global ranks;
4. a collective's DistError *breaks* the group (GroupState.fail): later operations fail at
   once, citing it. Point-to-point bypasses the operation queue and breaks nothing.

A rank whose peers declared it dead (it was stopped or starved past PYDIST_PEER_TIMEOUT)
raises EvictedError instead, whatever it saw of them afterwards.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ..core.errors import DistError, GroupAbortedError, OpTimeoutError, PeerFailedError
from .progress import EXPLAIN_BUDGET
from .state import GroupState

if TYPE_CHECKING:
    from ..engines.base import Engine
    from .progress import ProgressBoard


class FailurePath:
    """How one group's failures are handled (see the module note)."""

    def __init__(self, group_id: int, engine: Engine, state: GroupState, global_ranks: list[int],
                 transport_ranks: list[int], progress: ProgressBoard | None, timeout: float):
        """``transport_ranks``: the members' transport ranks, in group-rank order (the ranks the
        state records dead); ``progress``: None where ranks publish no progress (MPI)."""
        self._group_id = group_id
        self._engine = engine
        self._state = state
        self._global_ranks = global_ranks
        self._transport_ranks = transport_ranks
        self._progress = progress
        self._timeout = timeout

    def set_timeout(self, seconds: float) -> None:
        """The group's default operation timeout changed (its share of it explains a timeout)."""
        self._timeout = seconds

    def collective(self, error: BaseException, seq: int) -> BaseException:
        """What collective ``seq``'s ``error`` becomes (raise it): steps 1 to 4; or, when the
        others declared this rank dead (it was stopped), that (EvictedError), and the group broken."""
        evicted = self._evicted(error)
        if evicted is not None:
            self._state.fail(evicted)
            return evicted
        failure = self._explained(error, seq)
        if isinstance(failure, DistError):
            if not isinstance(failure, GroupAbortedError):
                self._engine.abort_peers(failure)
            self._note_dead(failure)
            self._state.fail(failure)
        return failure

    def point_to_point(self, error: BaseException) -> BaseException:
        """What a send's or receive's ``error`` becomes (raise it): steps 2 and 3 (or EvictedError)."""
        evicted = self._evicted(error)
        if evicted is not None:
            return evicted
        if isinstance(error, PeerFailedError):
            self._engine.abort_peers(error)
        if isinstance(error, DistError):
            self._note_dead(error)
        return error

    def _evicted(self, error: BaseException) -> BaseException | None:
        """The EvictedError to raise instead of a DistError, when the others declared this rank
        dead (what this rank saw of them afterwards, their closed connections, is its consequence)."""
        if not isinstance(error, DistError):
            return None
        evicted = self._engine.evicted()
        if evicted is None or evicted is error:
            return evicted
        raised = copy.copy(evicted)
        raised.__cause__ = error
        return raised

    def _explained(self, error: BaseException, seq: int) -> BaseException:
        """``error``, or for a timeout not explained yet, one naming the ranks that never
        reached operation ``seq``."""
        if not isinstance(error, OpTimeoutError) or error.explained or self._progress is None:
            return error
        budget = min(EXPLAIN_BUDGET, 0.1 * self._timeout)
        text = self._progress.explain(self._group_id, seq, self._global_ranks, budget)
        explained = OpTimeoutError(str(error) + text)
        explained.explained = True
        return explained

    def _note_dead(self, error: DistError) -> None:
        """Set ``error.dead_ranks``: the members this rank knows dead (global ranks), the rank
        a PeerFailedError names included (a failed send can tell before the transport has
        recorded the loss)."""
        dead = set(self._state.dead)
        if isinstance(error, PeerFailedError) and error.rank is not None:
            dead.add(error.rank)
        if dead:
            error.dead_ranks = frozenset(g for g, t in zip(self._global_ranks, self._transport_ranks) if t in dead)
