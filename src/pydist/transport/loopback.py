"""In-process transport for ranks that are threads of one process: the unit-test reference.

A send copies its bytes into the destination's matcher at once (straight into a posted
receive, or held as unexpected), so sends complete immediately and never deadlock.
"""
from __future__ import annotations

import threading

from ..core.errors import DistBackendError, PeerFailedError
from ..core.settings import settings
from .abort import abort_payload, aborted_by
from .base import MessageKey, Request, Transport, completed_request
from .matching import Matcher, Unexpected, mismatch
from .shm.segment import anonymous
from .shm.arena import Arena, arena_bytes


class LoopbackFabric:
    """The shared switchboard of ``size`` thread-ranks; ``transport(rank)`` for each."""

    def __init__(self, size: int, hosts: list[str] | None = None):
        if size < 1:
            raise ValueError(f"size: expected >= 1, got {size}")
        self.size = size
        self.hosts = hosts or ["local"] * size
        self.matchers = [Matcher() for _ in range(size)]
        self.closed: set[int] = set()
        self.arenas: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def transport(self, rank: int) -> "LoopbackTransport":
        return LoopbackTransport(self, rank)


class LoopbackTransport(Transport):
    """One thread-rank's end of a LoopbackFabric."""

    def __init__(self, fabric: LoopbackFabric, rank: int):
        if not 0 <= rank < fabric.size:
            raise ValueError(f"rank: expected 0 <= rank < {fabric.size}, got {rank}")
        self.fabric = fabric
        self.rank = rank
        self.size = fabric.size

    def _gone(self, peer: int) -> PeerFailedError:
        return PeerFailedError(f"rank {peer} (thread) has closed its transport", rank=peer, host="local")

    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        if peer in self.fabric.closed:
            return completed_request(peer, data, self._gone(peer))
        aborted = self.matcher.aborted(key.group)
        if aborted is not None:
            return completed_request(peer, data, aborted)
        target = self.fabric.matchers[peer].arrive(self.rank, key, data.nbytes, call)
        if isinstance(target, Unexpected):
            target.data[:] = data
            self.fabric.matchers[peer].unexpected_done(target)
        elif (error := mismatch(target, self.rank, key, data.nbytes, call)) is not None:
            target.complete(error)
        else:
            target.buffer[:] = data
            target.complete(source=self.rank)
        return completed_request(peer, data)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        request = Request(peer, data, call)
        self.fabric.matchers[self.rank].post(request, peer, key)
        return request

    def cancel(self, request: Request) -> None:
        self.fabric.matchers[self.rank].cancel(request, DistBackendError("receive cancelled"))

    def abort(self, peers: list[int], group: int, error: BaseException) -> None:
        payload = abort_payload(error, self.matcher.known_dead(group))
        for peer in peers:
            if peer != self.rank:
                self.fabric.matchers[peer].fail_group(group, aborted_by(self.rank, "local", payload))

    def peer_host(self, peer: int) -> str:
        return self.fabric.hosts[peer]

    def host_of(self, peer: int) -> str:
        return self.fabric.hosts[peer]

    @property
    def matcher(self) -> Matcher:  # type: ignore[override]  # base declares an attribute; nobody assigns this one
        return self.fabric.matchers[self.rank]

    def arena(self, group_id: int, members: list[int], labels: list[int], index: int, deadline, describe,
              alive=None):
        """An arena in memory shared by the thread-ranks (same code as the shared-memory one)."""
        if len({self.fabric.hosts[m] for m in members}) > 1:
            return None
        slot = settings().shm_slot_bytes
        with self.fabric._lock:
            key = (group_id, tuple(members))
            if key not in self.fabric.arenas:
                self.fabric.arenas[key] = anonymous(arena_bytes(len(members), slot))
            memory, base = self.fabric.arenas[key]
        return Arena(memory, base, labels, index, slot, True, describe)  # threads: never spin on the GIL

    def close(self) -> None:
        with self.fabric._lock:
            if self.rank in self.fabric.closed:
                return
            self.fabric.closed.add(self.rank)
        for rank, matcher in enumerate(self.fabric.matchers):
            if rank != self.rank:
                matcher.fail_source(self.rank, self._gone(self.rank))
