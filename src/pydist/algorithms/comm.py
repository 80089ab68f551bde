"""What an algorithm sees of the network: the pair interface of one operation.

A Comm numbers peers by group rank, scopes every message to (group, sequence number, tag)
and stamps it with the call's fingerprint (a receiver in another call fails: DesyncError),
and waits with the operation's deadline. On timeout it raises DistBackendError naming the
operation, its sequence number and the peer it was waiting for; a peer failure re-raises
the transport's PeerFailedError with the operation prepended. ``abandon()`` withdraws
receives still posted, so that no late message lands in a user's buffer after an error.
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from ..core.deadline import Deadline
from ..core.errors import OpTimeoutError
from ..transport.base import MessageKey, Request


def as_bytes(array: np.ndarray) -> memoryview:
    """A contiguous array's memory as a byte view (no copy; writable when the array is)."""
    try:
        return memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy types __buffer__ for 3.12+ only
    except TypeError:  # a format memoryview does not know
        return array.reshape(-1).view(np.uint8).data


def with_context(error: BaseException, prefix: str) -> BaseException:
    """A copy of ``error`` (same type and attributes) whose message starts with ``prefix``."""
    wrapped = copy.copy(error)
    wrapped.args = (f"{prefix}: {error}",) + tuple(error.args[1:])
    wrapped.__cause__ = error.__cause__ or error
    return wrapped


class Link(Protocol):
    """What a Comm uses of the world's transport (transport.world.WorldTransport), in transport ranks."""

    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request: ...
    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request: ...
    def cancel(self, request: Request) -> None: ...
    def peer_host(self, peer: int) -> str: ...


SCRATCH_KEEP_BYTES = 256 << 20  # scratch a thread keeps between operations, at most
_scratch = threading.local()


def _kept() -> dict[int, np.ndarray]:
    kept = getattr(_scratch, "buffers", None)
    if kept is None:
        kept = _scratch.buffers = {}
    return kept


class Hierarchy(NamedTuple):
    """The stages of a hierarchical algorithm, as one rank sees them."""

    local: Comm  # this host's ranks, over the host's arena (its ``arena`` is None when alone)
    leaders: Comm | None  # one rank per host (None on the other ranks); leader h is host h's
    hosts: list[list[int]]  # every host's group ranks, host h's leader first
    host: int  # this rank's host
    rail: Comm | None  # the rails algorithms: the ranks at this rank's place on every host
    inter: Callable[..., None] | None  # all_reduce, all_gather, reduce_scatter: the leaders' (rails') stage

    def led_by(self, rank: int) -> int:
        """The host whose leader is group rank ``rank`` (a root leads its own host)."""
        return next(h for h, ranks in enumerate(self.hosts) if ranks[0] == rank)


class Comm:
    """One operation's messages over a transport, in group ranks; ``arena`` is the group's
    shared-memory arena when its ranks share a host; ``hierarchy`` is set for hierarchical
    algorithms."""

    __slots__ = ("transport", "group_id", "transport_ranks", "rank", "size", "seq", "deadline", "op_name",
                 "timeout_text", "arena", "call", "hierarchy", "_receives")

    def __init__(self, transport: Link, group_id: int, transport_ranks: list[int], rank: int,
                 seq: int, deadline: Deadline, op_name: str, timeout_text: str = "Timed out waiting", arena=None,
                 call: int = 0):
        self.transport = transport
        self.group_id = group_id
        self.transport_ranks = transport_ranks  # of the peers, by group rank
        self.rank = rank  # this rank's group rank
        self.size = len(transport_ranks)
        self.seq = seq
        self.deadline = deadline
        self.op_name = op_name
        self.timeout_text = timeout_text
        self.arena = arena
        self.call = call  # the call's fingerprint, carried and checked by every message and arena sync
        self.hierarchy: Hierarchy | None = None
        self._receives: list[Request] = []

    def describe(self) -> str:
        return f"{self.op_name} (seq {self.seq}) on rank {self.transport_ranks[self.rank]}"

    def isend(self, peer: int, array: np.ndarray, tag: int = 0) -> Request:
        return self.transport.isend(self.transport_ranks[peer], as_bytes(array),
                                    MessageKey(self.group_id, self.seq, tag), self.call)

    def irecv(self, peer: int, array: np.ndarray, tag: int = 0) -> Request:
        request = self.transport.irecv(self.transport_ranks[peer], as_bytes(array),
                                       MessageKey(self.group_id, self.seq, tag), self.call)
        self._receives.append(request)
        return request

    def wait(self, request: Request) -> None:
        """Wait for one request within the deadline; raise naming the peer on failure."""
        if not self.deadline.wait(request.wait):
            peer = request.peer
            host = self.transport.peer_host(peer) if peer is not None else "?"
            raise OpTimeoutError(
                f"{self.describe()}: {self.timeout_text} for rank {peer} ({host}); "
                "that rank has not reached this operation or is stuck")
        if request.error is not None:
            raise with_context(request.error, self.describe())

    def wait_all(self, requests: list[Request]) -> None:
        for request in requests:
            self.wait(request)

    def send(self, peer: int, array: np.ndarray, tag: int = 0) -> None:
        self.wait(self.isend(peer, array, tag))

    def recv(self, peer: int, array: np.ndarray, tag: int = 0) -> None:
        self.wait(self.irecv(peer, array, tag))

    def sendrecv(self, dst: int, send: np.ndarray, src: int, recv: np.ndarray, tag: int = 0) -> None:
        """Exchange with two peers at once (never deadlocks: both are posted before waiting)."""
        receive = self.irecv(src, recv, tag)
        self.wait(self.isend(dst, send, tag))
        self.wait(receive)

    def scratch(self, count: int, dtype: np.dtype, index: int = 0) -> np.ndarray:
        """An uninitialised array of ``count`` items for this operation's temporaries: the
        ``index``-th scratch buffer of this thread, reused by its later operations (a fresh
        allocation per call costs page faults comparable to the copy it holds)."""
        nbytes = count * np.dtype(dtype).itemsize
        kept = _kept()
        buffer = kept.get(index)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = np.empty(nbytes, np.uint8)
            if sum(b.nbytes for i, b in kept.items() if i != index) + nbytes <= SCRATCH_KEEP_BYTES:
                kept[index] = buffer
        return buffer[:nbytes].view(dtype)

    def abandon(self) -> None:
        """Withdraw receives still pending (after an error), so nothing lands later, here and in
        a hierarchy's stages; this thread's scratch is dropped, since a frame already started
        may still land in it."""
        _kept().clear()
        for request in self._receives:
            if not request.done():
                self.transport.cancel(request)
        self._receives.clear()
        stages = self.hierarchy
        if stages is not None:
            for comm in (stages.local, stages.leaders, stages.rail):
                if comm is not None:
                    comm.abandon()
