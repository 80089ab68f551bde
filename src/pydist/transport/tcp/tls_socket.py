"""A TLS connection with the plain socket calls the tcp transport makes (sendmsg, recv_into,
non-blocking), safe for one reading and one sending thread at once.

OpenSSL objects must not be used by two threads at once, so every TLS call holds a lock (one
record's work: a reader and a sender take turns record by record); the calls never block
(the socket is non-blocking). Without partial
writes OpenSSL wants a write it refused (want-write) retried with the same bytes: sends go in
pieces of at most ``PIECE`` bytes, and the transport retries from the same offset, so a retry
is the same piece. Reads drain what the TLS layer holds decrypted (it may hold a record's rest
while the socket shows nothing to read), so a short read means nothing is left.
"""
from __future__ import annotations

import socket
import ssl
import threading

PIECE = 256 << 10


class TlsSocket:
    """An ``ssl.SSLSocket`` (handshake done) seen as a non-blocking plain socket."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self._sock.setblocking(flag)

    def shutdown(self, how: int) -> None:
        """The TCP shutdown only: SSLSocket.shutdown would drop the TLS state, and the reads
        that follow (up to the peer's end) would see the raw records."""
        with self._lock:
            socket.socket.shutdown(self._sock, how)

    def close(self) -> None:
        self._sock.close()

    def sendmsg(self, parts: list[memoryview]) -> int:
        """Send from ``parts`` what TLS takes now, in pieces; BlockingIOError if nothing."""
        sent = 0
        if len(parts) > 1 and sum(part.nbytes for part in parts) <= PIECE:  # one record, not one per part
            parts = [memoryview(b"".join(parts))]
        for part in parts:
            part = part if part.format == "B" and part.ndim == 1 else part.cast("B")
            for start in range(0, part.nbytes, PIECE):
                try:
                    with self._lock:
                        sent += self._sock.send(part[start:start + PIECE])
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    if sent:
                        return sent
                    raise BlockingIOError from None
        return sent

    def recv_into(self, buffer) -> int:
        """Fill ``buffer`` with what TLS has decrypted or can decrypt now; 0 at the peer's
        end; BlockingIOError if nothing is there."""
        view, got = memoryview(buffer).cast("B"), 0
        while got < view.nbytes:
            try:
                with self._lock:
                    n = self._sock.recv_into(view[got:])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                if got:
                    return got
                raise BlockingIOError from None
            if n == 0:
                return got
            got += n
        return got
