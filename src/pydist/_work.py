"""Work: the handle of one operation, as torch's ``Work``.

``wait(timeout=None)`` blocks until the operation finishes and re-raises its error;
``is_completed()``, ``is_success()``, ``exception()``, ``result()`` (the output tensors)
and ``get_future()`` (a ``concurrent.futures.Future`` resolving to the output tensors).
"""
from __future__ import annotations

import concurrent.futures
from datetime import timedelta
from typing import Any, Callable

from ._deadline import to_seconds
from ._errors import DistBackendError


class Work:
    """One operation's completion: a value (output tensors) or an exception."""

    def __init__(self, description: str, outputs: list[Any] | None = None):
        self.description = description
        self._outputs = outputs if outputs is not None else []
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._source_rank: int | None = None

    # -- producer side --------------------------------------------------------------------
    def _succeed(self, source_rank: int | None = None) -> None:
        self._source_rank = source_rank
        if not self._future.done():
            self._future.set_result(self._outputs)

    def _fail(self, error: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(error)

    # -- torch's API ----------------------------------------------------------------------
    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; re-raise the operation's error. True on success."""
        seconds = to_seconds(timeout)
        try:
            self._future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise DistBackendError(f"Work.wait timed out after {seconds:g} s; {self.description} "
                                   "is still running") from None
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None

    def result(self) -> list[Any]:
        """The output tensors, once done (waits)."""
        self.wait()
        return self._outputs

    def get_future(self) -> concurrent.futures.Future:
        return self._future

    def source_rank(self) -> int | None:
        """For a receive from any source: the rank that sent the message."""
        return self._source_rank

    def synchronize(self) -> None:
        """CPU work needs no stream synchronisation (torch API compatibility)."""

    def add_done_callback(self, callback: Callable[["Work"], None]) -> None:
        self._future.add_done_callback(lambda _future: callback(self))

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<Work {self.description} {state}>"


def completed_work(description: str, outputs: list[Any] | None = None) -> Work:
    """A Work that is already successfully finished (no-ops, size-1 groups)."""
    work = Work(description, outputs)
    work._succeed()
    return work
