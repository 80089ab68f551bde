"""One accepted connection's way to becoming a rank's, driven by its socket's readiness: the
first byte says TLS or not, then TLS (where this rank uses it), then the HELLOs of
:mod:`.hello`. Nothing here blocks; :mod:`.admission` calls ``advance`` whenever the socket
is ready (``events``) and decides what a refusal or a proof means.

A connection that does not prove it belongs raises :class:`Refusal`: why (logged by the
admission), and what to send it before closing (a ``refused`` HELLO that a real rank reports
on its side). After a TLS failure, or a plain reply to a TLS client, the connection
lingers: its write side is shut and what the peer still sends is read until it closes, so
that closing over unread bytes does not reset the connection before the peer read the
alert or the reply (a reset would make it retry instead of reporting the refusal).
"""
from __future__ import annotations

import enum
import selectors
import socket
import ssl
from collections.abc import Callable

from ...net.admission import GREETED, HEARD, SECURED
from ...net.tls import HANDSHAKE_RECORD, reason
from ..framing import HEADER_SIZE
from .hello import Acceptor, Refused, fields_of, hello_frame, hello_size, rank_of
from .mesh_tls import REQUIRES_TLS

_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)


class Refusal(Exception):
    """The connection does not belong: drop it (``why``; ``done``: how the log says it,
    dropped or refused) after sending ``reply``, lingering with ``linger`` (see the module)."""

    def __init__(self, why: str, done: str = "dropped", reply: bytes = b"", linger: bool = False):
        super().__init__(why)
        self.why, self.done, self.reply, self.linger = why, done, reply, linger


class Outcome(enum.Enum):
    WAIT = "wait for the socket"
    PROVEN = "proven, its last HELLO sent: hand it over"
    CLOSED = "refused and done with: close it"


class _Step(enum.Enum):
    FIRST = "its first byte"
    TLS = "its TLS handshake"
    HELLO = "its HELLOs"
    CLAIM = "the HELLO of a plain connection at a TLS rank (which rank it claims)"
    FAREWELL = "sending its refusal"
    LINGER = "reading until the refused peer closes"
    PROVEN = "sending its last HELLO"


class Handshake:
    """The handshake of ``sock`` (non-blocking, from ``where``): ``acceptor`` answers its
    HELLOs; ``tls``: this rank's server context (None: no TLS); ``progressed(self, step)``
    is told each step it reaches (net.admission's HEARD, SECURED, GREETED);
    ``proving(self)`` is called once it is proven, before its last HELLO is sent."""

    def __init__(self, sock: socket.socket, where, acceptor: Acceptor, tls: ssl.SSLContext | None,
                 progressed: Callable[[Handshake, int], None], proving: Callable[[Handshake], object]):
        self.sock, self.where, self.acceptor = sock, where, acceptor
        self.fd = sock.fileno()
        self._tls, self._progressed, self._proving = tls, progressed, proving
        self._step = _Step.FIRST
        self._inbox = bytearray()
        self._need = HEADER_SIZE  # bytes the frame being read has in all, as far as known
        self._out = bytearray()
        self._linger = False
        self._wants_write = False  # TLS wants the socket writable to go on

    @property
    def closing(self) -> bool:
        """Refused: only its farewell is left (its drop was logged)."""
        return self._step in (_Step.FAREWELL, _Step.LINGER)

    @property
    def events(self) -> int:
        """What to wait for on the socket."""
        return selectors.EVENT_WRITE if self._out or self._wants_write else selectors.EVENT_READ

    def advance(self) -> Outcome:
        """Do what the socket allows now. Raises Refusal, or OSError/ValueError (the
        connection failed or sent garbage: drop it)."""
        while True:
            if self._out and not self._flush():
                return Outcome.WAIT
            step = self._step
            if step is _Step.PROVEN:
                return Outcome.PROVEN
            if step is _Step.FAREWELL:
                if not self._linger:
                    return Outcome.CLOSED
                self.sock.shutdown(socket.SHUT_WR)  # an SSLSocket drops its TLS state: the rest is read raw
                self._step = _Step.LINGER
            if self._step is _Step.LINGER:
                return self._drain()
            if step is _Step.FIRST:
                self._first()
            elif step is _Step.TLS:
                self._secure()
            elif step is _Step.HELLO:
                self._hello()
            else:
                self._claim()
            if self._step is step and not self._out:
                return Outcome.WAIT

    def refuse(self, refusal: Refusal) -> Outcome:
        """Only ``refusal``'s farewell is left: send its reply (then linger); CLOSED once done."""
        self._step, self._linger, self._wants_write = _Step.FAREWELL, refusal.linger, False
        self._out = bytearray(refusal.reply)
        try:
            return self.advance()
        except (OSError, ValueError):
            return Outcome.CLOSED

    # -- the steps -----------------------------------------------------------------------------
    def _first(self) -> None:
        try:
            first = self.sock.recv(1, socket.MSG_PEEK)
        except _WOULD_BLOCK:
            return
        if not first:
            raise Refusal("connection closed before its first byte")
        self._progressed(self, HEARD)
        uses_tls = first[0] == HANDSHAKE_RECORD
        if uses_tls and self._tls is None:
            raise Refusal("it uses TLS and this rank does not", reply=hello_frame({"refused": "it does not use TLS"}),
                          linger=True)
        self._step = _Step.CLAIM if not uses_tls and self._tls is not None else _Step.TLS if uses_tls else _Step.HELLO

    def _secure(self) -> None:
        assert self._tls is not None  # only a TLS rank's connections get here
        if not isinstance(self.sock, ssl.SSLSocket):
            self.sock = self._tls.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self._wants_write = False
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._wants_write = True
            return
        except ssl.SSLError as error:
            raise Refusal(f"its TLS failed: {reason(error)}", linger=True) from None
        self._progressed(self, SECURED)
        self._step = _Step.HELLO

    def _hello(self) -> None:
        frame = self._frame()
        if frame is None:
            return
        try:
            reply = self.acceptor.on_hello(frame)
        except Refused as error:
            raise Refusal(f"authentication failed: {error}", "refused", error.reply) from None
        if self.acceptor.done:
            self._proving(self)  # out of the admission's reach before the peer can take it as established
            self._step = _Step.PROVEN
        else:
            self._progressed(self, GREETED)
        self._out += reply

    def _claim(self) -> None:
        """A plain connection at a TLS rank: its HELLO names the rank it claims (for the log)."""
        try:
            frame = self._frame()
            if frame is None:
                return
            claimed = f" (its HELLO claims rank {rank_of(fields_of(frame))})"
        except (OSError, ValueError):
            claimed = ""
        raise Refusal(f"it does not use TLS and this rank does{claimed}",
                      reply=hello_frame({"refused": REQUIRES_TLS}))

    def _drain(self) -> Outcome:
        """Read and drop what the refused peer sends; CLOSED at its end."""
        while True:
            try:
                if not self.sock.recv(65536):
                    return Outcome.CLOSED
            except _WOULD_BLOCK:
                return Outcome.WAIT

    # -- bytes ---------------------------------------------------------------------------------
    def _frame(self) -> bytes | None:
        """The next whole HELLO frame, read exactly (None: not all here yet). Raises
        FramingError (not a HELLO), ConnectionError (closed)."""
        self._wants_write = False
        while len(self._inbox) < self._need:
            try:
                chunk = self.sock.recv(self._need - len(self._inbox))
            except _WOULD_BLOCK:
                return None
            except ssl.SSLWantWriteError:
                self._wants_write = True
                return None
            if not chunk:
                raise ConnectionError("connection closed during handshake")
            self._inbox += chunk
            if len(self._inbox) == HEADER_SIZE:
                self._need = hello_size(bytes(self._inbox))
        frame, self._inbox, self._need = bytes(self._inbox), bytearray(), HEADER_SIZE
        return frame

    def _flush(self) -> bool:
        """Send what is queued; whether all of it went (TLS: a retry resends the same bytes)."""
        while self._out:
            try:
                del self._out[:self.sock.send(self._out)]
            except (*_WOULD_BLOCK, ssl.SSLWantWriteError):
                return False
        return True
