"""IP addresses of either family: which family an address is, listening on it, the local
address of the route to a host, and a clear error when the machine cannot use a family."""
from __future__ import annotations

import ipaddress
import socket

from ..core.errors import DistNetworkError


def family_of(address: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal (``fe80::1%eth0`` too), AF_INET for anything else."""
    try:
        ipaddress.IPv6Address(address.split("%")[0])
        return socket.AF_INET6
    except ValueError:
        return socket.AF_INET


def has_ipv6() -> bool:
    """True if this host (network namespace) has an IPv6 address (IPv6 is not disabled)."""
    try:
        with open("/proc/net/if_inet6") as table:
            return bool(table.read().strip())
    except OSError:
        return socket.has_ipv6


def family_unusable(address: str, error: OSError) -> DistNetworkError | None:
    """A clear error if ``error`` came from using ``address``'s family where the host cannot
    (IPv6 disabled, no address of that family), else None."""
    if family_of(address) == socket.AF_INET6 and not has_ipv6():
        return DistNetworkError(f"cannot use the IPv6 address {address}: this host has no IPv6 (IPv6 is disabled "
                                f"or no interface has an IPv6 address): {error}. Use an IPv4 address or name, or "
                                "enable IPv6 (sysctl net.ipv6.conf.all.disable_ipv6=0)")
    return None


def listen(address: str, backlog: int) -> socket.socket:
    """A socket listening on ``address`` (either family), any free port; a clear
    DistNetworkError if the host cannot use the address."""
    try:
        return socket.create_server((address, 0), family=family_of(address), backlog=backlog)
    except OSError as error:
        raise (family_unusable(address, error)
               or DistNetworkError(f"cannot listen on {address} for peer connections: {error}")) from None


def route_to(host: str, port: int) -> str:
    """The local address of the interface that reaches ``host`` (no packet is sent), in the
    family the route uses; loopback if nothing reaches it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return "127.0.0.1"
    for family, kind, proto, _, target in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(target)
                return probe.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or a name resolved here) means this machine's loopback
    only; "" and the wildcards (0.0.0.0, ::) mean every interface, an unresolvable name is not."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None) if host else []
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def host_port(address: str, port: int) -> str:
    """``address:port``, with IPv6 addresses in brackets: ``[::1]:29500``."""
    return f"[{address}]:{port}" if family_of(address) == socket.AF_INET6 else f"{address}:{port}"
