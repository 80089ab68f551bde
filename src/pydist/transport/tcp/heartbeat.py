"""The heartbeat (PYDIST_PEER_TIMEOUT): which peers are alive, and whether this rank still is.

Every ``beat`` seconds (a third of the timeout) the tcp I/O thread sends a BEAT frame on each
connection (each lane of each peer) it sent nothing on for that long, and declares dead a peer
it heard nothing from on a connection for the whole timeout. The BEAT comes from that thread,
which runs whatever the caller does: a process that cannot send it is stopped (SIGSTOP), stuck
outside Python, or gone with its host or network; on this rank's own host the kernel tells
(see .liveness): a silent process that runs is only slow, and is waited for. A peer whose data this rank stopped reading
(too much of it held, see ..flow) is alive by that very data and is not looked at; nor is one
whose bytes wait unread on its socket (a reader is late, the peer spoke). A rank whose own I/O
thread did not run for a while (its process stopped or starved, or the whole machine) does not
blame its peers for that silence. A rank learns that it was declared dead from its peers'
notices (a machine-wide stall silences everybody: nobody is declared dead then), or, when a
notice was lost (it sat unsent behind data the stopped rank's full buffers refused), from a
peer hanging up on it right after its own I/O thread was stalled for longer than the timeout
(``stalled``). Real time throughout: it measures how long processes have been silent.
"""
from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..framing import Kind, encode_frame
from .connection import Connection
from .liveness import verdict


class Beating(Protocol):
    """What the heartbeat needs of its transport (TcpTransport)."""

    rank: int

    @property
    def connections_now(self) -> list[Connection]: ...
    @property
    def closed(self) -> bool: ...
    def evict(self, conn: Connection, reason: str) -> None: ...
    records: dict[int, Any]  # mesh.PeerRecord of each rank


class Heartbeat:
    """One transport's heartbeat; ``beat`` is None when PYDIST_PEER_TIMEOUT is 0 (off)."""

    def __init__(self, transport: Beating, peer_timeout: float):
        self._transport = transport
        self.peer_timeout = peer_timeout
        #: seconds between two looks at the peers (and the longest a connection goes without a
        #: frame from this rank: a BEAT then); None: no heartbeat
        self.beat = peer_timeout / 3 if peer_timeout > 0 else None
        self._last_look = self._resumed = self._wait_began = time.monotonic()
        self._in_wait = False
        self._stall = self._stall_end = 0.0  # the last stall longer than the timeout: length, end
        self._frame = memoryview(encode_frame(Kind.BEAT, 0, 0, 0))

    def timed_wait(self, wait_io: Callable[[float | None], Any]) -> Any:
        """I/O thread: ``wait_io(beat)``, which returns within ``beat`` unless this process is
        stalled (stopped, stuck): a wait longer than the timeout is recorded (see ``stalled``).
        Only the wait counts: the thread may also block, alive, behind a caller reading sockets."""
        self._wait_began = time.monotonic()
        self._in_wait = True
        try:
            return wait_io(self.beat)
        finally:
            self._waited()

    def _waited(self) -> None:
        now = time.monotonic()
        self._in_wait = False
        if self.beat is not None and now - self._wait_began > self.peer_timeout:
            self._stall, self._stall_end = now - self._wait_began, now

    def stalled(self) -> float | None:
        """Seconds this process was stalled (stopped, stuck) for longer than the timeout, if it is
        just out of such a stall (the I/O thread is still in the wait the stall stretched, or left
        it less than a timeout ago): long enough for its peers to have declared it dead. None
        otherwise, or when off."""
        if self.beat is None:
            return None
        now = time.monotonic()
        if self._in_wait and now - self._wait_began > self.peer_timeout:
            return now - self._wait_began
        return self._stall if self._stall and now - self._stall_end < self.peer_timeout else None

    def tick(self) -> None:
        """I/O thread, after each wait: BEATs where due, silent peers declared dead."""
        beat, transport = self.beat, self._transport
        now = time.monotonic()
        if beat is None or now - self._last_look < beat or transport.closed:
            return
        if now - self._last_look > 2 * beat:  # this thread did not run for a while (this process was
            self._resumed = now  # stopped or starved): the peers' silence meanwhile is not theirs
        self._last_look = now
        for conn in transport.connections_now:  # every lane: one may lose its network, another not
            if conn.error is not None or conn.closing:
                continue
            silent = now - max(conn.last_heard, self._resumed)
            if silent > self.peer_timeout and conn.reading and not _unread(conn):
                process = verdict(transport.records[conn.peer].process, transport.records[transport.rank].process)
                if process != "alive":  # on this host, a live process is slow, never dead (see liveness)
                    transport.evict(conn, f"rank {conn.peer} on {conn.host} has not answered rank {transport.rank} "
                                          f"for {now - conn.last_heard:.1f} s (PYDIST_PEER_TIMEOUT "
                                          f"{self.peer_timeout:g} s): {_WHY[process]}")
                    continue
            if now - conn.last_sent >= beat:
                conn.send([self._frame], None)


_WHY = {"stopped": "its process is stopped (SIGSTOP, or a debugger holds it)",
        "gone": "its process is gone",
        None: "its process is stopped or stuck, or its host or the network between them is gone"}


def _unread(conn: Connection) -> bool:
    """Bytes wait on ``conn``'s socket that nobody read yet (a reader is late: the peer spoke)."""
    poll = select.poll()
    poll.register(conn.fd, select.POLLIN)
    return bool(poll.poll(0))
