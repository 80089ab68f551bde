"""The pair interface every transport offers: post a send or a receive, get a Request.

Messages are matched by (source rank, key) in FIFO order, as MPI does: ``key`` is
(group id, sequence number, tag). A receive may name no source (any source). Buffers are
contiguous byte views (``memoryview`` of format 'B'); receives land straight in them.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    from ..groups.state import GroupState
    from .matching import Matcher


class MessageKey(NamedTuple):
    group: int
    seq: int
    tag: int


class Request:
    """One posted send or receive. Completes once, with an error or (receives) a source rank."""

    __slots__ = ("peer", "buffer", "nbytes", "error", "source", "order", "drive", "call", "_completed",
                 "_gate", "_callbacks")

    def __init__(self, peer: int | None, buffer: memoryview, call: int = 0):
        self.peer = peer
        self.call = call  # the receiving call's fingerprint (0: not checked)
        self.buffer = buffer
        self.nbytes = buffer.nbytes
        self.error: BaseException | None = None
        self.source: int | None = peer
        self.order = 0  # post order, for any-source matching
        #: drive(request, timeout): how the waiter waits when its transport decides it (reading
        #: the sockets or rings itself, or asleep while another thread does): True done, False timed out
        self.drive: Callable[[Request, float | None], bool] | None = None
        self._completed = False
        self._callbacks: list | None = None
        self._gate = threading.Lock()
        self._gate.acquire()

    @classmethod
    def finished(cls, peer: int, buffer: memoryview) -> "Request":
        """A send already delivered whole: complete from the start (no gate to open)."""
        request = cls.__new__(cls)
        request.peer = request.source = peer
        request.buffer, request.nbytes, request.call, request.order = buffer, buffer.nbytes, 0, 0
        request.error = request.drive = request._callbacks = None
        request._completed, request._gate = True, _OPEN
        return request

    def complete(self, error: BaseException | None = None, source: int | None = None) -> None:
        """Finish the request; only the first completion counts."""
        with _COMPLETION:
            if self._completed:
                return
            self.error = error
            if source is not None:
                self.source = source
            self._completed = True
            callbacks, self._callbacks = self._callbacks, None
        self._gate.release()
        for callback in callbacks or ():
            callback(self)

    def add_callback(self, callback) -> None:
        """Call ``callback(request)`` once complete (at once if it already is)."""
        with _COMPLETION:
            if not self._completed:
                self._callbacks = (self._callbacks or []) + [callback]
                return
        callback(self)

    def done(self) -> bool:
        return self._completed

    def wait(self, timeout: float | None) -> bool:
        """Block until complete or ``timeout`` seconds pass (None: forever); True when complete."""
        if self._completed:
            return True
        if self.drive is not None:
            return self.drive(self, timeout)
        return self.sleep(timeout)

    def sleep(self, timeout: float | None) -> bool:
        """Block (without driving anything) until complete or ``timeout`` seconds pass."""
        if self._gate.acquire(timeout=-1 if timeout is None else timeout):
            self._gate.release()
            return True
        return False


_COMPLETION = threading.Lock()
_OPEN = threading.Lock()  # the gate of requests finished from the start: never held for long


def completed_request(peer: int | None, buffer: memoryview, error: BaseException | None = None) -> Request:
    """A request that is already finished (a send that was delivered at once, or failed)."""
    request = Request(peer, buffer)
    request.complete(error)
    return request


class Transport(ABC):
    """Moves bytes between the ranks of one world; shared by all of its groups."""

    rank: int
    size: int
    address: str = "127.0.0.1"  # where peers reach this rank (a store this rank serves listens there too)

    @abstractmethod
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """Post a send of ``data`` to world rank ``peer``; ``data`` must stay unchanged until done.
        ``call``: the sending operation's fingerprint, checked by the receiver."""

    @abstractmethod
    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """Post a receive into ``data`` from world rank ``peer`` (None: any source); a message
        whose call fingerprint differs from a non-zero ``call`` fails it (desync)."""

    @abstractmethod
    def cancel(self, request: Request) -> None:
        """Withdraw a receive that has not started to arrive (after a timeout)."""

    @abstractmethod
    def abort(self, peers: list[int], group: int, error: BaseException) -> None:
        """Tell ``peers`` that this rank failed an operation of ``group`` with ``error``: their
        pending and later receives of that group fail with GroupAbortedError carrying its
        text, or, when ``error`` is a dead peer, with PeerFailedError naming that peer."""

    @abstractmethod
    def peer_host(self, peer: int) -> str:
        """The host name of world rank ``peer``, for error messages."""

    @abstractmethod
    def close(self) -> None:
        """Flush, say goodbye to peers and release every resource; idempotent."""

    matcher: "Matcher"

    def host_of(self, peer: int) -> str:
        """Host identity of world rank ``peer``: ranks with equal identities share memory."""
        return "local"

    def arena(self, group_id: int, members: list[int], labels: list[int], index: int, deadline, describe,
              alive=None):
        """A shared-memory arena for ``members`` (world ranks on this host), known to
        algorithms by ``labels`` (their group ranks); this rank is member ``index``. None
        when the transport has no shared memory for them. While waiting for another member
        to create it, ``alive()`` (if given) is called now and then and may raise."""
        return None

    def use_store(self, store) -> None:  # noqa: B027 - a transport without later rendezvous keeps none
        """Later rendezvous (shared-memory arenas of new groups) go through ``store``: the
        world's store changed (a shrink replaced one whose host died)."""

    def engage(self, nbytes: int) -> bool:
        """A blocking operation of ``nbytes`` starts in the calling thread; a transport may
        let that thread drive its I/O until the operation ends. True: call ``disengage()``
        at its end."""
        return False

    def disengage(self) -> None:  # noqa: B027 - nothing to end unless engage() said True
        """The operation that ``engage`` returned True for has ended."""

    def begin(self, group: int, seq: int, call: int) -> None:
        """This rank starts operation ``seq`` of ``group`` as ``call`` (a fingerprint): a
        message of that operation carrying another call marks the group desynchronised."""
        self.matcher.begin(group, seq, call)

    def group_state(self, group: int, members: list[int]) -> "GroupState":
        """The lifecycle of ``group`` (world ranks ``members``) on this rank, as this
        transport records it: aborts by peers, desyncs and dead members land in it."""
        return self.matcher.states.register(group, members)
