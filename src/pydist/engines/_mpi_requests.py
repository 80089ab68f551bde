"""Waiting on MPI requests with deadlines, and point-to-point requests that complete on their own.

MPI's blocking calls cannot time out, so every MPI operation of the engine is started
non-blocking and finished by ``poll_until``: it tests the request, first spinning (a few
tests, then ``sched_yield`` so that ranks sharing a core still run) for a time that grows
with the message, then sleeping with a back-off (each sleep at most 1/8 of the time waited
so far and at most MAX_SLEEP), until it completes or the deadline passes. MPI progresses
only inside MPI calls, so the spin keeps large transfers moving; the sleeps keep a rank
that waits for a hung peer cheap.

``MpiRequest`` is a transport Request (what pydist's point-to-point layer waits on) backed
by an MPI request: ``wait`` polls it in the caller's thread, and the process's Poller
thread completes requests nobody waits on, so ``is_completed()`` and futures work too.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..core import deadline as _deadline
from ..core.errors import DistBackendError
from ..transport.base import Request
from ._mpi_world import load_mpi

SPIN_SECONDS = 0.002
SPIN_SECONDS_PER_BYTE = 1e-9  # plus 1 ms per MB: a big transfer spins while MPI moves it
TESTS_PER_YIELD = 10  # MPI progresses only in MPI calls: a few tests between yields keep it moving
MIN_SLEEP = 50e-6
MAX_SLEEP = 0.01
POLLER_MAX_SLEEP = 0.002
CANCEL_SECONDS = 1.0

#: MPI requests given up on (timed out, cannot be cancelled), kept with their buffers so that
#: MPI never writes into or reads from freed memory.
ABANDONED: list = []


def spin_seconds(nbytes: int) -> float:
    return SPIN_SECONDS + nbytes * SPIN_SECONDS_PER_BYTE


def poll_until(test: Callable[[], bool], deadline: float | None, spin: float = SPIN_SECONDS) -> bool:
    """Call ``test()`` until it is True (return True) or pydist's clock (``core.deadline.now``,
    where ``Deadline.at`` lives) reaches ``deadline`` (None: never; return False): spin for
    ``spin`` seconds, then sleep on that clock with a back-off. The spin reads the same clock:
    under the real one it is real time; a fake clock's jump only ends it early."""
    if test():
        return True
    start = _deadline.now()
    spin_end = start + spin
    delay = MIN_SLEEP
    while True:
        now = _deadline.now()
        if deadline is not None and now >= deadline:
            return test()
        if now < spin_end:
            for _ in range(TESTS_PER_YIELD):
                if test():
                    return True
            os.sched_yield()
        else:
            pause = min(delay, max(MIN_SLEEP, (now - start) / 8))
            _deadline.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
            delay = min(delay * 2, MAX_SLEEP)
        if test():
            return True


def mpi_error(operation: str, rank: int, error: BaseException) -> DistBackendError:
    """An MPI error of ``operation`` (may be empty) on ``rank`` as DistBackendError with MPI's text."""
    text = error.Get_error_string() if hasattr(error, "Get_error_string") else str(error)
    where = f"{operation}: " if operation else ""
    wrapped = DistBackendError(f"{where}MPI error on rank {rank}: {text.strip()}")
    wrapped.__cause__ = error
    return wrapped


class MpiRequest(Request):
    """A posted MPI send or receive as a transport Request (``source``: the sender's label,
    for receives from any rank). Completes once, from whichever thread tests it first."""

    __slots__ = ("mpi_request", "labels", "me", "receive", "keep", "_testing", "_status")

    def __init__(self, peer: int | None, buffer: memoryview, mpi_request, labels: list[int], me: int,
                 receive: bool, keep: object = None):
        super().__init__(peer, buffer)
        self.receive = receive
        self.mpi_request = mpi_request
        self.labels = labels  # group rank -> the rank reported as source
        self.me = me  # this rank's label, for messages
        self.keep = keep  # the array MPI reads or writes, alive until done
        self._testing = threading.Lock()
        self._status = load_mpi().Status()

    def test(self) -> bool:
        """Test the MPI request once (skipped while another thread tests it); True when complete."""
        if self._completed:
            return True
        if not self._testing.acquire(blocking=False):
            return False
        try:
            if self._completed:
                return True
            try:
                if not self.mpi_request.Test(self._status):
                    return False
            except load_mpi().Exception as error:
                self.complete(mpi_error("", self.me, error))
                return True
            if self._status.Is_cancelled():
                self.complete(DistBackendError(f"cancelled on rank {self.me}"))
            else:
                self.complete(None, self._source() if self.receive else self.peer)
            return True
        finally:
            self._testing.release()

    def add_callback(self, callback) -> None:
        """As Request's; the poller then tests this request until it completes."""
        super().add_callback(callback)
        if not self._completed:
            POLLER.add(self)

    def wait(self, timeout: float | None) -> bool:
        """Poll until complete or ``timeout`` seconds pass (None: forever); True when complete."""
        if self._completed:
            return True
        deadline = None if timeout is None else _deadline.now() + timeout
        return poll_until(self.test, deadline, spin_seconds(self.nbytes))

    def cancel(self) -> None:
        """Withdraw the request: a receive not yet matched is cancelled in MPI (waiting up to
        CANCEL_SECONDS for MPI to confirm); a send, or a receive MPI does not let go, is
        abandoned (kept alive, never reused). Completes with an error unless the data arrived."""
        with self._testing:
            if self._completed:
                return
            mpi = load_mpi()
            try:
                if not self.mpi_request.Test(self._status) and self.receive:
                    self.mpi_request.Cancel()
                    poll_until(lambda: self.mpi_request.Test(self._status), _deadline.now() + CANCEL_SECONDS)
            except mpi.Exception:
                pass
            if self.mpi_request != mpi.REQUEST_NULL:
                ABANDONED.append((self.mpi_request, self.keep))
            elif not self._status.Is_cancelled():
                self.complete(None, self._source() if self.receive else self.peer)
                return
            self.complete(DistBackendError(f"withdrawn on rank {self.me} after a timeout"))

    def _source(self) -> int | None:
        source = self._status.Get_source()
        return self.labels[source] if 0 <= source < len(self.labels) else None


class Poller:
    """A thread that tests pending MpiRequests until they complete (so callbacks run without
    a waiter). Runs while some engine uses it; sleeps on a condition when nothing is pending."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: list[MpiRequest] = []
        self._users = 0
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        with self._cond:
            self._users += 1

    def release(self) -> None:
        """One user less; the last one stops the thread (pending requests are abandoned)."""
        with self._cond:
            self._users -= 1
            if self._users > 0:
                return
            for request in self._pending:
                if not request.done():
                    ABANDONED.append((request.mpi_request, request.keep))
            self._pending.clear()
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def add(self, request: MpiRequest) -> None:
        with self._cond:
            self._pending.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="pydist-mpi-poller", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _serve(self) -> None:
        # real time throughout: the poll's pace, not a timeout (nothing waits for a deadline here)
        me = threading.current_thread()
        idle_since = time.monotonic()
        while True:
            with self._cond:
                while self._thread is me and not self._pending:
                    self._cond.wait()
                    idle_since = time.monotonic()
                if self._thread is not me:
                    return
                pending = list(self._pending)
            finished = [request for request in pending if request.test()]
            with self._cond:
                if finished:
                    self._pending = [r for r in self._pending if not r.done()]
                    idle_since = time.monotonic()
                pause = min(POLLER_MAX_SLEEP, max(MIN_SLEEP, (time.monotonic() - idle_since) / 8))
                if self._pending and self._thread is me:
                    self._cond.wait(pause)


POLLER = Poller()
