"""The pair interface every transport implements whole, and what a transport reports upward.

``Transport``: post a send or a receive (``isend``, ``irecv``), withdraw a receive
(``cancel``), ``close``; each returns or settles a Request. Messages are matched by (source,
key) in FIFO order, as MPI does: ``key`` is (group id, sequence number, tag). A receive may
name no source (any source). Buffers are contiguous byte views (``memoryview`` of format
'B'); receives land straight in them. Every rank number in this package is a
*transport rank* (the transport's numbering of the job's processes, fixed at launch).

``NetworkTransport`` (reaches every peer; carries ABORT frames) and ``HostLocalTransport``
(the peers of this host) add what the world transport (world.py) needs of each kind.

``Events``: what a transport tells the layer above (groups.state.GroupStates) and asks it:
a peer gone, a group aborted by a peer, whether a receive posted now must fail at once.
The transport keeps no knowledge of groups or dead ranks of its own.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from ..core.deadline import Deadline


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
    def finished(cls, peer: int, buffer: memoryview) -> Request:
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


class Events(Protocol):
    """What a transport reports to the layer above it, and asks it (groups.state.GroupStates)."""

    def peer_gone(self, peer: int, error: BaseException) -> None:
        """``peer`` left this transport (died, or shut down), after what it sent was delivered."""

    def abort_group(self, group: int, error: BaseException) -> None:
        """A peer aborted ``group`` (its ABORT frame), or a message showed the ranks desynchronised."""

    def refusal(self, source: int | None, group: int) -> BaseException | None:
        """Why a receive of ``group`` from ``source`` (None: any) posted now must fail at once
        (the group was aborted, or the source is gone); None when it may wait."""

    def call_of(self, group: int, seq: int) -> int:
        """The fingerprint of operation ``seq`` of ``group`` as this rank started it (0: not started)."""


class Transport(ABC):
    """The pair interface: moves messages between this rank and its peers (transport ranks)."""

    rank: int

    @abstractmethod
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """Post a send of ``data`` to ``peer``; ``data`` must stay unchanged until done.
        ``call``: the sending operation's fingerprint, checked by the receiver."""

    @abstractmethod
    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """Post a receive into ``data`` from ``peer`` (None: any source); a message whose call
        fingerprint differs from a non-zero ``call`` fails it (desync)."""

    @abstractmethod
    def cancel(self, request: Request) -> None:
        """Withdraw a receive that has not started to arrive (after a timeout or an error)."""

    @abstractmethod
    def close(self) -> None:
        """Flush, say goodbye to peers and release every resource; idempotent."""


class NetworkTransport(Transport):
    """A transport that reaches every rank of the world (tcp; loopback for thread-ranks). It
    reports peers that leave (``Events.peer_gone``), same-host ones included: it is the
    liveness signal."""

    hosts: dict[int, str]  # the host identity of every rank it knows: equal identities share memory
    token: str  # the world's authentication token (names shared segments)

    @abstractmethod
    def abort(self, peers: list[int], group: int, error: BaseException, known_dead: list[int]) -> None:
        """Tell ``peers`` that this rank failed an operation of ``group`` with ``error``
        (``known_dead``: the members this rank knows are dead, for their error message)."""

    @abstractmethod
    def peer_host(self, peer: int) -> str:
        """How ``peer`` is named in error messages (host name, address, interface)."""

    def connect(self, peers: list[int], deadline: Deadline) -> list[int]:
        """Meet ``peers`` that joined the job (or, on a rank joining, the job's ranks);
        return those that cannot be reached (gone)."""
        return []

    def endpoint(self) -> str:
        """Where peers reach this rank, every lane of it (for debug output)."""
        return self.peer_host(self.rank)

    def listening_addresses(self) -> list[str]:
        """The addresses this rank accepts peers' connections on (none: it takes no connections)."""
        return []

    def announce_exit(self, cause: str | None) -> None:  # noqa: B027 - a transport without goodbyes
        """This process is ending with its groups alive (no destroy_process_group): tell every
        connected peer, with ``cause``, the failure that ends it (None: none seen; see goodbye)."""

    def cut_off(self, peer: int, error: BaseException) -> None:  # noqa: B027 - a transport without liveness
        """Another rank declared ``peer`` dead (``error``): hang up on it too, telling it so."""

    def fail_sends(self, group: int, error: BaseException) -> None:  # noqa: B027 - sends that complete at once
        """``group`` was aborted: fail its sends still queued here."""

    def engage(self, nbytes: int) -> bool:
        """A blocking operation of ``nbytes`` starts in the calling thread; a transport may
        let that thread drive its I/O until the operation ends. True: call ``disengage()``
        at its end."""
        return False

    def disengage(self) -> None:  # noqa: B027 - nothing to end unless engage() said True
        """The operation that ``engage`` returned True for has ended."""


class HostLocalTransport(Transport):
    """A transport between the ranks of one host (shm). A peer's departure is learnt from the
    network transport: ``peer_gone`` delivers what the peer already sent, then reports it."""

    @abstractmethod
    def peer_gone(self, peer: int, error: BaseException) -> None:
        """``peer`` left: deliver what it wrote, fail what waits on it, then ``Events.peer_gone``."""
