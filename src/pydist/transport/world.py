"""The world's transport: tcp to every peer, shared memory to peers on the same host.

Every rank keeps one tcp connection per peer (the fallback, the carrier of ABORT frames,
and the liveness signal: a local peer's death closes its socket). Data for a peer on the
same host goes through the shared-memory rings instead; both deliver into one Matcher, so
receives (any-source included) do not care which way a message came. Groups whose
members share this host get a shared-memory arena (``arena``) for their collectives.

Shared memory is off when PYDIST_SHM=0, when this host has a single rank, or when the
machine lacks what it needs (see _atomics.available).
"""
from __future__ import annotations

import hashlib
from typing import Callable

from .._deadline import Deadline
from .._settings import Settings, settings
from ._base import MessageKey, Request, Transport, completed_request
from . import _atomics as atomics
from ._matching import Matcher
from ._shm_segment import share
from ._signal import oversubscribed
from .arena import Arena, arena_bytes
from .shm import ShmTransport, host_segment_bytes, ring_bytes_for
from .tcp import TcpTransport


class WorldTransport(Transport):
    """tcp + shared memory for one rank of a world."""

    def __init__(self, rank: int, size: int, store, deadline: Deadline, address: str, hostname: str,
                 host_id: str, shares_interpreter: bool = False):
        """``shares_interpreter``: ranks are threads of one process (tests), so waiting must
        never spin (spinning holds the GIL the awaited rank needs)."""
        self.rank, self.size, self.store = rank, size, store
        self.settings: Settings = settings()
        self.matcher = Matcher(self.settings.max_unexpected_bytes)
        self.shm: ShmTransport | None = None
        self._local_set = {rank}
        self.tcp = TcpTransport(rank, size, store, deadline, address, hostname, host_id, self.matcher,
                                self._peer_failed)
        self.hosts = [record.host_id for record in self.tcp.records]
        self.local = [r for r in range(size) if self.hosts[r] == host_id]
        self.oversubscribed = shares_interpreter or oversubscribed(len(self.local))
        if len(self.local) > 1 and self.settings.shm and atomics.available():
            self.shm = self._open_shm(deadline, host_id)
            self._local_set = set(self.local)

    def _open_shm(self, deadline: Deadline, host_id: str) -> ShmTransport:
        ring = ring_bytes_for(len(self.local), self.settings.shm_ring_bytes)
        key = "shm/host/" + hashlib.blake2b(host_id.encode(), digest_size=8).hexdigest()
        segment = share(self.store, key, self.local, self.rank, host_segment_bytes(len(self.local), ring),
                        self.tcp.token, "host", deadline)
        return ShmTransport(self.rank, self.local, segment.array, segment.base, ring, self.matcher,
                            self.oversubscribed, keepalive=segment)

    def _peer_failed(self, peer: int, error: BaseException) -> None:
        if self.shm is not None and peer in self._local_set:
            self.shm.peer_gone(peer, error)  # deliver what it wrote to shared memory first
        else:
            self.matcher.fail_source(peer, error)

    # -- Transport ------------------------------------------------------------------------
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        aborted = self.matcher.aborted(key.group)
        if aborted is not None:  # the peers have moved on: sending would block or mislead
            return completed_request(peer, data, aborted)
        if peer in self._local_set and peer != self.rank:
            assert self.shm is not None  # _local_set holds other ranks only with shared memory
            return self.shm.isend(peer, data, key, call)
        return self.tcp.isend(peer, data, key, call)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        request = Request(peer, data, call)
        if self.shm is not None and (peer is None or peer in self._local_set):
            request.poll = (self.shm.poll, self.shm.spin_seconds)  # the waiter drains rings itself first
        else:
            request.drive = self.tcp.driver(data.nbytes)  # the waiter reads the sockets itself
        self.matcher.post(request, peer, key)
        return request

    def cancel(self, request: Request) -> None:
        self.tcp.cancel(request)

    def engage(self, nbytes: int) -> bool:
        """tcp's (see TcpTransport.engage) when every peer is over tcp: an operation that
        also waits on shared memory must leave the sockets to the I/O thread meanwhile (a
        local peer's death is seen on its socket)."""
        return self.shm is None and self.tcp.engage(nbytes)

    def disengage(self) -> None:
        self.tcp.disengage()

    def abort(self, peers: list[int], group: int, error: BaseException) -> None:
        self.tcp.abort(peers, group, error)

    def peer_host(self, peer: int) -> str:
        return self.tcp.peer_host(peer)

    def host_of(self, peer: int) -> str:
        """Host identity of world rank ``peer`` (equal identities share memory)."""
        return self.hosts[peer]

    def arena(self, group_id: int, members: list[int], labels: list[int], index: int, deadline: Deadline,
              describe, alive: Callable[[], None] | None = None) -> Arena | None:
        if self.shm is None or any(m not in self._local_set for m in members):
            return None
        slot = self.settings.shm_slot_bytes
        segment = share(self.store, f"shm/arena/{group_id:x}/{','.join(map(str, members))}", members,
                        self.rank, arena_bytes(len(members), slot), self.tcp.token, "arena", deadline, alive)
        return Arena(segment.array, segment.base, labels, index, slot, self.oversubscribed, describe,
                     keepalive=segment)

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close(Deadline.after(10))
        self.tcp.close()
