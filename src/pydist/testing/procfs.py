"""What /proc says about a job's processes, for the tests and tools that look at a running
job as another local user would (``ss -ltn``, ``ps``): their listening TCP sockets and
their descendants. Linux only; a process that is gone, or whose /proc entries this user
may not read, counts as having none."""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address (little-endian 32-bit words) as text (IPv4-mapped as IPv4)."""
    raw = bytes.fromhex(hex_address)
    address = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


def listening(pids: Iterable[int], excluding: Iterable[int] = ()) -> list[tuple[str, int]]:
    """The (address, port) of each TCP socket the processes ``pids`` listen on, but for those
    a process of ``excluding`` holds too (inherited from a launcher, say)."""
    inodes = set().union(set(), *map(socket_inodes, pids)) - set().union(set(), *map(socket_inodes, excluding))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    found.append((_address(address), int(port, 16)))
    return found


def family(root: int) -> set[int]:
    """``root`` and its descendants (from the parent of every process in /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found
