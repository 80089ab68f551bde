"""The world's transport: a network transport to every peer, a host-local one to peers on this host.

Which transports those are comes from the registry (``registry``: tcp and shared memory
today). Every rank keeps one network connection per peer (the fallback, the carrier of
ABORT frames, and the liveness signal: a local peer's death closes its socket). Data for a
peer on the same host goes through the host-local transport instead; both deliver into one
Matcher, so receives (any-source included) do not care which way a message came. Groups
whose members share this host get a shared-memory arena (``arena``) for their collectives
when the host-local entry says so (``arenas``).

No host-local transport is used when this host has a single rank or no entry applies (shm:
PYDIST_SHM=0, or the machine lacks what it needs, see _atomics.available).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Callable

from ..core.deadline import Deadline
from ..core.settings import Settings, settings
from .base import MessageKey, Request, Transport, completed_request
from .matching import Matcher
from .shm.segment import share
from .identity import machine_of
from .shm.signal import oversubscribed
from .shm.arena import Arena, arena_bytes
from .registry import HOST_LOCAL, NETWORK, HostLocalTransport, NetworkTransport, Site, select


class WorldTransport(Transport):
    """The registry's network transport + its host-local one, for one rank of a world."""

    def __init__(self, rank: int, size: int, store, deadline: Deadline, address: str, hostname: str,
                 host_id: str, shares_interpreter: bool = False):
        """``shares_interpreter``: ranks are threads of one process (tests), so waiting must
        never spin (spinning holds the GIL the awaited rank needs)."""
        self.rank, self.size, self.store, self.address = rank, size, store, address
        self.settings: Settings = settings()
        self.matcher = Matcher(self.settings.max_unexpected_bytes)
        self._live_arenas: weakref.WeakSet[Arena] = weakref.WeakSet()
        self.matcher.watchers.append(self._wake_arenas)
        self.host_local: HostLocalTransport | None = None
        self._arenas = False  # the host-local entry's: groups on this host get shared-memory arenas
        self._local_set = {rank}
        site = Site(rank, size, store, deadline, address, hostname, host_id, self.matcher, self.settings,
                    self._peer_failed)
        network = select(NETWORK, site)
        if network is None:
            raise RuntimeError(f"rank {rank}: no registered network transport applies (see transport/registry.py)")
        self.network: NetworkTransport = network.build(site)
        self.hosts = [record.host_id for record in self.network.records]
        self.local = [r for r in range(size) if self.hosts[r] == host_id]
        # CPUs are shared by the ranks of every host on this machine (network namespaces are
        # hosts of one machine): more of them than cores, and waits must not spin long
        machine = machine_of(host_id)
        self.oversubscribed = shares_interpreter or oversubscribed(sum(machine_of(h) == machine for h in self.hosts))
        if len(self.local) > 1:
            site = dataclasses.replace(site, local=self.local, token=self.network.token,
                                       oversubscribed=self.oversubscribed)
            entry = select(HOST_LOCAL, site)
            if entry is not None:
                self.host_local = entry.build(site)
                self._arenas = entry.arenas
                self._local_set = set(self.local)

    def _peer_failed(self, peer: int, error: BaseException) -> None:
        if self.host_local is not None and peer in self._local_set:
            self.host_local.peer_gone(peer, error)  # deliver what it sent through the host first
        else:
            self.matcher.fail_source(peer, error)

    # -- Transport ------------------------------------------------------------------------
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        aborted = self.matcher.aborted(key.group)
        if aborted is not None:  # the peers have moved on: sending would block or mislead
            return completed_request(peer, data, aborted)
        if peer in self._local_set and peer != self.rank:
            assert self.host_local is not None  # _local_set holds other ranks only with a host-local transport
            return self.host_local.isend(peer, data, key, call)
        return self.network.isend(peer, data, key, call)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        if self.host_local is None or (peer is not None and peer not in self._local_set):
            return self.network.irecv(peer, data, key, call)  # it may stripe it over several lanes
        request = Request(peer, data, call)
        request.drive = self.host_local.drive  # the waiter drains the rings itself first
        self.matcher.post(request, peer, key)
        return request

    def use_store(self, store) -> None:
        self.store = store

    def cancel(self, request: Request) -> None:
        self.network.cancel(request)

    def engage(self, nbytes: int) -> bool:
        """The network transport's (see TcpTransport.engage) when every peer is over the
        network: an operation that also waits on the host-local transport must leave the
        sockets to the I/O thread meanwhile (a local peer's death is seen on its socket)."""
        return self.host_local is None and self.network.engage(nbytes)

    def disengage(self) -> None:
        self.network.disengage()

    def abort(self, peers: list[int], group: int, error: BaseException) -> None:
        self.network.abort(peers, group, error)

    def peer_host(self, peer: int) -> str:
        return self.network.peer_host(peer)

    def host_of(self, peer: int) -> str:
        """Host identity of world rank ``peer`` (equal identities share memory)."""
        return self.hosts[peer]

    def arena(self, group_id: int, members: list[int], labels: list[int], index: int, deadline: Deadline,
              describe, alive: Callable[[], None] | None = None) -> Arena | None:
        if not self._arenas or any(m not in self._local_set for m in members):
            return None
        slot = self.settings.shm_slot_bytes
        segment = share(self.store, f"shm/arena/{group_id:x}/{','.join(map(str, members))}", members,
                        self.rank, arena_bytes(len(members), slot), self.network.token, "arena", deadline, alive)
        arena = Arena(segment.array, segment.base, labels, index, slot, self.oversubscribed, describe,
                      keepalive=segment)
        self._live_arenas.add(arena)
        return arena

    def _wake_arenas(self) -> None:
        for arena in list(self._live_arenas):
            arena.wake()

    def close(self) -> None:
        if self.host_local is not None:
            self.host_local.close(Deadline.after(10))
        self.network.close()
