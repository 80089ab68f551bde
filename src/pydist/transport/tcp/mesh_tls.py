"""Mutual TLS on the mesh's connections (PYDIST_TLS_*, see :mod:`pydist.net.tls`), before the
HELLO exchange, and the refusals that name the peer on both sides.

The connecting rank starts TLS; a certificate the acceptor rejects (an alert), or an acceptor
that does not use TLS when this rank does (or the reverse), fails the connector at once with
an error naming the other rank and its host, never retried: a job's ranks must agree. A
connection closed without an alert is retried: the acceptor cuts handshakes past its cap. The accepting
rank tells a TLS connection from a plain one by its first byte (a TLS record starts with
0x16, a HELLO frame with 'P'); it answers a mismatched connection with a plain HELLO
``refused`` the connector reports, and drops it and any TLS failure, logged, never raised: a
connection that does not prove it holds a certificate of the job's CA is not a rank yet, so
it can neither abort the acceptor nor have a rank blamed for it (see admission.py).
"""
from __future__ import annotations

import socket
import ssl

from ...core.errors import DistNetworkError
from ...net.tls import HANDSHAKE_RECORD, reason
from .tls_socket import TlsSocket

_NOT_TLS = ("it does not use TLS and this rank does (set PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA on "
            "every rank, or on none)")


#: What a TLS rank's refused HELLO tells a plain connector (it reports "it refused this rank: ...").
REQUIRES_TLS = ("it requires TLS and this rank does not use it (set PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA "
                "on every rank, or on none)")


class TlsRefused(DistNetworkError):
    """TLS failed between two ranks of the job: a configuration to fix, not to retry."""


def peer_uses_tls(sock: socket.socket) -> bool:
    """Whether the connection's first byte (peeked, not consumed) starts a TLS handshake."""
    first = sock.recv(1, socket.MSG_PEEK)
    if not first:
        raise ConnectionError("connection closed before its first byte")
    return first[0] == HANDSHAKE_RECORD


def refused_by(rank: int, peer: int, where: str, error: OSError) -> TlsRefused:
    """The connector's error for a TLS failure with ``peer``: an alert or a certificate error
    (a connection closed without an alert is retried instead: the acceptor may have cut it,
    see mesh.connect_to)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return TlsRefused(f"rank {rank} refused the certificate of rank {peer} at {where}: {reason(error)} "
                          "(is it signed by the CA in this rank's PYDIST_TLS_CA?)")
    why = reason(error)
    hint = _NOT_TLS if "wrong version" in why or "record" in why else "it rejected this rank's certificate?"
    return TlsRefused(f"rank {peer} at {where} refused the TLS connection of rank {rank}: {why} ({hint})")


def secured(sock: socket.socket) -> socket.socket | TlsSocket:
    """The socket the transport uses: a TLS one adapted to plain calls, else itself."""
    return TlsSocket(sock) if isinstance(sock, ssl.SSLSocket) else sock
