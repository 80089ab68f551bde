"""Matching arriving messages to posted receives, FIFO per (source, key), any-source aware.

A message that arrives before its receive is posted is held as *unexpected* from the moment
its header is seen (so later messages with the same key cannot overtake it) and copied into
the receive once both exist. Thread-safe: the transport's I/O thread calls ``arrive`` and
``unexpected_done``; user and progress threads call ``post`` and ``cancel``.

The matcher keeps this rank's GroupStates (``states``): a group aborted by a peer or found
desynchronised, and the ranks gone from the transport, are recorded there (under the
matcher's lock, so a receive posted concurrently either sees them or is failed by them).
The bytes held as unexpected per peer are bounded for transports that can stop reading a
peer (``should_pause``, see _flow).
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

from ..core.errors import DesyncError, DistBackendError
from ..groups.state import GroupStates
from ..core.fingerprint import describe_fingerprint
from .base import MessageKey, Request
from .flow import ReadThrottle


#: Operations per group whose calls are remembered, to check messages that arrive late.
RECENT_CALLS = 64


class Unexpected:
    """A message held until its receive is posted."""

    __slots__ = ("source", "key", "call", "data", "complete", "waiter", "error")

    def __init__(self, source: int, key: MessageKey, nbytes: int, call: int = 0):
        self.source = source
        self.key = key
        self.call = call
        # large: numpy's allocation skips bytearray's zero fill (the payload overwrites it)
        self.data = bytearray(nbytes) if nbytes < 65536 else np.empty(nbytes, np.uint8).data
        self.complete = False
        self.waiter: Request | None = None
        self.error: BaseException | None = None  # its sender died before the payload was all in


def size_mismatch(request: Request, source: int, key: MessageKey, nbytes: int) -> DistBackendError:
    return DistBackendError(
        f"message size mismatch: rank {source} sent {nbytes} bytes (group {key.group:#x}, "
        f"seq {key.seq}, tag {key.tag}) but the receive here expects {request.nbytes} bytes; "
        "the ranks disagree on tensor sizes")


def call_mismatch(mine: int, source: int, key: MessageKey, theirs: int) -> DesyncError:
    return DesyncError(
        f"ranks called different operations (group {key.group:#x}, seq {key.seq}): rank {source} called "
        f"{describe_fingerprint(theirs)} while this rank called {describe_fingerprint(mine)}")


def _differ(mine: int, theirs: int) -> bool:
    return bool(mine and theirs and mine != theirs)


def mismatch(request: Request, source: int, key: MessageKey, nbytes: int, call: int) -> DistBackendError | None:
    """Why a message cannot fill ``request`` (different calls, different sizes), or None."""
    if _differ(request.call, call):
        return call_mismatch(request.call, source, key, call)
    if request.nbytes != nbytes:
        return size_mismatch(request, source, key, nbytes)
    return None


def _deliver(request: Request, message: Unexpected) -> None:
    if request.done():  # failed meanwhile (abort, dead source): its buffer is the caller's again
        return
    error = mismatch(request, message.source, message.key, len(message.data), message.call)
    if error is not None:
        request.complete(error)
        return
    request.buffer[:] = message.data
    request.complete(source=message.source)


class Matcher:
    """Posted receives and unexpected messages of one rank."""

    def __init__(self, held_limit: int = 64 << 20) -> None:
        """``held_limit``: bytes of unexpected messages from one peer past which ``should_pause``
        says to stop reading from it (PYDIST_MAX_UNEXPECTED_BYTES)."""
        self._lock = threading.Lock()
        self.throttle = ReadThrottle(held_limit)
        self._order = itertools.count(1)
        self._posted: dict[tuple[int, MessageKey], deque[Request]] = {}
        self._posted_any: dict[MessageKey, deque[Request]] = {}
        self._unexpected: dict[tuple[int, MessageKey], deque[Unexpected]] = {}
        self._unexpected_any: dict[MessageKey, deque[Unexpected]] = {}
        self.states = GroupStates()  # each group's lifecycle, and the ranks gone
        self._by_id, self._gone = self.states.by_id, self.states.dead  # read on every post
        self._calls: dict[int, dict[int, int]] = {}  # group -> {seq: call} of this rank's recent operations
        self._filling: set[Unexpected] = set()  # taken by a receive (its waiter), payload still arriving
        self._sending: dict[int, list[Request]] = {}  # group -> sends the transport has not finished
        #: called (no arguments) after a source is declared gone or a group aborted
        self.watchers: list[Callable[[], None]] = []

    def begin(self, group: int, seq: int, call: int) -> None:
        """This rank starts operation ``seq`` of ``group`` as ``call``; see ``_desync``."""
        with self._lock:
            recent = self._calls.get(group)
            if recent is None:
                recent = self._calls[group] = {}
            recent[seq] = call
            recent.pop(seq - RECENT_CALLS, None)
            if not self._unexpected:  # the common case: nothing held that could disagree
                return
            held = [(src, k, m.call) for (src, k), q in self._unexpected.items()
                    if k.group == group and k.seq == seq for m in q if _differ(call, m.call)]
            failed = self._desync(group, call, *held[0]) if held else []
        for request, error in failed:
            request.complete(error)

    def _desync(self, group: int, mine: int, source: int, key: MessageKey, theirs: int) -> list:
        """A message from ``source`` for an operation this rank called as ``mine`` carries
        another call: fail the group here (its posted receives and later ones), like an abort."""
        error = call_mismatch(mine, source, key, theirs)
        self.states.abort(group, error)
        queues = [q for (_, k), q in self._posted.items() if k.group == group]
        queues += [q for k, q in self._posted_any.items() if k.group == group]
        return [(r, error) for q in queues for r in q]

    def post(self, request: Request, source: int | None, key: MessageKey) -> None:
        """Post a receive: fail it if its group was aborted (even when its message is already
        here: an operation on an aborted group must not succeed), else match an unexpected
        message, else queue (or fail: dead source, desynchronised call)."""
        with self._lock:
            state = self._by_id.get(key.group)
            aborted = state.aborted if state is not None else None
            if aborted is not None:
                request.complete(aborted)
                return
            message = self._take_unexpected(source, key)
            if message is None:
                failure = ((self._gone.get(source) if source is not None else None)
                           or self._held_for_other_call(request, source, key))
                if failure is not None:
                    request.complete(failure)
                    return
                request.order = next(self._order)
                if source is None:
                    self._posted_any.setdefault(key, deque()).append(request)
                else:
                    self._posted.setdefault((source, key), deque()).append(request)
                resume = self.throttle.wanted(source) if self.throttle.paused else None
            else:
                resume = self.throttle.remove(message.source, len(message.data))
                if message.error is not None:
                    request.complete(message.error)
                    message = None
                elif not message.complete:
                    message.waiter = request
                    self._filling.add(message)
                    message = None
        if resume:
            self.throttle.notify(resume)
        if message is not None:
            _deliver(request, message)

    def aborted(self, group: int) -> BaseException | None:
        """The abort ``group`` failed with, if a peer aborted it (a send on it then fails)."""
        state = self._by_id.get(group)
        return state.aborted if state is not None else None

    def known_dead(self, group: int) -> list[int]:
        """The members of ``group`` this rank knows are dead."""
        state = self._by_id.get(group)
        return sorted(state.dead) if state is not None else []

    def should_pause(self, source: int) -> bool:
        """Between two frames from ``source``: True (and ``source`` is now paused) when this
        rank holds too many bytes of its unexpected messages and no posted receive wants its
        data; the transport then stops reading from it until ``throttle.resume(source)``."""
        if not self.throttle.over(source):  # the common case, without the lock (a dict read)
            return False
        with self._lock:
            if not self.throttle.over(source) or self._wants(source):
                return False
            self.throttle.paused.add(source)
            return True

    def _wants(self, source: int) -> bool:
        """A live receive is posted for ``source``'s data (from it, or from any source)."""
        queues = [q for (src, _), q in self._posted.items() if src == source] + list(self._posted_any.values())
        return any(not r.done() for q in queues for r in q)

    def _take_unexpected(self, source: int | None, key: MessageKey) -> Unexpected | None:
        """Remove and return the oldest unexpected message for the receive, from both
        indexes (empty queues are dropped, so finished keys leave nothing behind)."""
        # one index is keyed by (source, key), the other by key: Any covers both key types
        table: dict[Any, deque[Unexpected]]
        other_table: dict[Any, deque[Unexpected]]
        index: Any
        other_index: Any
        index = (source, key) if source is not None else key
        table = self._unexpected if source is not None else self._unexpected_any
        queue = table.get(index)
        if not queue:
            return None
        message = queue.popleft()
        if not queue:
            del table[index]
        other_table, other_index = ((self._unexpected_any, key) if source is not None
                                    else (self._unexpected, (message.source, key)))
        other = other_table[other_index]
        other.remove(message)
        if not other:
            del other_table[other_index]
        return message

    def _held_for_other_call(self, request: Request, source: int | None, key: MessageKey) -> DesyncError | None:
        """A message already here from ``source`` for the same operation (group, seq) but
        another call than ``request``'s: the ranks have desynchronised."""
        if not request.call:
            return None
        for (src, other), queue in self._unexpected.items():
            if (source is None or src == source) and other.group == key.group and other.seq == key.seq:
                for message in queue:
                    if _differ(request.call, message.call):
                        return call_mismatch(request.call, src, other, message.call)
        return None

    def _posted_for_other_call(self, source: int, key: MessageKey, call: int) -> list[tuple[Request, DesyncError]]:
        """Receives posted here for the operation (group, seq) of a message arriving from
        ``source`` with another call: each with the error to fail it with."""
        queues = [q for (src, k), q in self._posted.items() if src == source and k[:2] == key[:2]]
        queues += [q for k, q in self._posted_any.items() if k[:2] == key[:2]]
        return [(r, call_mismatch(r.call, source, key, call)) for q in queues for r in q if _differ(r.call, call)]

    def arrive(self, source: int, key: MessageKey, nbytes: int, call: int = 0) -> Request | Unexpected:
        """A message header arrived: the receive to fill, or a new Unexpected to fill instead
        (failing, as desynchronised, receives posted for the same operation with another call)."""
        failed: list[tuple[Request, DesyncError]] = []
        with self._lock:
            head_specific = self._head(self._posted, (source, key))
            head_any = self._head(self._posted_any, key)
            if head_specific is not None and (head_any is None or head_specific.order < head_any.order):
                return self._pop(self._posted, (source, key))
            if head_any is not None:
                return self._pop(self._posted_any, key)
            if call:
                failed = self._posted_for_other_call(source, key, call)
                mine = self._calls.get(key.group, {}).get(key.seq, 0)
                if not failed and _differ(mine, call):
                    failed = self._desync(key.group, mine, source, key, call)
            message = Unexpected(source, key, nbytes, call)
            self.throttle.add(source, nbytes)
            self._unexpected.setdefault((source, key), deque()).append(message)
            self._unexpected_any.setdefault(key, deque()).append(message)
        for request, error in failed:
            request.complete(error)
        return message

    @staticmethod
    def _head(table: dict, index: object) -> Request | None:
        """The oldest live receive posted under ``index`` (finished ones are dropped)."""
        queue = table.get(index)
        while queue and queue[0].done():  # cancelled or failed while waiting
            queue.popleft()
        if queue is not None and not queue:
            del table[index]
            return None
        return queue[0] if queue else None

    @staticmethod
    def _pop(table: dict, index: object) -> Request:
        queue = table[index]
        request = queue.popleft()
        if not queue:
            del table[index]
        return request

    def unexpected_done(self, message: Unexpected) -> None:
        """All bytes of an unexpected message are in: hand it to a waiting receive if any."""
        with self._lock:
            message.complete = True
            waiter = message.waiter
            self._filling.discard(message)
        if waiter is not None:
            _deliver(waiter, message)

    def cancel(self, request: Request, error: BaseException) -> None:
        """Fail a posted receive so that no later message lands in its buffer."""
        with self._lock:
            request.complete(error)

    def fail_source(self, source: int, error: BaseException) -> None:
        """``source`` is gone: fail its posted receives now and any posted later."""
        with self._lock:
            self.states.rank_gone(source, error)
            failed = [r for (src, _), q in self._posted.items() if src == source for r in q]
            for (src, _), queue in self._unexpected.items():
                if src == source:
                    for message in queue:
                        if not message.complete:
                            message.error = error  # cut off: fails the receive that takes it
            failed += self._stop_filling(lambda message: message.source == source)
        for request in failed:
            request.complete(error)
        self._tell_watchers()

    def _tell_watchers(self) -> None:
        """A source is gone or a group aborted: wake what waits outside the matcher (the
        shared-memory arenas' sleepers, which then look at the group states)."""
        for watcher in list(self.watchers):
            watcher()

    def _stop_filling(self, which) -> list[Request]:
        """The receives waiting on messages still arriving that ``which(message)`` selects,
        no longer waiting (the caller fails them)."""
        stopped = [message for message in self._filling if which(message)]
        self._filling.difference_update(stopped)
        return [message.waiter for message in stopped if message.waiter is not None]

    def track_send(self, group: int, request: Request) -> None:
        """A send of ``group`` that the transport has not finished yet: an abort of the group
        fails it (a broadcast root only sends: without this it would learn of the abort only
        when the peer's socket closes, and name that peer instead of the dead one)."""
        with self._lock:
            sends = self._sending.setdefault(group, [])
            if len(sends) >= 32:
                sends[:] = [r for r in sends if not r.done()]
            sends.append(request)

    def fail_group(self, group: int, error: BaseException) -> None:
        """``group`` was aborted by a peer: fail its posted receives now and any posted later,
        and its unfinished sends."""
        with self._lock:
            self.states.abort(group, error)
            queues = [q for (_, key), q in self._posted.items() if key.group == group]
            queues += [q for key, q in self._posted_any.items() if key.group == group]
            failed = [r for q in queues for r in q] + self._sending.pop(group, [])
            failed += self._stop_filling(lambda message: message.key.group == group)
        for request in failed:
            request.complete(error)
        self._tell_watchers()

    def pending_receives(self) -> int:
        """Receives posted and not yet matched (for tests and leak checks)."""
        with self._lock:
            queues = list(self._posted.values()) + list(self._posted_any.values())
            return sum(1 for q in queues for r in q if not r.done())
