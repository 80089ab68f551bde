"""HashStore: an in-process store, safe to share between threads (e.g. threads as ranks)."""
from __future__ import annotations

import threading
from typing import Any

from ..core import deadline as _deadline
from ._base import Store, retry_until
from ._state import KVState


class HashStore(Store):
    """Keys and queues in this process's memory behind one lock; blocking operations wait
    on a condition variable that every change notifies. Nothing to release on close."""

    def __init__(self) -> None:
        super().__init__()
        self._state = KVState()
        self._cond = threading.Condition()

    def _apply(self, op: str, args: tuple[Any, ...]) -> Any:
        try:
            return getattr(self._state, op)(*args)
        finally:
            if self._state.take_changes():
                self._cond.notify_all()

    def _call(self, op: str, *args: Any) -> Any:
        with self._cond:
            return self._apply(op, args)

    def _pause(self, seconds: float) -> bool:
        """Wait for a change (or ``seconds``) on the current clock; the lock is held."""
        return _deadline.timed_wait(self._cond.wait, seconds)

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        with self._cond:
            return retry_until(lambda: self._apply(op, args), self._pause, timeout_s, self._where())
