"""Who waits for the TCP sockets: the I/O thread, or a caller that borrowed the read set.

Read interest lives in an inner epoll, *the read set*. The I/O thread waits on an outer
epoll that holds the read set, its wake-up socket and the sockets it must write to. A
caller blocked on a receive *borrows* the read set: it leaves the outer epoll (so the I/O
thread is not woken by arrivals and no thread hand-off happens), the caller waits on it and
reads whatever arrives from any peer itself, then gives it back. ``read_lock`` is held by
whoever reads sockets; the I/O thread reads only while the read set is not borrowed.
Linux (epoll), as the shared-memory transport.
"""
from __future__ import annotations

import select
import socket
import threading

IN, OUT = select.EPOLLIN, select.EPOLLOUT


class Poller:
    """The read set, the I/O thread's outer wait, and their registrations (any thread)."""

    def __init__(self, wake_fd: int):
        self._reads = select.epoll()
        self._outer = select.epoll()
        self._wake_fd = wake_fd
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
        self._closed = False

    def want(self, fd: int, read: bool, write: bool) -> None:
        """Wait for ``fd`` to be readable (in the read set) and/or writable (I/O thread)."""
        with self._arm_lock:
            if self._closed:
                return
            _update(self._reads, self._read_fds, fd, IN, read)
            _update(self._outer, self._write_fds, fd, OUT, write)

    def wait_io(self) -> tuple[bool, bool, list[int]]:
        """I/O thread: block until something happens; (woken, reads ready, writable fds)."""
        woken, readable, writable = False, False, []
        for fd, _ in self._outer.poll():
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

    def mine(self) -> bool:
        """The calling thread has borrowed the read set."""
        return self.borrowed and self.owner == threading.get_ident()

    def borrow(self) -> bool:
        """A caller takes the read set (False: another thread reads or has it)."""
        if not self.read_lock.acquire(blocking=False):
            return False
        try:
            if self.borrowed:
                return False
            self._lend(True)
            self.owner = threading.get_ident()
            return True
        finally:
            self.read_lock.release()

    def give_back(self) -> None:
        """The caller returns the read set to the I/O thread."""
        with self.read_lock:
            self._lend(False)
            self.owner = 0

    def _lend(self, borrowed: bool) -> None:
        """Under ``read_lock``: the read set leaves (or rejoins) the I/O thread's wait."""
        self.borrowed = borrowed
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
