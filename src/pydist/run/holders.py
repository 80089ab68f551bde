"""Who holds a socket of this machine: the process behind a listening TCP port or an abstract
Unix socket, as far as ``/proc`` lets this user see. Used only to word an error: the owner's
uid of a TCP listener is visible to everyone (``/proc/net/tcp``); its process id only when this
user may read that process's descriptors (its own processes, or root). Off Linux nothing is known.
"""
from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
from dataclasses import dataclass

#: The state of a listening socket in /proc/net/tcp and tcp6.
_LISTEN = "0A"


@dataclass(frozen=True)
class Holder:
    """A process holding a socket; ``pid`` and ``uid`` are None where they are not visible."""

    pid: int | None = None
    uid: int | None = None

    def describe(self) -> str:
        """``pid 123 ('nc') of uid 1001 (bob)``, with what is known; "an unknown process" if nothing."""
        parts = []
        if self.pid is not None:
            name = process_name(self.pid)
            parts.append(f"pid {self.pid}" + (f" ({name!r})" if name else ""))
        if self.uid is not None:
            user = user_name(self.uid)
            parts.append(f"uid {self.uid}" + (f" ({user})" if user else ""))
        return " of ".join(parts) if parts else "an unknown process"


def process_name(pid: int) -> str | None:
    """The command name of process ``pid`` (``/proc/<pid>/comm``), None where it is not readable."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip() or None
    except OSError:
        return None


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def process_uid(pid: int) -> int | None:
    """The real uid of process ``pid`` (``/proc/<pid>/status``), None where it is not readable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp(6) writes it: 32-bit words in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _same_or_wildcard(listening: ipaddress.IPv4Address | ipaddress.IPv6Address, wanted: str) -> bool:
    if listening.is_unspecified:
        return True
    mapped = getattr(listening, "ipv4_mapped", None)
    try:
        return ipaddress.ip_address(wanted.split("%")[0]) in (listening, mapped)
    except ValueError:
        return True  # a host name: any listener on the port may be it


def tcp_listener(address: str, port: int) -> Holder | None:
    """The holder of the TCP socket listening on ``address:port`` (or on every address at
    ``port``), None if none is found."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                lines = rows.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and _same_or_wildcard(_address(local), address):
                return Holder(_pid_of_socket(int(fields[9])), int(fields[7]))
    return None


def unix_listener(name: str) -> Holder | None:
    """The holder of the abstract Unix socket ``name`` (with its leading NUL), None if none is
    found; its uid only where its pid is visible."""
    shown = "@" + name.lstrip("\0")
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as rows:
            lines = rows.readlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == shown:
            pid = _pid_of_socket(int(fields[6]))
            return Holder(pid, process_uid(pid) if pid is not None else None)
    return None


def _pid_of_socket(inode: int) -> int | None:
    """A process holding socket ``inode`` among those whose descriptors this user may read."""
    if not inode:
        return None
    target = f"socket:[{inode}]"
    try:
        entries = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return None
    for pid in entries:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # exited, or not ours to read
        for fd in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return int(pid)
            except OSError:
                continue
    return None


def peer_of(sock: socket.socket) -> Holder:
    """The process at the other end of a connected Unix socket (``SO_PEERCRED``: its pid and
    uid when it called listen or connect)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return Holder(pid or None, uid)
