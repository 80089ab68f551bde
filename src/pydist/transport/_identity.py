"""Who and where this rank is: host identity (for locality) and the address peers dial."""
from __future__ import annotations

import os
import socket

from .._settings import settings


def host_identity() -> str:
    """Ranks with equal identities share a host (memory, /dev/shm).

    PYDIST_HOST_ID overrides it (lets one machine pose as several). Otherwise: host name,
    boot id and network namespace, so network namespaces on one machine count as hosts.
    """
    override = settings().host_id
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


def _route_to(host: str, port: int) -> str:
    """The local address of the interface that reaches ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), port))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def advertise_address(store) -> str:
    """The IP address this rank listens on for peers.

    PYDIST_ADVERTISE_ADDR overrides it. Otherwise the local address of the connection to a
    TCPStore (the interface that reaches the master reaches the peers too); loopback for
    in-process stores; the host name's address for a FileStore.
    """
    override = settings().advertise_addr
    if override:
        return override
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if hasattr(store, "client_address"):
        return store.client_address()
    if type(store).__name__ == "HashStore":
        return "127.0.0.1"
    if hasattr(store, "host") and hasattr(store, "port"):  # torch's TCPStore
        return _route_to(store.host, store.port)
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
