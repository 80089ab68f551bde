"""Who waits for the TCP sockets: the I/O thread, or a caller that borrowed the read set.

Read interest lives in an inner epoll, *the read set*. The I/O thread waits on an outer
epoll that holds the read set, its wake-up socket and the sockets it must write to. A
caller blocked on a receive *borrows* the read set: it leaves the outer epoll (so the I/O
thread is not woken by arrivals and no thread hand-off happens), the caller waits on it and
reads whatever arrives from any peer itself. When it is done it keeps the read set, idle, so
that the next operation's arrivals (often there before it is called) do not wake the I/O
thread either; the I/O thread takes it back when another thread is about to sleep on a
message, or when it has been idle for IDLE_SECONDS (async traffic, aborts and dead peers are
then seen within that). ``read_lock`` is held by whoever reads sockets; the I/O thread reads
only while the read set is not borrowed. Linux (epoll), as the shared-memory transport.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

IN, OUT = select.EPOLLIN, select.EPOLLOUT
IDLE_SECONDS = 0.01  # a borrowed read set left idle this long goes back to the I/O thread


class Poller:
    """The read set, the I/O thread's outer wait, and their registrations (any thread)."""

    def __init__(self, wake_fd: int, wake: Callable[[], None]):
        """``wake_fd``: the I/O thread's wake-up socket, which ``wake()`` makes readable."""
        self._reads = select.epoll()
        self._outer = select.epoll()
        self._wake_fd = wake_fd
        self._wake = wake
        self._outer.register(wake_fd, IN)
        self._lent = {self._reads.fileno()}  # the read set while in the outer wait (see _lend)
        self._outer.register(self._reads.fileno(), IN)
        self._bell_r, self._bell_w = socket.socketpair()  # wakes a borrower waiting on the read set
        self._bell_r.setblocking(False)
        self._bell_w.setblocking(False)
        self.bell = self._bell_r.fileno()
        self._reads.register(self.bell, IN)
        self._arm_lock = threading.Lock()  # registrations change under it
        self._read_fds: set[int] = set()
        self._write_fds: set[int] = set()
        self.read_lock = threading.Lock()  # held by the I/O thread while it reads, and to borrow
        self.borrowed = False
        self.owner = 0  # the borrowing thread's ident
        self.depth = 0  # > 0: the owner is driving it now (enter/leave nest); 0: idle
        self.idle_since = 0.0
        self.sleepers = 0  # threads asleep on a message the I/O thread must read
        self._closed = False

    def want(self, fd: int, read: bool, write: bool) -> None:
        """Wait for ``fd`` to be readable (in the read set) and/or writable (I/O thread)."""
        with self._arm_lock:
            if self._closed:
                return
            _update(self._reads, self._read_fds, fd, IN, read)
            _update(self._outer, self._write_fds, fd, OUT, write)

    def wait_io(self, at_most: float | None = None) -> tuple[bool, bool, list[int]]:
        """I/O thread: block until something happens, or ``at_most`` seconds (None: no bound);
        (woken, reads ready, writable fds). Takes back a read set left idle for IDLE_SECONDS
        (so it waits at most that long)."""
        woken, readable, writable = False, False, []
        # real time: IDLE_SECONDS is a scheduling interval (leave() stamps it per operation), not a timeout
        if self.borrowed and not self.depth and time.monotonic() - self.idle_since >= IDLE_SECONDS:
            self.release_idle()
            return False, True, []
        timeout = IDLE_SECONDS if self.borrowed else -1  # borrowed: look again for it going idle
        if at_most is not None:
            timeout = at_most if timeout < 0 else min(timeout, at_most)
        for fd, _ in self._outer.poll(timeout):
            if fd == self._wake_fd:
                woken = True
            elif fd == self._reads.fileno():
                readable = True
            else:
                writable.append(fd)
        return woken, readable, writable

    def ready_reads(self, timeout: float = 0) -> list[int]:
        """The readable sockets of the read set (waiting up to ``timeout`` seconds, or until
        ``ring``)."""
        ready = [fd for fd, _ in self._reads.poll(timeout)]
        if self.bell in ready:
            ready.remove(self.bell)
            try:
                while self._bell_r.recv(64):
                    pass
            except OSError:
                pass
        return ready

    def ring(self) -> None:
        """Wake the borrower waiting in ``ready_reads`` (what it waits for finished elsewhere)."""
        try:
            self._bell_w.send(b"\0")
        except OSError:
            pass

    def driving(self) -> bool:
        """The calling thread drives the read set now."""
        return self.depth > 0 and self.owner == threading.get_ident()

    def enter(self) -> bool:
        """The calling thread drives the read set from now until ``leave`` (calls nest),
        borrowing it, or taking it over while idle; False when another thread reads it."""
        me = threading.get_ident()
        if self.depth and self.owner == me:  # nested: only the owner changes depth meanwhile
            self.depth += 1
            return True
        if not self.read_lock.acquire(blocking=False):
            return False
        try:
            if self.depth and self.owner != me:
                return False
            if not self.borrowed:
                self._lend(True)
                self._wake()  # the I/O thread then waits with IDLE_SECONDS' timeout (see wait_io)
            self.owner = me
            self.depth += 1
            return True
        finally:
            self.read_lock.release()

    def leave(self) -> None:
        """End one ``enter``: the read set stays borrowed, idle, unless a thread sleeps on a
        message (then the I/O thread gets it back at once)."""
        with self.read_lock:
            self.depth -= 1
            if self.depth:
                return
            self.idle_since = time.monotonic()
            if self.sleepers:
                self._lend(False)

    def release_idle(self) -> None:
        """Give an idle borrowed read set back to the I/O thread (any thread)."""
        if not self.borrowed or self.depth:  # the common case, without waiting for the I/O thread's read
            return
        with self.read_lock:
            if self.borrowed and not self.depth:
                self._lend(False)

    def _lend(self, borrowed: bool) -> None:
        """Under ``read_lock``: the read set leaves (or rejoins) the I/O thread's wait."""
        self.borrowed = borrowed
        if not borrowed:
            self.owner = 0
        with self._arm_lock:
            if not self._closed:
                _update(self._outer, self._lent, self._reads.fileno(), IN, not borrowed)

    def close(self) -> None:
        with self._arm_lock:
            self._closed = True
            self._reads.close()
            self._outer.close()
            self._bell_r.close()
            self._bell_w.close()


def _update(epoll: select.epoll, registered: set[int], fd: int, event: int, wanted: bool) -> None:
    if wanted and fd not in registered:
        epoll.register(fd, event)
        registered.add(fd)
    elif not wanted and fd in registered:
        epoll.unregister(fd)
        registered.discard(fd)
