"""ProcessGroup: a set of ranks, its engine, its operation queue and sequence numbers.

``run(spec, call, args, outputs, async_op)`` is how every collective executes: ``call``
(the engine's method) gets an OpContext (the call's OpSpec, sequence number, deadline from
the group timeout) and its arguments, and runs in issue order (OpQueue); staged output
buffers are written back before the Work completes. A failure takes the group's
FailurePath (groups.failure). ``state`` is the group's lifecycle on this rank (ready,
aborted, broken, destroyed; the first error; the members known dead): one object, kept by
the world's GroupStates, its transitions in groups.state. Groups are made by
groups.factory, never directly.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core import deadline as _deadline
from ..core.buffers import Buffer
from ..core.deadline import Deadline
from ..core.errors import timed_out_waiting
from ..core.opspec import OpSpec
from ..debug.recorder import attach as attach_trace
from ..engines.base import Engine, OpContext
from . import device_engines
from .failure import FailurePath
from .queue import OpQueue
from .state import GroupState
from .work import Work

if TYPE_CHECKING:
    from .progress import ProgressBoard


class ProcessGroup:
    """torch's ProcessGroup: ``rank()`` and ``size()`` in the group, plus pydist internals."""

    def __init__(self, name: str, group_id: int, global_ranks: list[int], global_rank: int, engine: Engine,
                 state: GroupState, timeout: float, desc: str = "", job: tuple[int, int] | None = None,
                 progress: ProgressBoard | None = None, transport_ranks: list[int] | None = None):
        """``global_ranks``: the members, in group-rank order; ``job``: (rank, size) of this
        process in its whole job, under which the flight recorder files the group (default:
        ``global_rank`` and the group's size); ``progress``: the board that names the ranks
        behind at a timeout; ``transport_ranks``: the members' transport ranks (default: the
        global ranks)."""
        self.group_name = name
        self.group_desc = desc or name
        self.group_id = group_id
        self._ranks = list(global_ranks)
        self._rank = self._ranks.index(global_rank)
        self._engine = engine
        self._timeout = timeout
        self._timeout_text = timed_out_waiting(timeout)
        self._state = state
        self._queue = OpQueue(name, state)
        self._trace = attach_trace(self, *(job or (global_rank, len(global_ranks))))  # pydist.debug
        self._progress = progress
        self._failures = FailurePath(group_id, engine, state, self._ranks, transport_ranks or self._ranks,
                                     progress, timeout)

    # -- torch's ProcessGroup API ---------------------------------------------------------
    def rank(self) -> int:
        """This rank's rank in the group (its group rank)."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return len(self._ranks)

    def name(self) -> str:
        """The engine's name: "pydist" or "mpi"."""
        return self._engine.name

    def getBackendName(self) -> str:  # noqa: N802 - torch's spelling
        """The engine's name, as torch's ``ProcessGroup.getBackendName``."""
        return self._engine.name

    @property
    def ranks(self) -> list[int]:
        """Global ranks of the members, in group-rank order."""
        return list(self._ranks)

    @property
    def failures(self) -> FailurePath:
        """What this group does with a failed operation (groups.failure)."""
        return self._failures

    @property
    def timeout(self) -> float:
        """The group's default operation timeout, in seconds."""
        return self._timeout

    def set_timeout(self, seconds: float) -> None:
        """Make ``seconds`` the default timeout of the group's operations from the next one on
        (torch's ``ProcessGroup.set_timeout``; an operation already running keeps its deadline)."""
        self._timeout_text = timed_out_waiting(seconds)
        self._timeout = seconds
        self._failures.set_timeout(seconds)

    @property
    def state(self) -> GroupState:
        """The group's lifecycle on this rank (see pydist.groups.state)."""
        return self._state

    @property
    def engine(self) -> Engine:
        """The engine that runs the group's operations (native or MPI)."""
        return self._engine

    def group_rank_of(self, global_rank: int) -> int | None:
        """The group rank of ``global_rank``; None if it is not a member."""
        try:
            return self._ranks.index(global_rank)
        except ValueError:
            return None

    # -- running operations ---------------------------------------------------------------
    def run(self, spec: OpSpec, call: Callable[..., str | None], args: tuple, outputs: list[Buffer],
            async_op: bool, results: list[Any] | None = None, timeout: float | None = None) -> Work | None:
        """Execute the call ``spec`` describes, ``call(ctx, *args)`` with its OpContext (an
        engine's method: ``engine.all_reduce``, and its arguments), in order with the
        others; Work when async, else None after it ends. ``timeout`` (seconds) narrows the
        group's timeout for this operation. On an idle group a blocking call runs now in this
        thread; an async one is queued, and a ``wait()`` (without a timeout) that comes
        before the progress thread took it runs it in the waiting thread instead
        (``OpQueue.run_through``): torch's blocking calls, async underneath, take no thread hop."""
        queue = self._queue
        seq = None if async_op else queue.claim()
        if seq is not None:  # the latency path: run now in this thread, no Work
            try:
                self._execute(seq, spec, self._trace.begin(spec, seq), outputs, timeout, call, args)
            finally:
                queue.release()
            return None
        entry = self._trace.queued(spec, async_op)
        work = QueuedWork(f"{spec.name} on group {self.group_name}",
                          results if results is not None else [b.obj for b in outputs], queue)
        queue.submit(partial(self._started, spec, call, args, outputs, entry, timeout), work, blocking=not async_op)
        if async_op:
            return work
        work.wait()
        return None

    def _started(self, spec: OpSpec, call: Callable[..., str | None], args: tuple, outputs: list[Buffer],
                 entry: Any, timeout: float | None, seq: int) -> None:
        """A queued operation's turn: the recorder told it started, then ``_execute``."""
        self._trace.started(entry, seq)
        self._execute(seq, spec, entry, outputs, timeout, call, args)

    def _execute(self, seq: int, spec: OpSpec, entry: Any, outputs: list[Buffer], timeout: float | None,
                 call: Callable[..., str | None], args: tuple) -> None:
        """Run operation ``seq`` (its recorder ``entry`` started) as ``call(ctx, *args)``,
        within the group's timeout or ``timeout`` seconds, then write the staged ``outputs``
        back; the progress board, the desync record and the recorder told. A failure takes
        the group's FailurePath: the error itself, or the group's failure it stands for, is
        recorded and raised."""
        try:
            if self._progress is not None:
                self._progress.started(self.group_id, seq, spec.name)
            self._state.started(seq, spec.call)  # a peer's message of another call: desynchronised
            if timeout is None:
                deadline, text = Deadline(_deadline.now() + self._timeout), self._timeout_text
            else:
                deadline, text = Deadline(_deadline.now() + timeout), timed_out_waiting(timeout)
            algorithm = call(OpContext(spec.name, seq, deadline, text, spec), *args)
            for buffer in outputs:
                if buffer.staged:
                    buffer.write_back()
        except BaseException as error:
            failure = self._failures.collective(error, seq)
            self._trace.failed(entry, failure)
            if failure is error:
                raise
            raise failure from error.__cause__
        self._trace.completed(entry, algorithm)

    def destroy(self, timeout: float | None = None) -> None:
        """Finish queued operations (up to ``timeout``), move the state to destroyed, stop
        the progress thread, release the engine's resources."""
        self._queue.close(timeout)
        self._trace.destroy()
        device_engines.close(self)  # before the engine's: its arena carried the device engine's control
        self._engine.close()

    def __repr__(self) -> str:
        return f"<ProcessGroup {self.group_name} ranks={self._ranks} rank={self._rank}>"


class QueuedWork(Work):
    """The Work of a queued operation: ``wait()`` without a timeout runs the queued
    operations up to this one in the waiting thread while the group is idle
    (``OpQueue.run_through``: it would only wait for the progress thread to do the same);
    with a timeout it waits as any Work."""

    def __init__(self, description: str, outputs: list[Any], queue: OpQueue):
        super().__init__(description, outputs)
        self._queue = queue

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None and not self._done:
            self._queue.run_through(self)
        return super().wait(timeout)
