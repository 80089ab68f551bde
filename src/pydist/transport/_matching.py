"""Matching arriving messages to posted receives, FIFO per (source, key), any-source aware.

A message that arrives before its receive is posted is held as *unexpected* from the moment
its header is seen (so later messages with the same key cannot overtake it) and copied into
the receive once both exist. Thread-safe: the transport's I/O thread calls ``arrive`` and
``unexpected_done``; user and progress threads call ``post`` and ``cancel``.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque

from .._errors import DistBackendError
from ._base import MessageKey, Request


class Unexpected:
    """A message held until its receive is posted."""

    __slots__ = ("source", "key", "data", "complete", "taken", "waiter")

    def __init__(self, source: int, key: MessageKey, nbytes: int):
        self.source = source
        self.key = key
        self.data = bytearray(nbytes)
        self.complete = False
        self.taken = False
        self.waiter: Request | None = None


def size_mismatch(request: Request, source: int, key: MessageKey, nbytes: int) -> DistBackendError:
    return DistBackendError(
        f"message size mismatch: rank {source} sent {nbytes} bytes (group {key.group:#x}, "
        f"seq {key.seq}, tag {key.tag}) but the receive here expects {request.nbytes} bytes; "
        "the ranks disagree on tensor sizes")


def _deliver(request: Request, message: Unexpected) -> None:
    if request.nbytes != len(message.data):
        request.complete(size_mismatch(request, message.source, message.key, len(message.data)))
        return
    request.buffer[:] = message.data
    request.complete(source=message.source)


def _pop_live(queue: deque) -> object | None:
    """Pop the first entry not already taken through the other index."""
    while queue:
        entry = queue.popleft()
        if not entry_taken(entry):
            return entry
    return None


def entry_taken(entry: object) -> bool:
    return entry.taken if isinstance(entry, Unexpected) else entry.done()


class Matcher:
    """Posted receives and unexpected messages of one rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order = itertools.count(1)
        self._posted: dict[tuple[int, MessageKey], deque[Request]] = {}
        self._posted_any: dict[MessageKey, deque[Request]] = {}
        self._unexpected: dict[tuple[int, MessageKey], deque[Unexpected]] = {}
        self._unexpected_any: dict[MessageKey, deque[Unexpected]] = {}
        self._dead: dict[int, BaseException] = {}
        self._aborted: dict[int, BaseException] = {}

    def post(self, request: Request, source: int | None, key: MessageKey) -> None:
        """Post a receive: match an unexpected message, else queue (or fail: dead source)."""
        with self._lock:
            queue = self._unexpected_any.get(key) if source is None else self._unexpected.get((source, key))
            message = _pop_live(queue) if queue else None
            if message is None:
                failure = self._aborted.get(key.group) or (self._dead.get(source) if source is not None else None)
                if failure is not None:
                    request.complete(failure)
                    return
                request.order = next(self._order)
                table, index = (self._posted_any, key) if source is None else (self._posted, (source, key))
                table.setdefault(index, deque()).append(request)
                return
            message.taken = True
            if not message.complete:
                message.waiter = request
                return
        _deliver(request, message)

    def arrive(self, source: int, key: MessageKey, nbytes: int) -> Request | Unexpected:
        """A message header arrived: the receive to fill, or a new Unexpected to fill instead."""
        with self._lock:
            specific = self._posted.get((source, key))
            anywhere = self._posted_any.get(key)
            head_specific = self._head(specific)
            head_any = self._head(anywhere)
            if head_specific is not None and (head_any is None or head_specific.order < head_any.order):
                return specific.popleft()
            if head_any is not None:
                return anywhere.popleft()
            message = Unexpected(source, key, nbytes)
            self._unexpected.setdefault((source, key), deque()).append(message)
            self._unexpected_any.setdefault(key, deque()).append(message)
            return message

    @staticmethod
    def _head(queue: deque[Request] | None) -> Request | None:
        while queue and queue[0].done():  # cancelled or failed while waiting
            queue.popleft()
        return queue[0] if queue else None

    def unexpected_done(self, message: Unexpected) -> None:
        """All bytes of an unexpected message are in: hand it to a waiting receive if any."""
        with self._lock:
            message.complete = True
            waiter = message.waiter
        if waiter is not None:
            _deliver(waiter, message)

    def cancel(self, request: Request, error: BaseException) -> None:
        """Fail a posted receive so that no later message lands in its buffer."""
        with self._lock:
            request.complete(error)

    def fail_source(self, source: int, error: BaseException) -> None:
        """``source`` is gone: fail its posted receives now and any posted later."""
        with self._lock:
            self._dead[source] = error
            failed = [r for (src, _), q in self._posted.items() if src == source for r in q]
            for (src, _), queue in self._unexpected.items():
                if src == source:
                    failed += [m.waiter for m in queue if m.waiter is not None and not m.complete]
        for request in failed:
            request.complete(error)

    def fail_group(self, group: int, error: BaseException) -> None:
        """``group`` was aborted by a peer: fail its posted receives now and any posted later."""
        with self._lock:
            self._aborted[group] = error
            queues = [q for (_, key), q in self._posted.items() if key.group == group]
            queues += [q for key, q in self._posted_any.items() if key.group == group]
            failed = [r for q in queues for r in q]
        for request in failed:
            request.complete(error)

    def failure(self, group: int, sources: list[int]) -> BaseException | None:
        """Why ``group`` cannot go on: aborted by a peer, or one of ``sources`` gone."""
        error = self._aborted.get(group)
        if error is None:
            error = next((self._dead[s] for s in sources if s in self._dead), None)
        return error

    def pending_receives(self) -> int:
        """Receives posted and not yet matched (for tests and leak checks)."""
        with self._lock:
            queues = list(self._posted.values()) + list(self._posted_any.values())
            return sum(1 for q in queues for r in q if not r.done())
