"""This host's network interfaces and the ones the user names (PYDIST_SOCKET_IFNAME, NCCL's
syntax; else GLOO_SOCKET_IFNAME, gloo's: exact names).

NCCL's syntax: a comma list of name prefixes (``eth,ib``); ``^`` before the list excludes
what matches (``^docker,lo``); ``=`` before the list (after a ``^``) makes the names exact
(``=eth0``, ``^=docker0``). Interfaces come in the list's order, then the host's. An
exclusion leaves out loopback too unless nothing else is left (peers cannot dial it).
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from ..core.errors import InterfaceError
from ..core.settings import settings

_SIOCGIFADDR = 0x8915
_LINK_LOCAL_SCOPE = 0x20


@dataclass(frozen=True)
class Interface:
    """A network interface and its usable addresses (IPv4, then global/site IPv6)."""
    name: str
    addresses: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(self.addresses) or 'no address'})"


def _ipv4_of(name: str) -> list[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return []
    return [socket.inet_ntoa(answer[20:24])]


def _ipv6_by_name() -> dict[str, list[str]]:
    """Non-link-local IPv6 addresses per interface, from /proc/net/if_inet6."""
    found: dict[str, list[str]] = {}
    try:
        with open("/proc/net/if_inet6") as table:
            rows = [line.split() for line in table]
    except OSError:
        return found
    for row in rows:
        if len(row) == 6 and int(row[3], 16) != _LINK_LOCAL_SCOPE:
            found.setdefault(row[5], []).append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(row[0])))
    return found


def interfaces() -> list[Interface]:
    """Every interface of this host (network namespace), in the kernel's order."""
    ipv6 = _ipv6_by_name()
    return [Interface(name, tuple(_ipv4_of(name) + ipv6.get(name, []))) for _, name in socket.if_nameindex()]


def requested() -> tuple[str, str] | None:
    """(variable, spec) naming interfaces: PYDIST_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME read
    as exact names; None if neither is set."""
    own = settings().socket_ifname
    if own:
        return "PYDIST_SOCKET_IFNAME", own
    gloo = os.environ.get("GLOO_SOCKET_IFNAME", "").strip()
    return ("GLOO_SOCKET_IFNAME", "=" + gloo) if gloo else None


def _loopback(interface: Interface) -> bool:
    return bool(interface.addresses) and all(ipaddress.ip_address(a).is_loopback for a in interface.addresses)


def matching(spec: str, found: list[Interface]) -> list[Interface]:
    """The interfaces of ``found`` that ``spec`` (NCCL's syntax) selects."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    names = [name.strip() for name in (spec[1:] if exact else spec).split(",") if name.strip()]

    def hit(interface: Interface, name: str) -> bool:
        return interface.name == name if exact else interface.name.startswith(name)

    if exclude:
        kept = [i for i in found if not any(hit(i, name) for name in names)]
        return [i for i in kept if not _loopback(i)] or kept
    return [i for name in names for i in found if hit(i, name)]


def named_addresses(family: socket.AddressFamily) -> list[tuple[str, str]] | None:
    """(interface, address) for each interface the user names, preferring ``family`` and
    falling back to the other; None if none is named. InterfaceError (a DistNetworkError) if
    the names match no interface with an address, listing the ones that exist."""
    request = requested()
    if request is None:
        return None
    variable, spec = request
    found = interfaces()
    chosen = []
    for interface in matching(spec, found):
        preferred = [a for a in interface.addresses if (":" in a) == (family == socket.AF_INET6)]
        if preferred or interface.addresses:
            chosen.append((interface.name, (preferred or list(interface.addresses))[0]))
    if not chosen:
        raise InterfaceError(f"{variable}={spec.removeprefix('=') if variable.startswith('GLOO') else spec} "
                               f"matches no interface with an address on {socket.gethostname()}; its interfaces: "
                               f"{', '.join(map(str, found)) or 'none'}")
    return chosen


def interface_of(address: str) -> str:
    """The name of the local interface holding ``address``, or "" if none does."""
    for interface in interfaces():
        if address.split("%")[0] in interface.addresses:
            return interface.name
    return ""
