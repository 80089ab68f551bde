"""How a waiting process asks an exporter to run the work its event waits for.

The stand-in's streams are lazy, so work another process waits on runs only when asked: the
waiter sends a datagram (the event's counters name and the epoch it waits for) to the
exporter's abstract Unix socket, named after its pid; the exporter's executor thread
(pydist.device.standin.executor) runs its streams up to that record. The waiter polls and asks
again at each poll, so a lost datagram only costs a poll. A datagram from anyone else can only
make work run early, which a GPU may do anyway: it is parsed strictly and otherwise ignored.
"""
from __future__ import annotations

import os
import socket
import struct

from .. import shm_files

_EPOCH = struct.Struct("!Q")
_sender: tuple[int, socket.socket] | None = None


def address(pid: int) -> str:
    """The abstract socket address of process ``pid``'s executor."""
    return f"\0pydist-device-standin-{pid}"


def send(pid: int, name: str, epoch: int) -> None:
    """Ask process ``pid`` to run its work up to the record ``epoch`` of event ``name``
    (best effort: no executor there, or a full queue, is ignored)."""
    _send(pid, name.encode() + _EPOCH.pack(epoch))


def wake(pid: int) -> None:
    """Wake process ``pid``'s executor (to see that it should end): an empty datagram."""
    _send(pid, b"")


def _send(pid: int, data: bytes) -> None:
    global _sender
    if _sender is None or _sender[0] != os.getpid():  # one socket per process (not the parent's)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _sender = (os.getpid(), sock)
    try:
        _sender[1].sendto(data, address(pid))
    except OSError:
        pass


def parse(data: bytes) -> tuple[str, int] | None:
    """(event counters name, epoch) of a nudge, or None for anything else."""
    if len(data) <= _EPOCH.size:
        return None
    try:
        name = shm_files.check_name(data[:-_EPOCH.size].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return name, _EPOCH.unpack(data[-_EPOCH.size:])[0]
