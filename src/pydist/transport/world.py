"""The world's transport: a network transport to every peer, a host-local one to peers on this host.

Which transports those are comes from the registry (tcp and shared memory today), or from a
Fabric given instead (the in-process loopback of thread-ranks). Every rank keeps one network
connection per peer (the fallback, the carrier of ABORT frames, and the liveness signal: a
local peer's death closes its socket). Data for a peer on the same host goes through the
host-local transport instead; both deliver into one Matcher, so receives (any-source
included) do not care which way a message came. Groups whose members share this host get a
shared-memory arena (``arena``) for their collectives when the host-local entry says so
(``arenas``), or the fabric provides the memory.

What happens to peers and groups is reported to ``events`` (the layer above, which keeps that
knowledge); it calls back ``failed_peer`` and ``failed_group`` once it has recorded a
failure, and the world fails the receives and sends waiting on it and wakes arena sleepers.

No host-local transport is used when this host has a single rank or no entry applies (shm:
PYDIST_SHM=0, or the machine lacks what it needs, see shm.atomics.available), or when it
could not be made (/dev/shm too small for its rings; a group's arena likewise: that group
goes without, see shm.sharing).
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..core.deadline import Deadline
from ..core.errors import DistError
from ..core.settings import Settings
from .base import Events, HostLocalTransport, MessageKey, NetworkTransport, Request, completed_request
from .identity import machine_of
from .matching import Matcher
from .registry import HOST_LOCAL, NETWORK, Site, select
from .shm.arena import Arena, arena_bytes
from .shm.cpus import CpuShare, usable_cpus
from .shm.segment import Keepalive
from .shm.sharing import share

#: the group id of a world's setup (its barrier at init, the abort of a rank whose setup failed)
SETUP_GROUP = 0


class Fabric(Protocol):
    """Where a world's network transport and arena memory come from instead of the registry
    (LoopbackFabric: thread-ranks of one process)."""

    def network(self, site: Site) -> NetworkTransport: ...

    def arena_memory(self, key: str, members: list[int], rank: int, nbytes: int, deadline: Deadline,
                     alive: Callable[[], None] | None) -> tuple[np.ndarray, int, Keepalive | None]: ...


class WorldTransport:
    """The network transport + the host-local one of one rank, and the arenas of its groups."""

    def __init__(self, rank: int, size: int, store: Any, deadline: Deadline, events: Events, settings: Settings,
                 address: str = "127.0.0.1", hostname: str = "localhost", host_id: str = "this-host",
                 shares_interpreter: bool = False, fabric: Fabric | None = None, joining: bool = False):
        """``events``: the layer above (see base.Events); ``shares_interpreter``: ranks are
        threads of one process (tests), so waiting must never spin (spinning holds the GIL
        the awaited rank needs); ``fabric``: build from it instead of the registry;
        ``joining``: this rank joins a running job (``size``: the ranks it may meet), its
        peers connect to it later (``connect``); it has no host-local transport (the host's
        rings were laid out for the ranks that started), but arenas like every rank."""
        self.rank, self.store, self.address = rank, store, address
        self.settings, self.events = settings, events
        self.matcher = Matcher(events, settings.max_unexpected_bytes)
        self._fabric = fabric
        self._live_arenas: weakref.WeakSet[Arena] = weakref.WeakSet()
        self.host_local: HostLocalTransport | None = None
        self._shared_arenas = False  # the host-local entry's: groups on this host get arenas in shared segments
        self._local_set = {rank}
        site = Site(rank, size, store, deadline, address, hostname, host_id, self.matcher, events, settings,
                    self._peer_lost, joining=joining)
        # CPUs are shared by the ranks of every host on this machine (network namespaces are
        # hosts of one machine): a rank with a narrowed CPU mask tells the others before they meet
        machine = machine_of(host_id)
        cpu_share = None if fabric is not None or joining or shares_interpreter else CpuShare(store, machine, rank)
        if fabric is not None:
            self.network: NetworkTransport = fabric.network(site)
        else:
            entry = select(NETWORK, site)
            if entry is None:
                raise RuntimeError(f"rank {rank}: no registered network transport applies (see transport/registry.py)")
            self.network = entry.build(site)
        self.hosts = dict(self.network.hosts)
        self.local = [r for r, host in sorted(self.hosts.items()) if host == host_id]
        # more ranks on this machine than CPUs they may use, and waits must not spin long (a
        # joining rank knows only itself: it counts the whole job on this machine, to be safe)
        machine_ranks = [r for r, host in sorted(self.hosts.items()) if machine_of(host) == machine]
        on_machine = size if joining else len(machine_ranks)
        cpus = cpu_share.cpus(machine_ranks) if cpu_share is not None else usable_cpus()
        self.oversubscribed = shares_interpreter or on_machine > cpus
        self.ranks_on_machine = on_machine
        if fabric is None:
            site = dataclasses.replace(site, local=self.local, token=self.network.token,
                                       oversubscribed=self.oversubscribed, on_peer_gone=events.peer_gone)
            try:
                self._open_host_local(site, deadline)
            except BaseException as error:
                self._abandon(error, deadline)
                raise

    def _open_host_local(self, site: Site, deadline: Deadline) -> None:
        """The host-local transport to this host's other ranks, when an entry applies."""
        local_entry = select(HOST_LOCAL, site)
        # every rank, whatever its host's rank count or whether it joined, agrees on arenas
        self._shared_arenas = local_entry is not None and local_entry.arenas
        if local_entry is not None and len(self.local) > 1 and not site.joining:
            self.host_local = local_entry.build(site)  # None: it could not be made (/dev/shm full)
        if self.host_local is not None:
            self._local_set = set(self.local)
            # a local peer's death is learnt from its socket: connected now, even when the
            # network's connections are made on first use (PYDIST_TCP_CONNECT)
            self.network.connect([r for r in self.local if r != self.rank], deadline)

    def _abandon(self, error: BaseException, deadline: Deadline) -> None:
        """This rank's transport could not be made after its network transport was (its
        host-local one failed: a segment it refused, a creator that never came): for a
        DistError, tell every peer why (an ABORT of group 0, the setup's barrier, which their
        setup then fails at once, naming it, instead of at its timeout); then close the network
        transport (best effort: the error being raised is what counts)."""
        peers = [r for r in sorted(self.hosts) if r != self.rank]
        try:
            if isinstance(error, DistError):
                self.network.connect([r for r in self.local if r != self.rank], deadline)  # lazy ones: now
                self.network.abort(peers, SETUP_GROUP, error, [])
        except (DistError, OSError):
            pass
        finally:
            self.network.close()

    def _peer_lost(self, peer: int, error: BaseException) -> None:
        """The network transport lost ``peer``: a same-host peer's host-local transport first
        delivers what it sent through the host, then reports it; others are reported now."""
        if self.host_local is not None and peer in self._local_set:
            self.host_local.peer_gone(peer, error)
        else:
            self.events.peer_gone(peer, error)

    def _carrier(self, peer: int | None) -> HostLocalTransport | NetworkTransport:
        """The transport of messages from ``peer`` (None: any source, which the host-local
        transport's waiter drains first while the network's thread delivers into the same matcher)."""
        if self.host_local is not None and (peer is None or peer in self._local_set):
            return self.host_local
        return self.network

    # -- the pair interface ---------------------------------------------------------------
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        aborted = self.events.refusal(None, key.group)
        if aborted is not None:  # the peers have moved on: sending would block or mislead
            return completed_request(peer, data, aborted)
        return self._carrier(peer).isend(peer, data, key, call)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        return self._carrier(peer).irecv(peer, data, key, call)

    def cancel(self, request: Request) -> None:
        self._carrier(request.peer).cancel(request)

    # -- the world ------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """One more than the highest rank known (ranks that joined included)."""
        return max(self.hosts) + 1

    def connect(self, peers: list[int], deadline: Deadline) -> list[int]:
        """Meet ``peers`` that joined the job (on a joining rank: the job's ranks); return
        those that cannot be reached (gone). Messages to and from them go over the network."""
        unreachable = self.network.connect(peers, deadline)
        self.hosts = dict(self.network.hosts)
        return unreachable

    def abort(self, peers: list[int], group: int, error: BaseException, known_dead: list[int]) -> None:
        """Tell ``peers`` that this rank failed an operation of ``group`` (see NetworkTransport.abort)."""
        self.network.abort(peers, group, error, known_dead)

    def failed_peer(self, peer: int, error: BaseException) -> None:
        """The layer above recorded ``peer`` gone: fail what waits on it, wake arena sleepers."""
        self.matcher.fail_source(peer, error)
        self._wake_arenas()

    def failed_group(self, group: int, error: BaseException) -> None:
        """The layer above recorded ``group`` aborted: fail its receives and unfinished sends,
        wake arena sleepers."""
        self.matcher.fail_group(group, error)
        self.network.fail_sends(group, error)
        self._wake_arenas()

    def held_calls(self, group: int, seq: int) -> list[tuple[int, MessageKey, int]]:
        """The messages held for operation ``seq`` of ``group`` (see Matcher.held_calls)."""
        return self.matcher.held_calls(group, seq)

    def use_store(self, store) -> None:
        """Later rendezvous (arenas of new groups) go through ``store``: the world's store
        changed (a shrink replaced one whose host died)."""
        self.store = store

    def engage(self, nbytes: int) -> bool:
        """The network transport's (see TcpTransport.engage) when every peer is over the
        network: an operation that also waits on the host-local transport must leave the
        sockets to the I/O thread meanwhile (a local peer's death is seen on its socket)."""
        return self.host_local is None and self.network.engage(nbytes)

    def disengage(self) -> None:
        self.network.disengage()

    def cut_off(self, peer: int, error: BaseException) -> None:
        """Another rank declared ``peer`` dead: hang up on it too (see NetworkTransport.cut_off)."""
        if peer != self.rank:
            self.network.cut_off(peer, error)

    def peer_host(self, peer: int) -> str:
        return self.network.peer_host(peer)

    def host_of(self, peer: int) -> str:
        """Host identity of ``peer`` (equal identities share memory)."""
        return self.hosts[peer]

    @property
    def shares_arenas(self) -> bool:
        """Whether groups of ranks of one host get arenas (every rank of the world agrees;
        one group may still go without, when /dev/shm has no room for it)."""
        return self._shared_arenas or self._fabric is not None

    def arena(self, group_id: int, members: list[int], group_ranks: list[int], index: int, deadline: Deadline,
              describe, alive: Callable[[], None] | None = None) -> Arena | None:
        """A shared-memory arena for ``members`` (ranks of this host), known to algorithms by
        ``group_ranks``; this rank is member ``index``. None when there is no shared memory for
        them. While waiting for another member to create it, ``alive()`` (if given) is called
        now and then and may raise."""
        if not self.shares_arenas or any(self.hosts[m] != self.hosts[self.rank] for m in members):
            return None
        slot = self.settings.shm_slot_bytes
        key = f"shm/arena/{group_id:x}/{','.join(map(str, members))}"
        nbytes = arena_bytes(len(members), slot)
        if self._fabric is not None:
            memory, base, keepalive = self._fabric.arena_memory(key, members, self.rank, nbytes, deadline, alive)
        else:
            segment = share(self.store, key, members, self.rank, nbytes, self.network.token, "arena", deadline, alive)
            if segment is None:  # no room in /dev/shm: the group's ranks go without, together
                return None
            memory, base, keepalive = segment.array, segment.base, segment
        arena = Arena(memory, base, group_ranks, index, slot, self.oversubscribed, describe, keepalive=keepalive,
                      ranks_here=self.ranks_on_machine)
        self._live_arenas.add(arena)
        return arena

    def _wake_arenas(self) -> None:
        for arena in list(self._live_arenas):
            arena.wake()

    def announce_exit(self, cause: str | None) -> None:
        """See NetworkTransport.announce_exit (the network transport carries it to every peer)."""
        self.network.announce_exit(cause)

    def close(self) -> None:
        if self.host_local is not None:
            self.host_local.close()
        self.network.close()
