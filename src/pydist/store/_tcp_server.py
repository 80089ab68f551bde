"""TCPStore's server: one daemon thread per (host, port) serving every client connection.

The thread runs a ``selectors`` loop around a sans-IO
:class:`~pydist.store._service.StoreService` (no thread per client). It binds only the
address it is given, answers blocking requests when their keys arrive or ``timeout`` at
their deadline, and drops only a connection that sends garbage, fails, or breaks the
admission policy below (logging one warning: a server's first few in full, then one summary
line per interval, see :class:`~pydist.net.log_limit.LogLimit`); an internal error costs
that connection, never the server. A client that does not read its answers is not read from until they drain
(``OUTPUT_LIMIT``). Multi-tenant masters of one process share the server of a (host, port)
through :func:`acquire_server` / :func:`release_server`; the last release stops it.

With TLS (a server ``ssl.SSLContext``, see :mod:`pydist.net.tls`) a connection reaches the
service only after its TLS handshake, run in the same loop without blocking: the first byte
is peeked; anything but a TLS record is refused (a pydist client gets its hello and an
``error`` answer saying TLS is required; a torch client, which cannot do TLS, is just
closed), else the socket is wrapped (``do_handshake_on_connect=False``) and ``do_handshake``
is retried on readiness (WantRead/WantWrite). A handshake that fails (a certificate the CA did
not sign, expired) drops the connection with a warning. A TLS socket gives one record per
``recv``: it is read until WantRead, or until ``READ_BYTES`` were read and its decrypted
buffer is empty (``pending()``: bytes left there would never make the socket readable again).

Until a connection has proven it may use the store (its TLS handshake, then its
authenticated opening with a token, its hello without; see ``StoreService.proven``) it is
held to the one admission policy of every pydist listener (:mod:`pydist.net.admission`):
dropped PYDIST_HANDSHAKE_TIMEOUT after it was accepted, talking or not; past the cap, one
more drops the connection with the least progress (the oldest of those). Connections are
accepted by :func:`pydist.net.accepting.accept_ready` (a batch per wake-up, so that a burst's
first bytes are read before more come in; out of file descriptors, the unproven connection
the policy names first is dropped to accept again). What they may make the server hold in
memory is bounded too (:mod:`._limits`).
"""
from __future__ import annotations

import hmac
import itertools
import logging
import os
import selectors
import socket
import ssl
import threading
from contextlib import suppress
from typing import Any

from ..core import deadline as _deadline
from ..core.errors import DistNetworkError, DistStoreError
from ..core.settings import settings
from ..net.accepting import accept_ready
from ..net.addresses import family_unusable, host_port
from ..net.admission import GREETED, HEARD, SECURED, Gate
from ..net.log_limit import LogLimit
from ..net.tls import HANDSHAKE_RECORD
from ..net.tls import reason as tls_reason
from ._protocol import WIRE_MAGIC, Message, encode_response, error_code, hello
from ._service import OUTPUT_LIMIT, StoreService

logger = logging.getLogger("pydist.store")
#: Bytes read from one connection per readiness event.
READ_BYTES = 262144
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_TLS_REQUIRED = DistStoreError("this store requires TLS: set PYDIST_TLS_CERT, PYDIST_TLS_KEY and PYDIST_TLS_CA "
                               "for this client too")


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host`` (resolved; IPv4 preferred) and ``port`` (0: any)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise DistNetworkError(f"TCPStore: cannot resolve host {host!r}: {e}") from e
    family, kind, proto, _, address = min(infos, key=lambda info: info[0] != socket.AF_INET)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(4096)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise (family_unusable(str(address[0]), e)
               or DistNetworkError(f"TCPStore: cannot listen on {host_port(host, port)}: {e}")) from e
    return sock


def _discard_input(sock: socket.socket) -> None:
    """Drop the bytes the peer sent and nobody read (raw, under TLS too): closing over them
    resets the connection, and the peer may lose the refusal or TLS alert sent just before."""
    with suppress(OSError):
        for _ in range(16):
            if not os.read(sock.fileno(), READ_BYTES):
                return


class _Peer:
    __slots__ = ("cid", "sock", "address", "out", "events", "held", "securing")

    def __init__(self, cid: int, sock: socket.socket, address: Any, securing: bool):
        self.cid, self.sock, self.address = cid, sock, address
        self.out = bytearray()
        self.events = selectors.EVENT_READ
        self.held = False  # the service may be holding requests back (OUTPUT_LIMIT)
        self.securing = securing  # in its TLS handshake


class Server:
    """The store server of one (host, port): a thread, its sockets, its service."""

    def __init__(self, host: str, port: int, auth_token: bytes | None, tls: ssl.SSLContext | None = None):
        self._listener = _listen(host, port)
        self.host, self.port = host, self._listener.getsockname()[1]
        self.users = 1
        self.auth_token, self.tls = auth_token, tls
        self._service = StoreService(auth_token)
        self._warnings = LogLimit(logger, f"store server {self.host}:{self.port}: clients dropped")
        self._peers: dict[int, _Peer] = {}
        self._gate: Gate[int] = Gate(settings().handshake_timeout)  # connections not proven yet
        self._drained: set[int] = set()  # held connections whose answers went out
        self._ids = itertools.count()
        self._stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        for sock in (self._listener, self._wake_r):
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name=f"pydist-store-server-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close every socket (clients see the connection close)."""
        self._stopping = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._thread.join(10.0)  # real time: a bound on a thread told to stop, not a timeout
        self._wake_w.close()

    def stats(self) -> dict[str, Any]:
        """The service's counts (requests by name, connections), as of now (see ServiceStats)."""
        return self._service.stats.snapshot()

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._select():
                    self._on_event(key, mask)
                now = _deadline.now()
                self._service.expire(now)
                for cid in self._gate.late(now):
                    self._limit(cid, self._gate.late_reason())
                self._deliver()
                self._resume_drained()
        except Exception:  # pragma: no cover - a bug; keep the process alive and say so
            logger.exception("store server %s:%d stopped on an internal error", self.host, self.port)
        finally:
            for peer in list(self._peers.values()):
                peer.sock.close()
            self._listener.close()
            self._wake_r.close()
            self._sel.close()
            self._warnings.flush()

    def _timeout(self) -> float | None:
        """Seconds until a parked request or an unproven connection is due (None: nothing is)."""
        due = [d for d in (self._service.next_deadline(), self._gate.due()) if d is not None]
        return max(0.0, min(due) - _deadline.now()) if due else None

    def _select(self) -> list[tuple[selectors.SelectorKey, int]]:
        """The ready sockets, waiting until one is or the next deadline passes, on the current
        clock (a fake one may let a parked request's timeout pass at once). With nothing due,
        a plain wait for the sockets: an idle server waits on no clock."""
        timeout = self._timeout()
        if timeout is None:
            return self._sel.select(None)
        events: list[tuple[selectors.SelectorKey, int]] = []

        def ready(seconds: float | None) -> bool:
            events.extend(self._sel.select(seconds))
            return bool(events)

        _deadline.timed_wait(ready, timeout)
        return events

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.fileobj is self._listener:
            self._accept()
        elif key.fileobj is self._wake_r:
            self._wake_r.recv(4096)
        else:
            peer: _Peer = key.data
            try:
                if peer.securing:
                    self._handshake(peer)
                    return
                if mask & selectors.EVENT_READ and peer.cid in self._peers:
                    self._read(peer)
                if mask & selectors.EVENT_WRITE and peer.cid in self._peers:
                    self._flush(peer)
            except Exception as e:  # a bug costs one connection, never the server
                self._warnings.warning("store server %s:%d: error serving %s", self.host, self.port, peer.address,
                                       exc_info=True)
                if peer.cid in self._peers:
                    self._drop(peer, f"internal error: {e!r}")

    def _accept(self) -> None:
        accept_ready(self._listener, self._admit, self._gate, self._limit, self._accept_failed)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        """A new connection: held to the admission policy until proven (see the module)."""
        peer = _Peer(next(self._ids), sock, address, securing=self.tls is not None)
        self._peers[peer.cid] = peer
        self._sel.register(sock, selectors.EVENT_READ, peer)
        now = _deadline.now()
        if self.tls is None:
            self._service.open(peer.cid, now)
        for cid in self._gate.admit(peer.cid, now):
            self._limit(cid, self._gate.cap_reason())

    def _accept_failed(self, error: OSError) -> None:
        self._warnings.warning("store server %s:%d: accept failed: %s (out of file descriptors? see ulimit -n)",
                               self.host, self.port, error)

    def _limit(self, cid: int, why: str) -> None:
        """Drop an unproven connection the admission policy names (late, past the cap, or
        for a new one when out of file descriptors)."""
        self._service.stats.dropped_for_limits += 1
        self._drop(self._peers[cid], f"over a limit: {why}")

    def _progress(self, peer: _Peer) -> None:
        """After a read: the connection's progress, or its proof, as the policy sees it."""
        if peer.cid in self._gate and peer.cid in self._peers:
            if self._service.proven(peer.cid):
                self._gate.prove(peer.cid)
            else:
                self._gate.progress(peer.cid, GREETED if self._service.greeted(peer.cid) else HEARD)

    def _handshake(self, peer: _Peer) -> None:
        """Advance a TLS connection's opening (see the module docstring); once done, the
        service opens it and reads what already came."""
        try:
            sock = peer.sock if isinstance(peer.sock, ssl.SSLSocket) else self._wrap(peer)
            if sock is None:
                return
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(peer, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(peer, selectors.EVENT_WRITE)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self._drop(peer, f"TLS handshake failed: {tls_reason(e)}")
        else:
            peer.securing = False
            self._gate.progress(peer.cid, SECURED)
            self._service.open(peer.cid, _deadline.now())
            self._watch(peer, selectors.EVENT_READ)
            self._read(peer)

    def _wrap(self, peer: _Peer) -> ssl.SSLSocket | None:
        """Wrap a connection whose first byte starts a TLS handshake; refuse any other (None)."""
        assert self.tls is not None  # only TLS servers have handshakes
        first = peer.sock.recv(1, socket.MSG_PEEK)
        if first:
            self._gate.progress(peer.cid, HEARD)
        if first == bytes([HANDSHAKE_RECORD]):
            self._sel.unregister(peer.sock)
            sock = peer.sock = self.tls.wrap_socket(peer.sock, server_side=True, do_handshake_on_connect=False)
            self._sel.register(sock, peer.events, peer)
            return sock
        farewell = b""
        if not first:
            why = None  # closed before sending a byte
        elif first == WIRE_MAGIC[:1]:
            why = "not TLS: a pydist client without PYDIST_TLS_* (this store requires TLS)"
            farewell = hello() + encode_response(Message("error", (error_code(_TLS_REQUIRED), str(_TLS_REQUIRED))))
        elif first == b"\0":
            why = "not TLS: a torch TCPStore client, refused because this store requires TLS (torch's cannot)"
        else:
            why = f"not TLS: its first byte {first!r} does not start a TLS handshake"
        self._farewell(peer, farewell)
        self._drop(peer, why)
        return None

    def _read(self, peer: _Peer) -> None:
        """Receive up to READ_BYTES of what ``peer`` sent (one ``recv``; a TLS socket, which
        gives a record per call, until WantRead, or the budget is spent and no decrypted byte
        is left inside the SSL object, where it would never make the socket readable)."""
        budget = READ_BYTES
        while True:
            try:
                data = peer.sock.recv(READ_BYTES)
            except _WOULD_BLOCK:
                return
            except OSError as e:
                self._drop(peer, f"receive failed: {tls_reason(e)}")
                return
            if not data:
                self._drop(peer, self._service.close(peer.cid))
                return
            self._service.receive(peer.cid, data, _deadline.now())
            self._progress(peer)
            budget -= len(data)
            if not isinstance(peer.sock, ssl.SSLSocket) or (budget <= 0 and not peer.sock.pending()):
                return

    def _deliver(self) -> None:
        output = self._service.take_output()
        for cid, reason in self._service.take_dropped().items():
            peer = self._peers.get(cid)
            if peer is not None:
                self._farewell(peer, output.pop(cid, b""))
                self._drop(peer, reason)
        for cid, data in output.items():
            peer = self._peers.get(cid)
            if peer is not None:
                peer.out += data
                peer.held = peer.held or len(data) >= OUTPUT_LIMIT
                self._flush(peer)

    @staticmethod
    def _farewell(peer: _Peer, data: bytes | bytearray) -> None:
        """Best effort: the last bytes to a connection being dropped (a refusal), then EOF."""
        if data:
            try:
                peer.sock.send(bytes(peer.out) + bytes(data))
                peer.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _flush(self, peer: _Peer) -> None:
        try:
            del peer.out[:peer.sock.send(peer.out)]  # TLS: a retry after WantWrite resends the same (grown) buffer
        except _WOULD_BLOCK:
            pass
        except OSError as e:
            self._drop(peer, f"send failed: {tls_reason(e)}")
            return
        reading = len(peer.out) < OUTPUT_LIMIT  # a client that does not read its answers: stop reading it
        if reading and peer.held:
            self._drained.add(peer.cid)
        peer.held = not reading
        self._watch(peer, (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if peer.out else 0))

    def _watch(self, peer: _Peer, events: int) -> None:
        """Wait for ``events`` on the connection's socket."""
        if events != peer.events:
            peer.events = events
            self._sel.modify(peer.sock, events, peer)

    def _resume_drained(self) -> None:
        """Let connections whose answers went out handle the requests held back meanwhile."""
        while self._drained:
            cid = self._drained.pop()
            if cid in self._peers:
                self._service.resume(cid, _deadline.now())
                self._deliver()

    def _drop(self, peer: _Peer, reason: str | None) -> None:
        """Close one client connection; ``reason`` (if any) is logged as a warning (rate
        limited: the first few in full, then a summary line per interval, see LogLimit)."""
        if reason is not None:
            self._warnings.warning("store server %s:%d: dropping client %s: %s", self.host, self.port,
                                   peer.address, reason)
        self._service.close(peer.cid)
        self._gate.discard(peer.cid)
        if peer.securing:
            _discard_input(peer.sock)
        del self._peers[peer.cid]
        self._sel.unregister(peer.sock)
        peer.sock.close()


_servers: dict[tuple[str, int], Server] = {}
_servers_lock = threading.Lock()


def _same_token(a: bytes | None, b: bytes | None) -> bool:
    return a is None and b is None or a is not None and b is not None and hmac.compare_digest(a, b)


def acquire_server(host: str, port: int, multi_tenant: bool, auth_token: bytes | None,
                   tls: ssl.SSLContext | None = None) -> Server:
    """A new server (with ``tls``: TLS only), or with ``multi_tenant`` the one already serving
    (host, port) (which must have the same token and TLS context)."""
    if not multi_tenant:
        return Server(host, port, auth_token, tls)
    with _servers_lock:
        server = _servers.get((host, port)) if port else None
        if server is None:
            server = Server(host, port, auth_token, tls)
            _servers[(host, server.port)] = server
        elif not _same_token(server.auth_token, auth_token):
            raise DistStoreError(f"TCPStore {host}:{port}: this process already serves it with another auth token")
        elif server.tls is not tls:
            raise DistStoreError(f"TCPStore {host}:{port}: this process already serves it "
                                 f"{'with other TLS settings' if server.tls else 'without TLS'} (PYDIST_TLS_CERT, "
                                 "PYDIST_TLS_KEY and PYDIST_TLS_CA must be the same for every tenant)")
        else:
            server.users += 1
        return server


def release_server(server: Server) -> None:
    """Drop one user of ``server``; the last one stops it."""
    with _servers_lock:
        server.users -= 1
        if server.users > 0:
            return
        if _servers.get((server.host, server.port)) is server:
            del _servers[(server.host, server.port)]
    server.stop()
