"""A fake clock for tests of timeout logic: timeouts expire without the real time passing.

``MockClock`` follows trio's MockClock with autojump: time moves on by itself (it is the real
monotonic time plus an offset), ``sleep(s)`` adds ``s`` to the offset at once, and when
``parties`` threads are all blocked in timed waits on it (Deadline.wait, timed_wait) and
nothing has completed for ``autojump_threshold`` real seconds, it jumps to the earliest of
their deadlines, so that wait times out at once. Install it with ``installed()`` (or
pydist.core.deadline.set_clock); it affects every Deadline of this process, so only tests whose
ranks are threads of this process use it, and ``parties`` must count every thread that
waits on it (a wait by fewer threads is real: a peer may still be on its way). Service
threads wait on it too while something of theirs is due: a TCPStore server of this process
with a blocking request parked (an idle one waits on its sockets alone), a launcher agent's
monitor. Background paces (the progress thread's tick, the tcp I/O thread, idle workers)
stay on real time and never count.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from ..core import deadline as _deadline

__all__ = ["MockClock"]

#: Real seconds a blocked waiter sleeps between looks at the fake time.
POLL_SECONDS = 0.002


class MockClock:
    """Real monotonic time plus an offset that sleeps and autojumps advance (see the module)."""

    def __init__(self, parties: int = 1, autojump_threshold: float = 0.05):
        self.parties = parties
        self.autojump_threshold = autojump_threshold
        self._offset = 0.0
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}  # waiter id -> the fake time its wait ends
        self._idle_since: float | None = None  # real time since all parties have been waiting
        self.jumps = 0  # how many times the clock jumped (for tests of the tests)

    def monotonic(self) -> float:
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake time ``seconds`` on."""
        with self._lock:
            self._offset += max(0.0, seconds)

    def sleep(self, seconds: float) -> None:
        """Return at once, ``seconds`` of fake time later."""
        self.advance(seconds)

    def wait(self, wait: Callable[[float | None], bool], timeout: float | None) -> bool:
        """``wait`` polled in short real slices until it is done (True) or the fake time passes
        ``timeout`` (False); the fake time may jump there (see the module)."""
        end = None if timeout is None else self.monotonic() + timeout
        me = object()
        with self._lock:
            self._deadlines[id(me)] = float("inf") if end is None else end
            self._idle_since = None
        try:
            while True:
                if wait(POLL_SECONDS):
                    return True
                if end is not None and self.monotonic() >= end:
                    return wait(0)  # a last look: done just now counts as done
                self._maybe_jump()
        finally:
            with self._lock:
                del self._deadlines[id(me)]
                self._idle_since = None

    def _maybe_jump(self) -> None:
        with self._lock:
            if len(self._deadlines) < self.parties:
                self._idle_since = None
                return
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
                return
            if now - self._idle_since < self.autojump_threshold:
                return
            target = min(self._deadlines.values())
            if target != float("inf") and target > now + self._offset:
                self._offset = target - now
                self.jumps += 1
            self._idle_since = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[MockClock]:
        """This clock for every Deadline and timed wait of the process, inside the block."""
        previous = _deadline.set_clock(self)
        try:
            yield self
        finally:
            _deadline.set_clock(previous)
