"""Running a group's operations one at a time, in issue order, on every rank.

A blocking operation on an idle group runs inline in the caller's thread (the latency
path). Anything else (async operations, operations issued while others are queued or
running) goes into a FIFO served by the group's progress thread, started on first need, or
by a thread that waits on one of them: on an idle group the waiter runs the queued
operations up to its own (run_through), as the progress thread would. While waiters run
them (torch's blocking calls arrive async, then wait at once), a submission does not wake
the progress thread, which then looks every POLL_SECONDS instead (lazy): each wake would
cost such a call a thread switch. An operation nobody waits on still starts within
POLL_SECONDS, and at once again from then on; IDLE_POLLS empty looks end the lazy mode.
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

#: how often a lazy progress thread looks for operations nobody waits on (see the module's
#: docstring): the most an async call waits to start after blocking calls were run by their
#: waiters; and how many empty looks in a row make it sleep until woken again. Few: a stream
#: of async calls and waits submits every few microseconds, and each look takes the GIL,
#: which makes the caller's torch code (its bindings release the GIL at most tensor
#: methods) wake the looking thread at every release, on the core another rank runs on:
#: 100 looks (0.1 s) after every async burst made the blocking calls that followed up to
#: 1.2x slower (torch_calls, broadcast: 8.2-9.6 us a call with 100, 8.0-8.4 with 5, measured
#: together with the shared-memory progress thread's longer idle nap; issue 49).
POLL_SECONDS = 0.001
IDLE_POLLS = 5


class OpQueue:
    """FIFO of one group's operations with an inline fast path; ``state``: the group's
    lifecycle (a new one if not given)."""

    def __init__(self, name: str, state: GroupState | None = None):
        self.name = name
        self.state = state if state is not None else GroupState()
        self._lock = threading.Lock()  # taken directly on the latency path (cheaper than the Condition)
        self._cond = threading.Condition(self._lock)  # drainers wait on it
        self._ready = threading.Condition(self._lock)  # the progress thread waits on it
        self._lazy = False  # waiters run the operations: submissions do not wake the progress thread
        self._queued = 0  # operations queued so far (the lazy progress thread's sign of activity)
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
                self._queued += 1
                self._start_thread()
                if not self._lazy:
                    self._ready.notify()
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
            if self._pending:
                self._ready.notify()
            if self._drainers:
                self._cond.notify_all()

    def run_through(self, work: Work) -> None:
        """The waiter's path: while the group is idle and ``work`` is not done (so its
        operation is still queued), run the next queued operation in this thread: the
        waiter blocks until its own is done, which needs those ahead of it. In order, as
        the progress thread would, each error delivered through its own Work; nothing when
        another thread is running one (the progress thread goes on with the queue)."""
        while True:
            with self._lock:
                if self._busy or not self._pending or work.is_completed():
                    return
                seq, operation, queued = self._pending.popleft()
                self._busy = True
                if not self._lazy:  # the progress thread sleeps until woken: make it look by itself
                    self._lazy = True
                    self._ready.notify()
            self._execute_and_release(seq, operation, queued)
            if queued is work:
                return

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
        empty, seen = 0, self._queued  # looks in a row during which nothing was queued, while lazy
        while True:
            with self._lock:
                while self.state.state is not DESTROYED and (self._busy or not self._pending):
                    if not self._lazy:
                        self._ready.wait()
                    elif not self._ready.wait(POLL_SECONDS):
                        empty, seen = (empty + 1 if self._queued == seen else 0), self._queued
                        if empty >= IDLE_POLLS:
                            self._lazy = False
                if not self._pending:
                    return
                seq, operation, work = self._pending.popleft()
                self._busy, self._lazy, empty = True, False, 0  # one nobody ran: wake at once again
            self._execute_and_release(seq, operation, work)

    def _execute_and_release(self, seq: int, operation: Operation, work: Work) -> None:
        """Run one operation (``_busy`` already set), then let the next one go."""
        try:
            self._execute(seq, operation, work)
        finally:
            with self._cond:
                self._busy = False
                if self._drainers:
                    self._cond.notify_all()
                if self._pending:
                    self._ready.notify()

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
            self._ready.notify_all()
            leftover = list(self._pending)
            self._pending.clear()
        for seq, _operation, work in leftover:
            work._fail(DistBackendError(f"process group {self.name} was destroyed before operation "
                                        f"seq {seq} ran"))
        if self._thread is not None and self._thread is not threading.current_thread():
            _deadline.join(self._thread, timeout)
