"""Work: the handle of one operation, as torch's ``Work``.

``wait(timeout=None)`` blocks until the operation finishes and re-raises its error;
``is_completed()``, ``is_success()``, ``exception()``, ``result()`` (the output tensors)
and ``get_future()`` (a ``concurrent.futures.Future`` resolving to the output tensors,
made on first request so that the common case stays cheap).

Callbacks (``add_done_callback``, and those of the future) run on pydist's callback
runner (see callbacks), never on the progress or transport thread that completes the
operation, so a callback may wait on another operation of the same group. A Work
without callbacks or future completes with no thread hop. A callback added once the
Work is done runs at once in the adding thread.
"""
from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..core import deadline as _deadline
from ..core.deadline import to_seconds
from ..core.errors import DistBackendError
from .callbacks import RUNNER

_STATE = threading.Lock()  # guards completion and the lazily made future/callbacks


class Work:
    """One operation's completion: success (output tensors) or an exception."""

    def __init__(self, description: str, outputs: list[Any] | None = None):
        self.description = description
        self._outputs = outputs if outputs is not None else []
        self._done = False
        self._error: BaseException | None = None
        self._source_rank: int | None = None
        self._future: concurrent.futures.Future | None = None
        self._callbacks: list[Callable[[Work], None]] = []
        self._gate = threading.Lock()
        self._gate.acquire()

    # -- producer side --------------------------------------------------------------------
    def _succeed(self, source_rank: int | None = None) -> None:
        self._finish(None, source_rank)

    def _fail(self, error: BaseException) -> None:
        self._finish(error, None)

    def _finish(self, error: BaseException | None, source_rank: int | None) -> None:
        with _STATE:
            if self._done:
                return
            self._error, self._source_rank, self._done = error, source_rank, True
            future, callbacks = self._future, self._callbacks
        self._gate.release()
        if future is not None or callbacks:
            RUNNER.run(lambda: self._notify(future, callbacks))

    def _notify(self, future: concurrent.futures.Future | None, callbacks: list[Callable[[Work], None]]) -> None:
        if future is not None:
            self._settle(future)
        for callback in callbacks:
            callback(self)

    def _settle(self, future: concurrent.futures.Future) -> None:
        if self._error is not None:
            future.set_exception(self._error)
        else:
            future.set_result(self._outputs)

    # -- torch's API ----------------------------------------------------------------------
    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; re-raise the operation's error. True on success."""
        if not self._done:
            seconds = to_seconds(timeout)
            if not _deadline.timed_wait(self._pass_gate, seconds):
                raise DistBackendError(f"Work.wait timed out after {seconds:g} s; {self.description} "
                                       "is still running")
            self._gate.release()
        if self._error is not None:
            raise self._error
        return True

    def _pass_gate(self, seconds: float | None) -> bool:
        """Take the gate (open once done) within ``seconds`` (None: forever): the primitive
        ``wait`` waits on through pydist's clock."""
        return self._gate.acquire(timeout=-1 if seconds is None else seconds)

    def is_completed(self) -> bool:
        """True once the operation has finished, with a result or an error; never waits."""
        return self._done

    def is_success(self) -> bool:
        """True once the operation has finished without an error."""
        return self._done and self._error is None

    def exception(self) -> BaseException | None:
        """The error the operation failed with; None while it runs or if it succeeded."""
        return self._error

    def result(self) -> list[Any]:
        """The output tensors, once done (waits)."""
        self.wait()
        return self._outputs

    def get_future(self) -> concurrent.futures.Future:
        """A Future completed with the output tensors, or with the error, when the operation ends."""
        with _STATE:
            if self._future is None:
                self._future = concurrent.futures.Future()
                if self._done:
                    self._settle(self._future)
            return self._future

    def source_rank(self) -> int | None:
        """For a receive from any source: the rank that sent the message."""
        return self._source_rank

    def synchronize(self) -> None:
        """CPU work needs no stream synchronisation (torch API compatibility)."""

    def add_done_callback(self, callback: Callable[[Work], None]) -> None:
        """Call ``callback(work)`` once done (at once if it already is)."""
        with _STATE:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback(self)

    def __repr__(self) -> str:
        return f"<Work {self.description} {'done' if self._done else 'pending'}>"
