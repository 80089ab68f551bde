"""Matching arriving messages to posted receives, FIFO per (source, key), any-source aware.

A message that arrives before its receive is posted is held as *unexpected* from the moment
its header is seen (so later messages with the same key cannot overtake it) and copied into
the receive once both exist. Every arrival goes through ``arrive``, which returns a
Delivery: the one routine by which a message's bytes land (tcp and shm frames, loopback
copies, held messages taken by a later receive). Thread-safe: the transports' reading
threads call ``arrive`` and the Delivery; user and progress threads call ``post`` and
``cancel``.

What the matcher does not know it asks the layer above (``events``, see base.Events): whether
a receive posted now must fail at once (its group aborted, its source gone), and which call
this rank made for an operation (an unexpected message of another call means the ranks
desynchronised: reported as an abort of the group). The bytes held as unexpected per peer
are bounded for transports that can stop reading a peer (``should_pause``, see flow); each
held message counts its payload and HELD_OVERHEAD. The memory they take is bounded for every
transport: a message that would take the bytes held for its sender past what this process
can hold (``hold_bound``, see memory) is refused before anything is allocated, as is one
whose memory cannot be allocated: a FramingError naming the sender (its failure: the
transport drops it). A message whose receive is posted is checked against that receive's
size and goes straight into it (nothing allocated).
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.errors import DesyncError, DistBackendError
from ..core.fingerprint import describe_fingerprint, how_calls_differ
from .base import Events, MessageKey, Request
from .flow import ReadThrottle
from .framing import FramingError
from .memory import memory_limit

#: What a held message costs besides its payload (its bookkeeping, about 2 KiB measured with
#: distinct keys): counted in the bytes held for its sender, so a flood of empty messages
#: is bounded like a flood of full ones.
HELD_OVERHEAD = 2048


class Unexpected:
    """A message held until its receive is posted."""

    __slots__ = ("source", "key", "call", "data", "complete", "waiter", "error")

    def __init__(self, source: int, key: MessageKey, nbytes: int, call: int = 0):
        self.source = source
        self.key = key
        self.call = call
        self.data = allocate(nbytes)
        self.complete = False
        self.waiter: Request | None = None
        self.error: BaseException | None = None  # its sender died before the payload was all in


def allocate(nbytes: int) -> bytearray | memoryview:
    """Memory for a held payload; large ones from numpy, which skips bytearray's zero fill (the
    payload overwrites it) and so takes no resident memory before the bytes arrive."""
    return bytearray(nbytes) if nbytes < 65536 else np.empty(nbytes, np.uint8).data


def size_mismatch(request: Request, source: int, key: MessageKey, nbytes: int) -> DistBackendError:
    return DistBackendError(
        f"message size mismatch: rank {source} sent {nbytes} bytes (group {key.group:#x}, "
        f"seq {key.seq}, tag {key.tag}) but the receive here expects {request.nbytes} bytes; "
        "the ranks disagree on tensor sizes")


def call_mismatch(mine: int, source: int, key: MessageKey, theirs: int) -> DesyncError:
    return DesyncError(
        f"{how_calls_differ(mine, theirs)} (group {key.group:#x}, seq {key.seq}): rank {source} called "
        f"{describe_fingerprint(theirs)} while this rank called {describe_fingerprint(mine)}")


def differ(mine: int, theirs: int) -> bool:
    """Two call fingerprints that both say something and disagree."""
    return bool(mine and theirs and mine != theirs)


def mismatch(request: Request, source: int, key: MessageKey, nbytes: int, call: int) -> DistBackendError | None:
    """Why a message cannot fill ``request`` (different calls, different sizes), or None."""
    if differ(request.call, call):
        return call_mismatch(request.call, source, key, call)
    if request.nbytes != nbytes:
        return size_mismatch(request, source, key, nbytes)
    return None


class Delivery:
    """Where one arriving message goes: a posted receive, or a message held as unexpected.

    The transport writes the payload into ``into()`` (possibly in pieces) and calls
    ``landed()`` once all of it is there, or ``broken(error)`` if the stream broke first.
    """

    __slots__ = ("_matcher", "source", "_request", "_held")

    def __init__(self, matcher: Matcher, source: int, request: Request | None, held: Unexpected | None):
        self._matcher = matcher
        self.source = source
        self._request = request
        self._held = held

    def into(self) -> memoryview | None:
        """Where the payload goes now; None once its receive finished otherwise (refused as
        mismatched, cancelled, failed): its buffer is the caller's again, the rest is dropped."""
        request = self._request
        if request is not None:
            return None if request._completed else request.buffer
        assert self._held is not None  # a delivery has a receive or a held message
        return memoryview(self._held.data)

    def landed(self) -> None:
        """All of the payload is in: complete the receive, or hand the held message to a
        receive posted meanwhile."""
        if self._request is not None:
            self._request.complete(source=self.source)
        else:
            assert self._held is not None  # a delivery has a receive or a held message
            self._matcher._held_complete(self._held)

    def broken(self, error: BaseException, group: int) -> None:
        """The stream broke before the payload was all in: the receive fails with the abort
        of its ``group`` when a peer aborted it first (the root cause: a peer that raised,
        aborted and left breaks the stream only after), else with ``error``."""
        if self._request is not None:
            self._request.complete(self._matcher.events.refusal(None, group) or error)


def deliver_whole(matcher: Matcher, source: int, key: MessageKey, data: memoryview, call: int = 0) -> None:
    """Deliver a message whose bytes are all at hand (loopback copies, whole shm frames)."""
    delivery = matcher.arrive(source, key, data.nbytes, call)
    into = delivery.into()
    if into is not None:
        into[:] = data
    delivery.landed()


class Matcher:
    """Posted receives and unexpected messages of one rank."""

    def __init__(self, events: Events, held_limit: int = 64 << 20, hold_bound: int | None = None) -> None:
        """``events``: the layer above (refusals, desync checks); ``held_limit``: bytes of
        unexpected messages from one peer past which ``should_pause`` says to stop reading
        from it (PYDIST_MAX_UNEXPECTED_BYTES); ``hold_bound``: bytes of them never held for
        one peer (default: what this process may use, ``memory_limit()``)."""
        self.events = events
        self.hold_bound = memory_limit() if hold_bound is None else hold_bound
        self._lock = threading.Lock()
        self.throttle = ReadThrottle(held_limit)
        self._order = itertools.count(1)
        self._posted: dict[tuple[int, MessageKey], deque[Request]] = {}
        self._posted_any: dict[MessageKey, deque[Request]] = {}
        self._unexpected: dict[tuple[int, MessageKey], deque[Unexpected]] = {}
        self._unexpected_any: dict[MessageKey, deque[Unexpected]] = {}
        self._filling: set[Unexpected] = set()  # taken by a receive (its waiter), payload still arriving

    def post(self, request: Request, source: int | None, key: MessageKey) -> None:
        """Post a receive: fail it if its group was aborted (even when its message is already
        here: an operation on an aborted group must not succeed), else take an unexpected
        message, else queue it (or fail it: its source is gone)."""
        refusal = self.events.refusal
        with self._lock:
            aborted = refusal(None, key.group)
            if aborted is not None:
                request.complete(aborted)
                return
            message = self._take_unexpected(source, key)
            if message is None:
                gone = refusal(source, key.group) if source is not None else None
                if gone is not None:
                    request.complete(gone)
                    return
                request.order = next(self._order)
                if source is None:
                    self._posted_any.setdefault(key, deque()).append(request)
                else:
                    self._posted.setdefault((source, key), deque()).append(request)
                resume = self.throttle.wanted(source) if self.throttle.paused else None
            else:
                resume = self.throttle.remove(message.source, len(message.data) + HELD_OVERHEAD)
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
            self._fill(request, message)

    @staticmethod
    def _fill(request: Request, message: Unexpected) -> None:
        """Copy a held message into the receive that took it (unless that receive failed meanwhile)."""
        if request.done():
            return
        error = mismatch(request, message.source, message.key, len(message.data), message.call)
        if error is not None:
            request.complete(error)
            return
        request.buffer[:] = message.data
        request.complete(source=message.source)

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

    def arrive(self, source: int, key: MessageKey, nbytes: int, call: int = 0) -> Delivery:
        """A message header arrived: where its payload goes (see Delivery). A message for an
        operation this rank started as another call reports the group desynchronised."""
        with self._lock:
            head_specific = self._head(self._posted, (source, key))
            head_any = self._head(self._posted_any, key)
            if head_specific is not None and (head_any is None or head_specific.order < head_any.order):
                request = self._pop(self._posted, (source, key))
            elif head_any is not None:
                request = self._pop(self._posted_any, key)
            else:
                request = None
                message = self._hold(source, key, nbytes, call)
        if request is not None:
            error = mismatch(request, source, key, nbytes, call)
            if error is not None:
                request.complete(error)
            return Delivery(self, source, request, None)
        # held first, checked after: a concurrent start of this operation (GroupStates.started)
        # records its call first and looks at the held messages after, so one of the two sees both
        mine = self.events.call_of(key.group, key.seq) if call else 0
        if differ(mine, call):
            self.events.abort_group(key.group, call_mismatch(mine, source, key, call))
        return Delivery(self, source, None, message)

    def _hold(self, source: int, key: MessageKey, nbytes: int, call: int) -> Unexpected:
        """Under the lock: hold a message that arrived before its receive, within
        ``hold_bound``; FramingError naming its sender beyond it or when its memory cannot be
        allocated (nothing is held then)."""
        held = self.throttle.held.get(source, 0)
        what = (f"rank {source} sent a message of {nbytes} bytes (group {key.group:#x}, seq {key.seq}, "
                f"tag {key.tag}) for no receive posted yet")
        if held + nbytes + HELD_OVERHEAD > self.hold_bound:
            raise FramingError(f"{what}, with {held} bytes already held from it: beyond the {self.hold_bound} "
                               "bytes this process can hold (its memory)")
        try:
            message = Unexpected(source, key, nbytes, call)
        except MemoryError as error:
            raise FramingError(f"{what}: its {nbytes} bytes cannot be allocated here (MemoryError)") from error
        self.throttle.add(source, nbytes + HELD_OVERHEAD)
        self._unexpected.setdefault((source, key), deque()).append(message)
        self._unexpected_any.setdefault(key, deque()).append(message)
        return message

    def held_calls(self, group: int, seq: int) -> list[tuple[int, MessageKey, int]]:
        """(source, key, call) of the messages held for operation ``seq`` of ``group``."""
        if not self._unexpected:  # the common case, without the lock: nothing held (a message held
            return []  # after this look is checked against the call on its arrival, see arrive)
        with self._lock:
            return [(src, k, m.call) for (src, k), q in self._unexpected.items()
                    if k.group == group and k.seq == seq for m in q]

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

    def _held_complete(self, message: Unexpected) -> None:
        """All bytes of a held message are in: hand it to the receive that took it, if any."""
        with self._lock:
            message.complete = True
            waiter = message.waiter
            self._filling.discard(message)
        if waiter is not None:
            self._fill(waiter, message)

    def cancel(self, request: Request, error: BaseException) -> None:
        """Fail a posted receive so that no later message lands in its buffer."""
        with self._lock:
            request.complete(error)

    def fail_source(self, source: int, error: BaseException) -> None:
        """``source`` is gone: fail its posted receives and the messages it left half sent."""
        with self._lock:
            failed = [r for (src, _), q in self._posted.items() if src == source for r in q]
            for (src, _), queue in self._unexpected.items():
                if src == source:
                    for message in queue:
                        if not message.complete:
                            message.error = error  # cut off: fails the receive that takes it
            failed += self._stop_filling(lambda message: message.source == source)
        for request in failed:
            request.complete(error)

    def fail_group(self, group: int, error: BaseException) -> None:
        """``group`` was aborted: fail its posted receives (later ones are refused by the events)."""
        self._fail_posted(lambda key: key.group == group, error)

    def fail_all(self, error: BaseException) -> None:
        """This rank can receive nothing more (its transport's thread died): fail every posted
        receive, from one source or any, and every receive waiting on a message still arriving."""
        self._fail_posted(lambda key: True, error)

    def _fail_posted(self, which: Callable[[MessageKey], bool], error: BaseException) -> None:
        """Fail the posted receives whose key ``which`` selects, and those waiting on a
        message (of such a key) still arriving."""
        with self._lock:
            queues = [q for (_, key), q in self._posted.items() if which(key)]
            queues += [q for key, q in self._posted_any.items() if which(key)]
            failed = [r for q in queues for r in q]
            failed += self._stop_filling(lambda message: which(message.key))
        for request in failed:
            request.complete(error)

    def _stop_filling(self, which) -> list[Request]:
        """The receives waiting on messages still arriving that ``which(message)`` selects,
        no longer waiting (the caller fails them)."""
        stopped = [message for message in self._filling if which(message)]
        self._filling.difference_update(stopped)
        return [message.waiter for message in stopped if message.waiter is not None]

    def pending_receives(self) -> int:
        """Receives posted and not yet matched (for tests and leak checks)."""
        with self._lock:
            queues = list(self._posted.values()) + list(self._posted_any.values())
            return sum(1 for q in queues for r in q if not r.done())
