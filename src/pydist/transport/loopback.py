"""In-process transport for ranks that are threads of one process: the unit-test reference.

A LoopbackFabric is the switchboard of ``size`` thread-ranks. Each rank's WorldTransport is
built on it (``world_transport``): its network transport is a LoopbackTransport, whose send
copies the bytes into the destination's matcher at once (straight into a posted receive, or
held as unexpected), so sends complete immediately and never deadlock; arenas of ranks that
share a host identity (``hosts``) live in anonymous memory shared by the threads. The code
above the transport (world transport, matcher, engines, algorithms) is the real one.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ..core.deadline import Deadline
from ..core.errors import DistBackendError, DistNetworkError, PeerFailedError
from ..core.settings import Settings
from .abort import abort_payload, aborted_by
from .base import Events, MessageKey, NetworkTransport, Request, completed_request
from .matching import Matcher, deliver_whole
from .registry import Site
from .shm.segment import Keepalive, anonymous
from .world import WorldTransport


class _Endpoint:
    """What the fabric knows of one attached rank: where its messages land and whom to tell."""

    __slots__ = ("matcher", "events", "on_peer_gone")

    def __init__(self, matcher: Matcher, events: Events, on_peer_gone: Callable[[int, BaseException], None]):
        self.matcher, self.events, self.on_peer_gone = matcher, events, on_peer_gone


class LoopbackFabric:
    """The shared switchboard of ``size`` thread-ranks; ``hosts``: each rank's host identity
    (default: one host), so that one process can pose as several hosts."""

    def __init__(self, size: int, hosts: list[str] | None = None):
        if size < 1:
            raise ValueError(f"size: expected >= 1, got {size}")
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"hosts: expected {size} host identities, got {len(hosts)}")
        self.size = size
        self.hosts = list(hosts) if hosts is not None else ["local"] * size
        self.endpoints: list[_Endpoint | None] = [None] * size
        self.closed: set[int] = set()
        self._arenas: dict[str, tuple[np.ndarray, int]] = {}
        self._ready = threading.Condition()

    def world_transport(self, rank: int, events: Events, settings: Settings, deadline: Deadline,
                        joining: bool = False) -> WorldTransport:
        """Rank ``rank``'s world transport on this fabric (made once every rank that started
        is attached; a ``joining`` one at once, with room made for it, on its host: ``add_rank``)."""
        if joining:
            self.add_rank(rank)
        return WorldTransport(rank, self.size, None, deadline, events, settings, host_id=self.hosts[rank],
                              shares_interpreter=True, fabric=self, joining=joining)

    def add_rank(self, rank: int, host: str | None = None) -> None:
        """Room for thread-rank ``rank`` (joining the job) on ``host`` (default: rank 0's, or
        the one given before)."""
        with self._ready:
            while self.size <= rank:
                self.hosts.append(self.hosts[0])
                self.endpoints.append(None)
                self.size += 1
            if host is not None:
                self.hosts[rank] = host

    def attach(self, rank: int, matcher: Matcher, events: Events,
               on_peer_gone: Callable[[int, BaseException], None]) -> LoopbackTransport:
        """Rank ``rank``'s end: messages for it land in ``matcher``; its peers' aborts and
        departures are told to ``events`` and ``on_peer_gone``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank: expected 0 <= rank < {self.size}, got {rank}")
        with self._ready:
            self.endpoints[rank] = _Endpoint(matcher, events, on_peer_gone)
            self._ready.notify_all()
        return LoopbackTransport(self, rank, matcher)

    # -- Fabric (see world.py) ------------------------------------------------------------
    def network(self, site: Site) -> NetworkTransport:
        """Attach ``site``'s rank and wait (until its deadline) for every rank to be attached,
        as a real network transport connects to every peer before it returns."""
        transport = self.attach(site.rank, site.matcher, site.events, site.on_peer_gone)
        if site.joining:
            return transport
        with self._ready:
            if not site.deadline.wait(self._all_attached(site.size)):
                missing = [r for r, e in enumerate(self.endpoints[:site.size]) if e is None]
                raise DistNetworkError(f"rank {site.rank}: thread-ranks {missing} never attached to the loopback")
        return transport

    def _all_attached(self, size: int) -> Callable[[float | None], bool]:
        """Under ``_ready``: a wait of up to its argument's seconds for the first ``size`` ranks
        to be attached (a blocking primitive's wait, for Deadline.wait)."""
        return lambda seconds: self._ready.wait_for(lambda: all(self.endpoints[:size]), seconds)

    def arena_memory(self, key: str, members: list[int], rank: int, nbytes: int, deadline: Deadline,
                     alive: Callable[[], None] | None) -> tuple[np.ndarray, int, Keepalive | None]:
        """Anonymous memory every thread-rank sees, one block per arena key."""
        with self._ready:
            if key not in self._arenas:
                self._arenas[key] = anonymous(nbytes)
            memory, base = self._arenas[key]
        return memory, base, None


class LoopbackTransport(NetworkTransport):
    """One thread-rank's end of a LoopbackFabric."""

    def __init__(self, fabric: LoopbackFabric, rank: int, matcher: Matcher):
        self.fabric = fabric
        self.rank = rank
        self.matcher = matcher
        self.token = "loopback"

    @property
    def size(self) -> int:
        return self.fabric.size

    @property
    def hosts(self) -> dict[int, str]:  # type: ignore[override]  # every rank of the fabric is reachable
        return dict(enumerate(self.fabric.hosts))

    def connect(self, peers: list[int], deadline: Deadline) -> list[int]:
        """Every rank attached is reachable; the others (gone, or never come) are returned."""
        return [p for p in peers if p in self.fabric.closed or p >= self.fabric.size
                or self.fabric.endpoints[p] is None]

    def _gone(self, peer: int) -> PeerFailedError:
        return PeerFailedError(f"rank {peer} (thread) has closed its transport", rank=peer, host="local")

    def _endpoint(self, peer: int) -> _Endpoint:
        endpoint = self.fabric.endpoints[peer]
        assert endpoint is not None  # attached before any message (see LoopbackFabric.network)
        return endpoint

    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        if peer in self.fabric.closed:
            return completed_request(peer, data, self._gone(peer))
        deliver_whole(self._endpoint(peer).matcher, self.rank, key, data, call)
        return completed_request(peer, data)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        request = Request(peer, data, call)
        self.matcher.post(request, peer, key)
        return request

    def cancel(self, request: Request) -> None:
        self.matcher.cancel(request, DistBackendError("receive cancelled"))

    def abort(self, peers: list[int], group: int, error: BaseException, known_dead: list[int]) -> None:
        payload = abort_payload(error, known_dead)
        for peer in peers:
            if peer != self.rank and peer not in self.fabric.closed:
                self._endpoint(peer).events.abort_group(group, aborted_by(self.rank, "local", payload))

    def peer_host(self, peer: int) -> str:
        return self.fabric.hosts[peer]

    def close(self) -> None:
        with self.fabric._ready:
            if self.rank in self.fabric.closed:
                return
            self.fabric.closed.add(self.rank)
        for rank, endpoint in enumerate(self.fabric.endpoints):
            if rank != self.rank and endpoint is not None:
                endpoint.on_peer_gone(self.rank, self._gone(self.rank))
