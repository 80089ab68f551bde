"""The transports a rank's world is built from, by kind; adding one is one ``register`` call.

Two kinds:

- ``network`` (a base.NetworkTransport): reaches every peer. The world builds the first
  entry that applies (tcp). It also carries ABORT frames and is the liveness signal: it calls
  ``site.on_peer_gone`` when a peer's connection dies, same-host peers included.
- ``host-local`` (a base.HostLocalTransport): carries data between the ranks of this host.
  When this host has other ranks, the world builds the first entry that applies (shm:
  PYDIST_SHM on and the machine supports it) and sends to those peers through it; otherwise
  everything goes over the network. It calls ``site.on_peer_gone`` once a departed peer's
  messages are delivered.

An entry names a ``build(site)`` returning the transport (a host-local one may return None:
it could not be made, e.g. /dev/shm is full, and every rank of the host goes without it) and
an ``applies(site)`` predicate; ``site`` describes the rank being built (see Site). Entries
of a kind are tried in registration order (``first=True`` puts one ahead).
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.deadline import Deadline
from ..core.settings import Settings
from .base import Events, HostLocalTransport, NetworkTransport
from .matching import Matcher
from .shm import atomics
from .shm.sharing import share
from .shm.transport import ShmTransport, host_segment_bytes, ring_bytes_for
from .tcp.transport import TcpTransport

NETWORK, HOST_LOCAL = "network", "host-local"
KINDS = (NETWORK, HOST_LOCAL)


@dataclass(frozen=True)
class Site:
    """What a builder knows about the rank it builds for. ``local``, ``token`` and
    ``oversubscribed`` are known once the network transport exists (host-local builders)."""

    rank: int
    size: int
    store: Any
    deadline: Deadline
    address: str
    hostname: str
    host_id: str
    matcher: Matcher  # every transport of the world delivers into this one
    events: Events  # the layer above: peers gone, groups aborted (see base.Events)
    settings: Settings
    on_peer_gone: Callable[[int, BaseException], None]  # whom the built transport tells that a peer left
    local: list[int] = field(default_factory=list)  # ranks on this host, this one included
    token: str = ""  # the world's authentication token (to name shared segments)
    oversubscribed: bool = False  # more ranks than cores here (or ranks are threads): never spin long
    joining: bool = False  # the rank joins a running job: the job's ranks connect to it later


@dataclass(frozen=True)
class TransportEntry:
    """One registered transport: its ``name``, ``kind`` (network or host-local), how to
    ``build`` it for a Site, and whether it ``applies`` to a Site. ``arenas``: groups of
    the ranks it serves also get shared-memory arenas (it needs what they need)."""

    name: str
    kind: str
    build: Callable[[Site], Any]
    applies: Callable[[Site], bool]
    arenas: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name: expected a non-empty string, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected 'network' or 'host-local', got {self.kind!r}")
        for argument in ("build", "applies"):
            if not callable(getattr(self, argument)):
                raise TypeError(f"{argument}: expected a callable taking a Site, "
                                f"got {type(getattr(self, argument)).__name__}")
        if not isinstance(self.arenas, bool):
            raise TypeError(f"arenas: expected a bool, got {type(self.arenas).__name__}")


_entries: list[TransportEntry] = []
_lock = threading.Lock()


def register(entry: TransportEntry, first: bool = False) -> None:
    """Add ``entry``, after the entries of its kind (``first``: before them); names are unique."""
    if not isinstance(entry, TransportEntry):
        raise TypeError(f"entry: expected a TransportEntry, got {type(entry).__name__}")
    with _lock:
        if any(e.name == entry.name for e in _entries):
            raise ValueError(f"entry: a transport named {entry.name!r} is already registered")
        _entries.insert(0 if first else len(_entries), entry)


def unregister(name: str) -> None:
    """Remove the entry called ``name``."""
    with _lock:
        found = [e for e in _entries if e.name == name]
        if not found:
            raise ValueError(f"name: no transport named {name!r} is registered "
                             f"(registered: {', '.join(sorted(e.name for e in _entries))})")
        _entries.remove(found[0])


def entries(kind: str) -> list[TransportEntry]:
    """The entries of ``kind``, in the order they are tried."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected 'network' or 'host-local', got {kind!r}")
    with _lock:
        return [e for e in _entries if e.kind == kind]


def select(kind: str, site: Site) -> TransportEntry | None:
    """The first entry of ``kind`` that applies to ``site``; None when none does."""
    return next((e for e in entries(kind) if e.applies(site)), None)


# -- the built-in transports ----------------------------------------------------------------
def _open_tcp(site: Site) -> NetworkTransport:
    return TcpTransport(site.rank, site.size, site.store, site.deadline, site.address, site.hostname,
                        site.host_id, site.matcher, site.events, site.settings, site.on_peer_gone,
                        joining=site.joining)


def _open_shm(site: Site) -> HostLocalTransport | None:
    """The host's ring segment (made by its lowest rank, found through the store) and this
    rank's channels; None when /dev/shm has no room for it (the host's ranks then talk over
    the network transport, all of them)."""
    ring = ring_bytes_for(len(site.local), site.settings.shm_ring_bytes)
    key = "shm/host/" + hashlib.blake2b(site.host_id.encode(), digest_size=8).hexdigest()
    segment = share(site.store, key, site.local, site.rank, host_segment_bytes(len(site.local), ring),
                    site.token, "host", site.deadline)
    if segment is None:
        return None
    return ShmTransport(site.rank, site.local, segment.array, segment.base, ring, site.matcher,
                        site.oversubscribed, site.on_peer_gone, keepalive=segment)


register(TransportEntry("tcp", NETWORK, _open_tcp, applies=lambda site: True))
register(TransportEntry("shm", HOST_LOCAL, _open_shm, applies=lambda site: site.settings.shm and atomics.available(),
                        arenas=True))
