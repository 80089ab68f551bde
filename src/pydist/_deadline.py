"""Absolute deadlines on the monotonic clock; every blocking call takes one."""
from __future__ import annotations

import time
from datetime import timedelta

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


class Deadline:
    """A point in monotonic time; ``Deadline(None)`` never expires."""

    __slots__ = ("at",)

    def __init__(self, at: float | None):
        self.at = at

    @classmethod
    def after(cls, timeout: timedelta | float | None) -> "Deadline":
        """The deadline ``timeout`` from now (None: never)."""
        seconds = to_seconds(timeout)
        return cls(None if seconds is None else time.monotonic() + seconds)

    def remaining(self) -> float | None:
        """Seconds left, never negative; None when there is no deadline."""
        if self.at is None:
            return None
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def earliest(self, other: "Deadline") -> "Deadline":
        """The earlier of two deadlines."""
        if self.at is None:
            return other
        if other.at is None:
            return self
        return self if self.at <= other.at else other

    def __repr__(self) -> str:
        left = self.remaining()
        return "Deadline(never)" if left is None else f"Deadline(in {left:.3f}s)"
