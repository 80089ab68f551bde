"""One TCP connection to a peer: its send queue, and the frames being received from it.

Sends are tried at once from the caller's thread (small messages never wait for the I/O
thread); whatever the kernel does not take is queued and finished by the I/O thread. Reads
go through the peer's FrameReceiver; a payload whose receive is posted is read straight into
the destination (DIRECT_MIN and up). A connection that fails fails its queued sends and the
frame it was receiving, and tells its transport (``Owner``), which names the peer.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from typing import Protocol

from ...core.errors import EvictedError, PeerFailedError
from ..base import Request
from ..framing import Header, Kind, encode_frame
from ..goodbye import departure, read_payload, shutdown
from ..matching import Matcher
from ..receiver import FrameReceiver
from .tls_socket import TlsSocket

STAGING_BYTES = 64 * 1024  # a frame's first read: larger takes more payload through staging
DIRECT_MIN = 16 * 1024  # payload left at least this big: recv straight into the destination
#: the most of a reason a BYE notice carries (JSON-escaped, well inside framing.CONTROL_LIMITS)
NOTICE_CHARS = 4096
#: gloo's words for a peer that went away, which torch's tests and code written against gloo match.
CLOSED = "Connection closed by peer"


class Owner(Protocol):
    """What a connection needs of the transport that owns it (TcpTransport)."""

    rank: int
    matcher: Matcher
    peer_timeout: float  # PYDIST_PEER_TIMEOUT, for the wording of a timed-out peer

    def send_failed(self, conn: Connection, error: BaseException) -> None: ...
    def want_write(self, conn: Connection) -> None: ...
    def should_pause(self, conn: Connection) -> bool: ...
    def peer_aborted(self, peer: int, group: int, payload: bytes) -> None: ...
    def peer_lost(self, peer: int, error: BaseException) -> None: ...
    def reading_elsewhere(self) -> bool: ...
    def stalled(self) -> float | None: ...


def notice_payload(reason: str) -> bytes:
    """A BYE notice's payload: ``reason``, clipped so that the frame stays within its limit."""
    return json.dumps({"reason": reason[:NOTICE_CHARS]}).encode()


class Outgoing:
    __slots__ = ("parts", "request")

    def __init__(self, parts: list[memoryview], request: Request | None):
        self.parts = parts
        self.request = request

    def advance(self, sent: int) -> bool:
        """Drop ``sent`` bytes from the front; True when everything is sent."""
        while sent and self.parts:
            head = self.parts[0]
            if sent >= head.nbytes:
                sent -= head.nbytes
                self.parts.pop(0)
            else:
                self.parts[0] = head[sent:]
                sent = 0
        while self.parts and self.parts[0].nbytes == 0:
            self.parts.pop(0)
        return not self.parts


class Connection:
    """The socket to one peer: its send queue, and the frame being received from it."""

    def __init__(self, transport: Owner, peer: int, sock: socket.socket | TlsSocket, host: str):
        self.transport = transport
        self.peer = peer
        self.host = host
        self.sock = sock
        self.fd = sock.fileno()
        sock.setblocking(False)
        self.receiver = FrameReceiver(peer, transport.matcher, self._control)
        self.staging = bytearray(STAGING_BYTES)
        self.staging_view = memoryview(self.staging)
        self.send_lock = threading.Lock()
        self.queue: deque[Outgoing] = deque()
        self.want_write = False
        self.write_armed = False  # the I/O thread waits for the socket to be writable
        self.closing = False  # close(): read to the peer's EOF, paused or not
        self.bye_received = False
        self.evicted: dict | None = None  # the peer's BYE said it declared this rank dead
        self.exited: str | None = None  # the peer's BYE said its process is ending: why ("": no failure seen)
        self.after: str | None = None  # the peer's BYE said it shut down after this failure
        self.notified = False  # this rank told the peer it declared it dead
        self.error: BaseException | None = None
        # real time (the heartbeat's, see TcpTransport._check_liveness): the last bytes in and out
        self.last_heard = self.last_sent = time.monotonic()

    # -- sending (any thread) -------------------------------------------------------------
    def send(self, parts: list[memoryview], request: Request | None) -> None:
        """Send now what the kernel takes; queue the rest for the I/O thread."""
        with self.send_lock:
            if self.error is not None:
                if request is not None:
                    request.complete(self.error)
                return
            outgoing = Outgoing(parts, request)
            self.last_sent = time.monotonic()
            if not self.queue:
                try:
                    done = outgoing.advance(self.sock.sendmsg(outgoing.parts))
                except BlockingIOError:
                    done = False
                except OSError as error:
                    self.transport.send_failed(self, error)
                    if request is not None:
                        request.complete(self._failure(error))
                    return
                if done:
                    if request is not None:
                        request.complete()
                    return
            self.queue.append(outgoing)
            wake = not self.want_write
            self.want_write = True
        if wake:
            self.transport.want_write(self)

    def flush(self) -> bool:
        """I/O thread: send queued bytes; True when the queue is empty."""
        with self.send_lock:
            while self.queue:
                outgoing = self.queue[0]
                try:
                    sent = self.sock.sendmsg(outgoing.parts)
                except BlockingIOError:
                    return False
                if not outgoing.advance(sent):
                    return False
                self.queue.popleft()
                if outgoing.request is not None:
                    outgoing.request.complete()
            self.want_write = False
            return True

    @property
    def reading(self) -> bool:
        """Not paused (too much unexpected data held from this peer, see ..flow), or closing."""
        return self.closing or self.peer not in self.transport.matcher.throttle.paused

    def idle(self) -> bool:
        with self.send_lock:
            return not self.queue or self.error is not None

    # -- receiving (I/O thread) -----------------------------------------------------------
    def on_readable(self) -> None:
        """Read what is available; raises OSError/EOFError on a broken peer, FramingError (or
        MemoryError) on a frame this rank cannot take (see receiver)."""
        receiver = self.receiver
        while True:
            direct = receiver.direct_view(DIRECT_MIN)
            try:
                n = self.sock.recv_into(direct if direct is not None else self.staging)
            except BlockingIOError:
                return
            if n == 0:
                raise EOFError
            self.last_heard = time.monotonic()
            if direct is not None:
                receiver.direct_done(n)
            else:
                receiver.feed(self.staging_view[:n])
            if receiver.between_frames() and self.transport.should_pause(self):
                return
            if direct is None and n < STAGING_BYTES:
                return

    def notify(self, reason: str) -> None:
        """Tell the peer it was declared dead (a BYE with the reason; best effort: a dead peer
        does not read it, a stopped one does on waking); once."""
        if not self.notified:
            self.notified = True
            self.send([memoryview(encode_frame(Kind.BYE, 0, 0, 0, notice_payload(reason)))], None)

    def _control(self, header: Header, payload: bytes) -> None:
        if header.kind == Kind.BYE:
            self.bye_received = True
            said = read_payload(payload)
            if "exit" in said:
                self.exited = str(said["exit"])
            elif "after" in said:
                self.after = str(said["after"])
            elif said:
                self.evicted = said
        elif header.kind == Kind.ABORT:
            self.transport.peer_aborted(self.peer, header.group, payload)

    def peer_failed(self) -> bool:
        """The connection ended because the peer failed: it crashed or was cut off (no BYE),
        or its process ended on an error; not a shutdown, an exit without a failure, this
        rank's own closing, nor the peer declaring this rank dead."""
        if self.closing or self.evicted is not None:
            return False
        return bool(self.exited) if self.exited is not None else not self.bye_received

    def _failure(self, cause: BaseException | None) -> PeerFailedError | EvictedError:
        me = self.transport.rank
        if self.evicted is not None:
            return EvictedError(f"rank {self.peer} on {self.host} declared rank {me} dead and went on without it: "
                                f"{self.evicted.get('reason', '')}", rank=self.peer, host=self.host)
        stall = self.transport.stalled() if not self.bye_received else None
        if stall is not None:  # it hung up while this process was stopped: the notice was lost
            return EvictedError(f"rank {me} was stopped or stuck for {stall:.1f} s, longer than PYDIST_PEER_TIMEOUT, "
                                f"and rank {self.peer} on {self.host} hung up on it meanwhile: its peers declared it "
                                "dead and went on without it", rank=self.peer, host=self.host)
        if self.exited is not None:
            text = f"{departure(f'rank {self.peer} on {self.host}', me, self.exited)}: {CLOSED}"
        elif self.bye_received:
            text = f"{shutdown(f'rank {self.peer} on {self.host}', me, self.after)}: {CLOSED}"
        else:
            text = (f"rank {self.peer} on {self.host} closed its connection to rank {me} "
                    f"unexpectedly: its process exited or was killed, or the network failed: {CLOSED}")
            if cause is not None and not isinstance(cause, EOFError):
                text += f" ({type(cause).__name__}: {cause})"
        error = PeerFailedError(text, rank=self.peer, host=self.host)
        error.__cause__ = cause if isinstance(cause, OSError) else None
        return error

    def fail(self, cause: BaseException | None, error: BaseException | None = None) -> None:
        """Mark the peer gone: fail queued sends, the receive in progress, and later receives
        (with ``error``, else one made from ``cause``)."""
        with self.send_lock:
            if self.error is not None:
                return
            self.error = error or self._failure(cause)
            queued = list(self.queue)
            self.queue.clear()
        for outgoing in queued:
            if outgoing.request is not None:
                outgoing.request.complete(self.error)
        if not self.transport.reading_elsewhere():  # else that reader abandons it when it stops
            self.receiver.abandon(self.error)
        self.transport.peer_lost(self.peer, self.error)
