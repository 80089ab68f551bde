"""Absolute deadlines on the monotonic clock; every blocking call takes one.

The clock is injectable, for tests of timeout logic: ``set_clock(clock)`` makes Deadline read
``clock.monotonic()`` and route the timed waits made through it (``Deadline.wait``,
``timed_wait``, ``join``, ``sleep``) to ``clock.wait``/``clock.sleep``, so a fake clock
(pydist.testing.clock.MockClock) can let timeouts expire without the real time passing.
The real clock (the default) costs one global lookup per call: ``now`` is time.monotonic
itself, and the waits call the primitive directly.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

#: torch's default timeout for process groups (30 minutes).
DEFAULT_PG_TIMEOUT = timedelta(minutes=30)
#: torch's default timeout for stores (5 minutes).
DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)


def to_seconds(timeout: timedelta | float | int | None, default: float | None = None) -> float | None:
    """A timeout given as timedelta or seconds, as float seconds (None stays None unless default)."""
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(f"timeout: expected datetime.timedelta or seconds, got {type(timeout).__name__}")


class Clock(Protocol):
    """What ``set_clock`` takes: a monotonic time, a sleep, and a timed wait."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, wait: Callable[[float | None], bool], timeout: float | None) -> bool:
        """``wait(timeout)`` (a blocking primitive's wait: True when done, False on timeout)."""


#: The installed fake clock, or None for the real one (a global test, not a call, on hot paths).
_fake: Clock | None = None
#: The current clock's monotonic time, bound once per set_clock.
now: Callable[[], float] = time.monotonic


def set_clock(clock: Clock | None) -> Clock | None:
    """Install ``clock`` for every Deadline and timed wait of this process (None: the real
    clock again); return the clock it replaces (None for the real one). Tests only."""
    global _fake, now
    previous = _fake
    _fake = clock
    now = time.monotonic if clock is None else clock.monotonic
    return previous


def sleep(seconds: float) -> None:
    """Sleep ``seconds`` on the current clock."""
    if _fake is None:
        time.sleep(seconds)
    else:
        _fake.sleep(seconds)


def pause(seconds: float) -> None:
    """Pause ``seconds`` as a timed wait on the current clock: a poll's pace. A fake clock
    ends it only by a jump (when every party waits), unlike ``sleep``, which moves it on."""
    timed_wait(threading.Event().wait, seconds)


def timed_wait(wait: Callable[[float | None], bool], timeout: float | None) -> bool:
    """``wait(timeout)`` on the current clock: the real clock calls it; a fake one may let the
    timeout pass without waiting it out. ``wait`` is a blocking primitive's wait (True: done)."""
    if _fake is None:
        return wait(timeout)
    return _fake.wait(wait, timeout)


def join(thread: threading.Thread, timeout: float | None) -> bool:
    """``thread.join(timeout)`` on the current clock; True once the thread has ended."""

    def ended(seconds: float | None) -> bool:
        thread.join(seconds)
        return not thread.is_alive()

    return timed_wait(ended, timeout)


class Deadline:
    """A point in monotonic time; ``Deadline(None)`` never expires."""

    __slots__ = ("at",)

    def __init__(self, at: float | None):
        self.at = at

    @classmethod
    def after(cls, timeout: timedelta | float | None) -> Deadline:
        """The deadline ``timeout`` from now (None: never)."""
        seconds = to_seconds(timeout)
        return cls(None if seconds is None else now() + seconds)

    def remaining(self) -> float | None:
        """Seconds left, never negative; None when there is no deadline."""
        if self.at is None:
            return None
        return max(0.0, self.at - now())

    def expired(self) -> bool:
        """Whether the deadline has passed (never, for no deadline)."""
        return self.at is not None and now() >= self.at

    def wait(self, wait: Callable[[float | None], bool]) -> bool:
        """``wait(seconds_left)`` (a blocking primitive's wait: True when done, False on
        timeout) on the current clock; see ``timed_wait``."""
        if _fake is None:
            return wait(self.remaining())
        return _fake.wait(wait, self.remaining())

    def __repr__(self) -> str:
        left = self.remaining()
        return "Deadline(never)" if left is None else f"Deadline(in {left:.3f}s)"


def poll_until(condition: Callable[[], bool], deadline: Deadline) -> None:
    """Poll ``condition`` with backoff sleeps on the current clock until it holds or
    ``deadline`` passes (a fake clock lets it pass at once)."""
    delay = 0.0005
    while not condition() and not deadline.expired():
        sleep(delay)
        delay = min(delay * 2, 0.02)
