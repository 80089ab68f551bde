"""A bounded pool of reused host staging buffers (pinned memory on a GPU host), one per group.

Behaviour
    The pool holds at most ``max_buffers`` buffers of ``buffer_bytes`` each. A buffer is made
    by the ``allocate(nbytes)`` callable the first time the pool has no idle one and is under
    its bound (the CUDA layer passes ``torch.empty(n, dtype=uint8, pin_memory=True)``; tests
    pass numpy), and from then on reused: ``release`` puts it back on the idle list and never
    frees it, so a steady workload allocates pinned memory once. ``acquire(deadline)`` takes an
    idle buffer or makes one; at the bound it waits until a buffer is released.
    ``try_acquire()`` never waits (None at the bound). ``close()`` frees the idle buffers
    through ``free`` and the ones still out as they come back.

    The pool never allocates past its bound: a call whose tensor needs more chunks than the
    pool has buffers goes through them in turn (pydist.device.staged_schedule holds at most
    ``max_buffers`` at once and only *waits* on the pool while it holds none, so the pool
    cannot deadlock on itself; see that module).

Cost
    ``acquire``/``release`` take one lock and touch a list: ~1 µs. Memory: at most
    ``max_buffers * buffer_bytes`` of pinned host memory for the group's life (none until the
    first staged call).

Failure modes
    A wait past ``deadline`` raises OpTimeoutError naming the pool, its bound and how many
    buffers are out (a holder that never releases: a stuck call of the same group, or a leak).
    ``allocate`` raising (pinned memory exhausted) propagates; the pool's count is unchanged.
    Releasing a buffer that is not out from this pool (a foreign one, or twice) raises
    ValueError. ``acquire`` after ``close`` raises DistBackendError.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ..core.deadline import Deadline
from ..core.errors import DistBackendError, OpTimeoutError, timed_out_waiting

B = TypeVar("B")


def buffers_for(pool_bytes: int, buffer_bytes: int) -> int:
    """How many buffers of ``buffer_bytes`` a pool of ``pool_bytes`` holds (at least one
    whole buffer: ValueError otherwise)."""
    if buffer_bytes < 1:
        raise ValueError(f"buffer_bytes: expected at least 1, got {buffer_bytes}")
    if pool_bytes < buffer_bytes:
        raise ValueError(f"a pinned pool of {pool_bytes} bytes holds no buffer of {buffer_bytes} bytes")
    return pool_bytes // buffer_bytes


class PinnedPool(Generic[B]):
    """At most ``max_buffers`` buffers of ``buffer_bytes``, made on demand, then reused."""

    def __init__(self, buffer_bytes: int, max_buffers: int, allocate: Callable[[int], B],
                 free: Callable[[B], None] | None = None, name: str = "pinned pool"):
        if buffer_bytes < 1 or max_buffers < 1:
            raise ValueError(f"{name}: expected buffer_bytes and max_buffers >= 1, "
                             f"got {buffer_bytes} and {max_buffers}")
        self.buffer_bytes = buffer_bytes
        self.max_buffers = max_buffers
        self.name = name
        self._allocate = allocate
        self._free = free
        self._lock = threading.Condition()
        self._idle: list[B] = []
        self._out: dict[int, B] = {}  # id(buffer) -> buffer, for the buffers handed out
        self._closed = False
        #: Buffers made so far (never more than max_buffers).
        self.allocated = 0
        #: The most buffers out at once.
        self.peak_out = 0
        #: acquire calls that had to wait for a release.
        self.waits = 0

    @property
    def out(self) -> int:
        """Buffers handed out and not yet released."""
        return len(self._out)

    def _take(self) -> B | None:
        """An idle buffer, or a new one under the bound, or None (lock held)."""
        if self._closed:
            raise DistBackendError(f"{self.name}: acquire after close")
        if self._idle:
            buffer = self._idle.pop()
        elif self.allocated < self.max_buffers:
            buffer = self._allocate(self.buffer_bytes)
            self.allocated += 1
        else:
            return None
        self._out[id(buffer)] = buffer
        self.peak_out = max(self.peak_out, len(self._out))
        return buffer

    def try_acquire(self) -> B | None:
        """A buffer now, or None when all ``max_buffers`` are out."""
        with self._lock:
            return self._take()

    def acquire(self, deadline: Deadline) -> B:
        """A buffer, waiting for a release while all are out; OpTimeoutError past ``deadline``."""
        with self._lock:
            buffer = self._take()
            if buffer is not None:
                return buffer
            self.waits += 1
            found: list[B] = []

            def ready(seconds: float | None) -> bool:
                got = self._lock.wait_for(lambda: self._closed or bool(self._idle), seconds)
                if got:
                    taken = self._take()
                    assert taken is not None
                    found.append(taken)
                return got

            if not deadline.wait(ready):
                raise OpTimeoutError(
                    f"{self.name}: {timed_out_waiting(None)} for a staging buffer: all {self.max_buffers} "
                    f"of {self.buffer_bytes} bytes are out ({len(self._out)} held)")
            return found[0]

    def release(self, buffer: B) -> None:
        """Give ``buffer`` back (freed at once if the pool is closed); ValueError if it is not out."""
        with self._lock:
            if self._out.pop(id(buffer), None) is None:
                raise ValueError(f"{self.name}: released a buffer it did not hand out (or twice)")
            if self._closed:
                self._dispose(buffer)
                return
            self._idle.append(buffer)
            self._lock.notify()

    def _dispose(self, buffer: B) -> None:
        self.allocated -= 1
        if self._free is not None:
            self._free(buffer)

    def close(self) -> None:
        """Free the idle buffers now and the rest when released; later acquires raise."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            for buffer in idle:
                self._dispose(buffer)
            self._lock.notify_all()

    def __repr__(self) -> str:
        return (f"PinnedPool({self.name}: {self.out} out, {self.allocated}/{self.max_buffers} made, "
                f"{self.buffer_bytes} bytes each)")
