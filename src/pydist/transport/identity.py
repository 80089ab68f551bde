"""Who and where this rank is: host identity (for locality) and the address peers dial."""
from __future__ import annotations

import os
import socket

from ..core.settings import Settings
from ..net.addresses import family_of, route_to
from ..net.interfaces import named_addresses


def host_identity(found: Settings) -> str:
    """Ranks with equal identities share a host (memory, /dev/shm).

    PYDIST_HOST_ID (``found.host_id``) overrides it (lets one machine pose as several). Otherwise: host name,
    boot id and network namespace, so network namespaces on one machine count as hosts.
    """
    override = found.host_id
    if override:
        return override
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            parts.append(boot.read().strip())
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        pass
    return "/".join(parts)


def machine_of(host_id: str) -> str:
    """The machine (kernel) a host identity runs on: the identity without its network
    namespace, so namespaces of one machine, which share its CPUs, share a machine. An
    identity given by PYDIST_HOST_ID is its own machine."""
    parts = host_id.split("/")
    return "/".join(parts[:2]) if len(parts) == 3 else host_id


def _store_route(store) -> str:
    """The local address of the route to the store: the interface that reaches the master
    reaches the peers too; loopback for in-process stores; the host name's for a FileStore."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if hasattr(store, "client_address"):
        return store.client_address()
    if type(store).__name__ == "HashStore":
        return "127.0.0.1"
    if hasattr(store, "host") and hasattr(store, "port"):  # torch's TCPStore
        return route_to(store.host, store.port)
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def advertise_address(store, found: Settings) -> str:
    """The IP address this rank listens on for peers: PYDIST_ADVERTISE_ADDR; else the first
    interface PYDIST_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) names, in the family of the route to
    the store if it has one; else the local address of the route to the store."""
    override = found.advertise_addr
    if override:
        return override
    route = _store_route(store)
    named = named_addresses(family_of(route))
    return named[0][1] if named else route


def lane_addresses(address: str, found: Settings) -> list[str]:
    """The addresses of this rank's further lanes: one for each other interface that
    PYDIST_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) names, in ``address``'s family; empty when
    it names fewer than two or striping is off (PYDIST_STRIPE_BYTES=0)."""
    if not found.stripe_bytes:
        return []
    family = family_of(address)
    named = named_addresses(family) or []
    return [a for _, a in named if a != address and family_of(a) == family]
