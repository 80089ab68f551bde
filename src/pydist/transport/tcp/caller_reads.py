"""A caller blocked on a tcp receive reads the sockets itself (PYDIST_TCP_READER=caller).

It borrows the I/O thread's read set (see poller) and reads whatever arrives from any peer
until its receive completes, as MPI progress engines do, so a message costs no hand-off
between threads; a message over CALLER_READ_BYTES is left to the I/O thread, which reads the
next segment while the caller reduces the last. A small blocking operation borrows the
sockets from its start to its end (``engage``). Mixed into TcpTransport.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core import deadline as _deadline
from ..base import Request

if TYPE_CHECKING:
    from .connection import Connection
    from .poller import Poller

#: A caller reading the sockets looks at least this often (seconds) whether its receive was
#: completed some other way (an abort or a dead peer seen by another transport).
DRIVE_SLICE = 0.05
#: A message up to this size is read by its blocked caller (larger ones: the I/O thread, which
#: reads the next segment while the caller reduces the last; measured faster from 1 MiB up); an
#: operation up to this size borrows the sockets from its start to its end.
CALLER_READ_BYTES = 64 * 1024


class CallerReads:
    """TcpTransport's waits: a caller reading the sockets (``drive``) or asleep (``sleep``)."""

    _poller: Poller
    caller_reads: bool
    _failed_while_read: bool
    _by_fd: dict[int, Connection]
    _every: list[Connection]

    def _read(self, conn: Connection) -> None:
        raise NotImplementedError  # TcpTransport reads a connection

    def driver(self, nbytes: int) -> Callable[[Request, float | None], bool]:
        """How a caller blocked on a message of ``nbytes`` waits: reading the sockets itself
        (``drive``), or asleep while the I/O thread reads (``sleep``: PYDIST_TCP_READER=io,
        or a message over CALLER_READ_BYTES)."""
        return self.drive if self.caller_reads and nbytes <= CALLER_READ_BYTES else self.sleep

    def drive(self, request: Request, timeout: float | None) -> bool:
        """The caller blocked on ``request`` reads every peer's socket itself until the
        request completes (True) or ``timeout`` seconds pass (False); while another caller
        drives them it sleeps instead (``sleep``)."""
        poller = self._poller
        if not poller.enter():
            return self.sleep(request, timeout)
        end = None if timeout is None else _deadline.now() + timeout
        request.add_callback(self._ring_unless_mine)
        try:
            ready = poller.ready_reads()
            while True:
                for fd in ready:
                    self._read(self._by_fd[fd])
                if request._completed:
                    break
                left = DRIVE_SLICE if end is None else min(DRIVE_SLICE, end - _deadline.now())
                if left <= 0:
                    return False
                ready = poller.ready_reads(left)
        finally:
            self._leave()
        return True

    def engage(self, nbytes: int) -> bool:
        """A blocking operation of ``nbytes`` starts in this thread: for a small one (at most
        CALLER_READ_BYTES), borrow the sockets for all of it (True: ``disengage`` at its end),
        so that no arrival wakes the I/O thread between its steps; a large one borrows them
        only while it waits (the I/O thread then reads a segment while the caller reduces
        the previous one)."""
        return self.caller_reads and nbytes <= CALLER_READ_BYTES and self._poller.enter()

    def disengage(self) -> None:
        self._leave()

    def sleep(self, request: Request, timeout: float | None) -> bool:
        """Wait for ``request`` without reading: the I/O thread (or the thread driving the
        sockets now) reads for it."""
        poller = self._poller
        poller.sleepers += 1  # under the GIL; read by leave() under its lock
        try:
            poller.release_idle()
            return request.sleep(timeout)
        finally:
            poller.sleepers -= 1

    def _leave(self) -> None:
        self._poller.leave()
        if self._failed_while_read:
            self._failed_while_read = False
            for conn in self._every:
                if conn.error is not None:
                    conn.receiver.abandon(conn.error)  # failed while a caller read it

    def _ring_unless_mine(self, request: Request) -> None:
        """A driven request completed: wake its driver if another thread completed it."""
        if not self._poller.driving():
            self._poller.ring()

    def reading_elsewhere(self) -> bool:
        """A caller drives the sockets now (see drive): it abandons a failed frame itself."""
        if self._poller.depth:
            self._failed_while_read = True
            return True
        return False
