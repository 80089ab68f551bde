"""What answers at the rendezvous endpoint: a pydist store that takes this job's token, another
one, or a program that is not a pydist store at all.

One connection opens the store's stream (its authenticated opening when the job has a token,
else the plain hello; inside TLS when the job uses it) and must be answered within
:data:`.turn.ANSWER_SECONDS`, where a pydist store answers within milliseconds. Without this
look, a program that accepts connections and says nothing held the launcher for the whole
rendezvous read timeout (60 s) before "did not answer authentication in time". The look runs
the whole opening, so a pydist store sees an ordinary client come and go and logs nothing.
"""
from __future__ import annotations

import contextlib
import socket
import ssl
import time
from dataclasses import dataclass

from ..net.auth import AuthenticationError
from ..store._auth_opening import ClientOpening
from ..store._protocol import (
    AUTH_FLAG,
    HELLO_BYTES,
    VERSION_FIELD,
    WIRE_MAGIC,
    AuthRequired,
    ProtocolError,
    ResponseParser,
    hello,
)
from . import turn

#: Verdicts: a pydist store that opened a stream with this job (or nothing answered the
#: connection, or a TLS error the store's client words better): go on as a client.
STORE, UNKNOWN = "store", "unknown"
#: Not a pydist store: nothing came within the time, or bytes that are not a store stream.
SILENT, FOREIGN = "silent", "foreign"
#: A pydist store that refused this job's credentials (see ``Probe.store_has_token``).
REFUSED = "refused"


@dataclass(frozen=True)
class Probe:
    """The verdict about what answers at an endpoint; ``detail`` says why, in words."""

    verdict: str
    detail: str = ""
    store_has_token: bool = False  # REFUSED: the store requires a token (else it has none)


def probe_store(host: str, port: int, token: bytes | None, tls: ssl.SSLContext | None,
                seconds: float | None = None) -> Probe:
    """Open one connection to ``host:port`` and run the store's opening on it, within
    ``seconds`` (default :data:`.turn.ANSWER_SECONDS`); the verdict."""
    seconds = turn.ANSWER_SECONDS if seconds is None else seconds
    try:
        sock = socket.create_connection((host, port), timeout=seconds)
    except OSError as exc:
        return Probe(UNKNOWN, f"cannot connect: {exc}")
    deadline = time.monotonic() + seconds
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        try:
            if tls is not None:
                sock = tls.wrap_socket(sock, do_handshake_on_connect=False)
                stack.callback(sock.close)
                sock.do_handshake()
            return _opening(sock, token, deadline)
        except TimeoutError:
            return Probe(SILENT, f"it did not answer a pydist store's opening within {seconds:g}s")
        except OSError as exc:  # closed, reset, a TLS refusal: the store's own client says it best
            return Probe(UNKNOWN, str(exc))


def _opening(sock: socket.socket, token: bytes | None, deadline: float) -> Probe:
    """Run the client's side of the store's opening (see :mod:`pydist.store._protocol`)."""
    opening = ClientOpening(token) if token else None
    parser = ResponseParser()
    sock.sendall(opening.start() if opening is not None else hello())
    received = bytearray()
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        data = sock.recv(4096)
        if not data:
            return Probe(UNKNOWN, "it closed the connection")
        received += data
        try:
            if opening is None:
                parser.feed(data)
                parser.next()
                if parser.handshaken:
                    return Probe(STORE)
                continue
            reply = opening.feed(data)
            if reply:
                sock.sendall(reply)
            if opening.done:
                return Probe(STORE)
        except (AuthenticationError, ProtocolError) as exc:
            if bytes(received[:len(WIRE_MAGIC)]) != WIRE_MAGIC:
                return Probe(FOREIGN, f"it answered {bytes(received[:16])!r}, not a pydist store's hello")
            if len(received) < HELLO_BYTES or not isinstance(exc, (AuthenticationError, AuthRequired)):
                return Probe(FOREIGN, str(exc))
            version = VERSION_FIELD.unpack_from(received, len(WIRE_MAGIC))[0]
            return Probe(REFUSED, str(exc), store_has_token=bool(version & AUTH_FLAG))

