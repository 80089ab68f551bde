"""Running a group's operations one at a time, in issue order, on every rank.

A blocking operation on an idle group runs inline in the caller's thread (the latency
path). Anything else (async operations, operations issued while others are queued or
running) goes into a FIFO served by the group's progress thread, started on first need, or
by a thread waiting on its Work that finds it next in line on an idle group (run_if_next).
Completing a Work here only marks it done: its callbacks run on the callback runner
(callbacks), so one that waits on another operation of this group does not stall it.

The queue reads the group's lifecycle (see state): once a failed operation has *broken* the
group (its FailurePath fires that event, see failure), queued and later operations fail at
once with an error that names that first failure, instead of hanging on peers that have
moved on; ``close`` *destroys* it, after which submitting raises.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ..core import deadline as _deadline
from ..core.errors import DistBackendError
from .state import DESTROYED, GroupState
from .work import Work

Operation = Callable[[int], int | None]  # run(seq) -> source rank or None


class OpQueue:
    """FIFO of one group's operations with an inline fast path; ``state``: the group's
    lifecycle (a new one if not given)."""

    def __init__(self, name: str, state: GroupState | None = None):
        self.name = name
        self.state = state if state is not None else GroupState()
        self._lock = threading.Lock()  # taken directly on the latency path (cheaper than the Condition)
        self._cond = threading.Condition(self._lock)
        self._pending: deque[tuple[int, Operation, Work]] = deque()
        self._busy = False
        self._drainers = 0  # threads in drain: release wakes them (the latency path skips the notify otherwise)
        self._seq = 0
        self._thread: threading.Thread | None = None

    def submit(self, operation: Operation, work: Work, blocking: bool) -> Work:
        """Queue ``operation`` (it receives its sequence number); return its Work."""
        with self._cond:
            if self.state.state is DESTROYED:
                raise self._destroyed_error()
            self._seq += 1
            seq = self._seq
            inline = blocking and not self._busy and not self._pending
            if inline:
                self._busy = True
            else:
                self._pending.append((seq, operation, work))
                self._start_thread()
                self._cond.notify_all()
        if inline:
            self._execute_and_release(seq, operation, work)
        return work

    def claim(self) -> int | None:
        """The latency path: if the group is idle, mark it busy and return the next sequence
        number (the caller runs that operation now in its thread, then calls ``release``);
        else None (the caller submits instead). A broken group raises, released."""
        state = self.state
        with self._lock:
            if state.state is DESTROYED:
                raise self._destroyed_error()
            if self._busy or self._pending:
                return None
            self._busy = True
            self._seq += 1
            seq = self._seq
        if state.failed is not None:
            self.release()
            raise self._broken_error(seq)
        return seq

    def release(self) -> None:
        """End the operation ``claim`` let run: the next queued one may go, and a ``drain``
        (destroy, a world's close, a shrink) waiting for it returns."""
        with self._lock:
            self._busy = False
            if self._pending or self._drainers:
                self._cond.notify_all()

    def run_if_next(self, work: Work) -> None:
        """The waiter's path: when ``work``'s operation is the next queued and the group is
        idle, run it now in this thread (as the progress thread would: in order, its error
        delivered through ``work``); else nothing (the progress thread runs it)."""
        with self._lock:
            if self._busy or not self._pending or self._pending[0][2] is not work:
                return
            seq, operation, _ = self._pending.popleft()
            self._busy = True
        self._execute_and_release(seq, operation, work)

    def _destroyed_error(self) -> DistBackendError:
        return DistBackendError(f"process group {self.name} has been destroyed")

    def _broken_error(self, seq: int) -> DistBackendError:
        return DistBackendError(f"process group {self.name} is broken: an earlier operation failed "
                                f"({self.state.failed}); operation seq {seq} was not run")

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=f"pydist-progress-{self.name}",
                                            daemon=True)
            self._thread.start()

    def _execute(self, seq: int, operation: Operation, work: Work) -> None:
        if self.state.failed is not None:
            work._fail(self._broken_error(seq))
            return
        try:
            source = operation(seq)
        except BaseException as error:  # noqa: BLE001 - delivered through the Work
            work._fail(error)
        else:
            work._succeed(source)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self.state.state is not DESTROYED and (self._busy or not self._pending):
                    self._cond.wait()
                if not self._pending:
                    return
                seq, operation, work = self._pending.popleft()
                self._busy = True
            self._execute_and_release(seq, operation, work)

    def _execute_and_release(self, seq: int, operation: Operation, work: Work) -> None:
        """Run one operation (``_busy`` already set), then let the next one go."""
        try:
            self._execute(seq, operation, work)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def drain(self, timeout: float | None) -> bool:
        """Wait until nothing is queued or running; True when idle."""
        with self._cond:
            self._drainers += 1
            try:
                return _deadline.timed_wait(self._idle_within, timeout)
            finally:
                self._drainers -= 1

    def _idle_within(self, seconds: float | None) -> bool:
        """Under the lock: wait up to ``seconds`` for nothing queued or running (the primitive
        ``drain`` waits on through pydist's clock)."""
        return self._cond.wait_for(lambda: not self._pending and not self._busy, seconds)

    def close(self, timeout: float | None = None) -> None:
        """Let queued operations finish (up to ``timeout``), destroy the group (idempotent),
        fail what is still queued, then stop the progress thread."""
        self.drain(timeout)
        with self._cond:
            self.state.destroy()
            self._cond.notify_all()
            leftover = list(self._pending)
            self._pending.clear()
        for seq, _operation, work in leftover:
            work._fail(DistBackendError(f"process group {self.name} was destroyed before operation "
                                        f"seq {seq} ran"))
        if self._thread is not None and self._thread is not threading.current_thread():
            _deadline.join(self._thread, timeout)
