"""ProcessGroup: a set of ranks, its backend, its operation queue and sequence numbers.

``run(spec, body, outputs, async_op)`` is how every collective executes: the body gets an
OpContext (the call's OpSpec, sequence number, deadline from the group timeout) and runs on the backend in
issue order (OpQueue); staged output buffers are written back before the Work completes.
``state`` is the group's lifecycle on this rank (ready, aborted, broken, destroyed; the
first error; the members known dead): one object, shared with the backend's transport,
its transitions in _group_state.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core.buffers import Buffer
from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import DistError, OpTimeoutError, PeerFailedError, timed_out_waiting
from .queue import OpQueue
from .state import GroupState
from ..core.opspec import OpSpec
from .progress import EXPLAIN_BUDGET, ProgressBoard
from .work import Work
from ..debug.recorder import attach as attach_trace
from ..engines.base import Engine, OpContext


class ProcessGroup:
    """torch's ProcessGroup: ``rank()`` and ``size()`` in the group, plus pydist internals."""

    def __init__(self, name: str, group_id: int, ranks: list[int], global_rank: int,
                 backend: Engine, timeout: float, desc: str = "", world: tuple[int, int] | None = None):
        """``world``: (rank, size) of this process in its whole job, under which the flight
        recorder files the group (default: ``global_rank`` and the group's size)."""
        self.group_name = name
        self.group_desc = desc or name
        self.group_id = group_id
        self._ranks = list(ranks)
        self._rank = self._ranks.index(global_rank)
        self._backend = backend
        self._timeout = timeout
        self._timeout_text = timed_out_waiting(timeout)
        self._state = backend.group_state(self._ranks)
        self._queue = OpQueue(name, self._state)
        self.owned_transport = None  # closed by destroy() when the group has a transport of its own
        self._trace = attach_trace(self, *(world or (global_rank, len(ranks))))  # pydist.debug
        self.progress: ProgressBoard | None = None  # set by init: names the ranks behind at a timeout

    # -- torch's ProcessGroup API ---------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self._ranks)

    def name(self) -> str:
        return self._backend.name

    def getBackendName(self) -> str:  # noqa: N802 - torch's spelling
        return self._backend.name

    @property
    def ranks(self) -> list[int]:
        """Global ranks of the members, in group-rank order."""
        return list(self._ranks)

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def state(self) -> GroupState:
        """The group's lifecycle on this rank (see pydist.groups.state)."""
        return self._state

    @property
    def backend(self) -> Engine:
        return self._backend

    def group_rank_of(self, global_rank: int) -> int | None:
        try:
            return self._ranks.index(global_rank)
        except ValueError:
            return None

    # -- running operations ---------------------------------------------------------------
    def run(self, spec: OpSpec, body: Callable[[OpContext], None], outputs: list[Buffer],
            async_op: bool, results: list[Any] | None = None, timeout: float | None = None) -> Work | None:
        """Execute ``body`` (the call ``spec`` describes) in order with the others; Work when
        async, else None after it ends. ``timeout`` (seconds) narrows the group's timeout for
        this operation."""
        entry = self._trace.queued(spec, async_op)
        if not async_op and self._queue.run_inline(self._operate, spec, body, outputs, entry, timeout):
            return None  # the latency path: run now in this thread, no Work
        work = Work(f"{spec.name} on group {self.group_name}",
                    results if results is not None else [b.obj for b in outputs])
        self._queue.submit(lambda seq: self._operate(seq, spec, body, outputs, entry, timeout), work,
                           blocking=not async_op)
        if async_op:
            return work
        work.wait()
        return None

    def _operate(self, seq: int, spec: OpSpec, body: Callable[[OpContext], None], outputs: list[Buffer],
                 entry: Any, timeout: float | None) -> None:
        """Run operation ``seq``: ``body`` within the deadline, then the staged outputs
        written back; the recorder and the progress board told."""
        trace = self._trace
        trace.started(entry, seq)
        try:
            if self.progress is not None:
                self.progress.started(self.group_id, seq, spec.name)
            seconds, text = (self._timeout, self._timeout_text) if timeout is None else (timeout,
                                                                                           timed_out_waiting(timeout))
            context = OpContext(spec.name, seq, Deadline(_deadline.now() + seconds), text, self._explained, spec, entry)
            try:
                body(context)
            except OpTimeoutError as error:  # engines that did not explain it themselves (MPI)
                explained = context.explained(error)
                if explained is error:
                    raise
                raise explained from error.__cause__
            for buffer in outputs:
                if buffer.staged:
                    buffer.finish()
        except BaseException as error:
            trace.failed(entry, error)
            if isinstance(error, DistError):
                self.note_dead(error)
            raise
        trace.completed(entry)

    def note_dead(self, error: DistError) -> None:
        """Set ``error.dead_ranks``: the members this rank knows dead (global ranks), the
        rank a PeerFailedError names included (a failed send can tell before the transport
        has recorded the loss)."""
        dead = set(self._state.dead)
        if isinstance(error, PeerFailedError) and error.rank is not None:
            dead.add(error.rank)
        if dead:
            transport_ranks = getattr(self._backend, "ranks", self._ranks)
            error.dead_ranks = frozenset(g for g, t in zip(self._ranks, transport_ranks) if t in dead)

    def _explained(self, error: OpTimeoutError, seq: int) -> OpTimeoutError:
        """``error`` with the ranks that never reached operation ``seq`` appended."""
        if self.progress is None:
            return error
        budget = min(EXPLAIN_BUDGET, 0.1 * self._timeout)
        explained = OpTimeoutError(str(error) + self.progress.explain(self.group_id, seq, self._ranks, budget))
        explained.explained = True
        return explained

    def destroy(self, timeout: float | None = None) -> None:
        """Finish queued operations (up to ``timeout``), move the state to destroyed, stop
        the progress thread, release the backend's and (if owned) the transport's resources."""
        self._queue.close(timeout)
        self._trace.destroy()
        self._backend.close()
        if self.owned_transport is not None:
            self.owned_transport.close()
            self.owned_transport = None

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.group_name} ranks={self._ranks} rank={self._rank}>"
