"""TCPStore's server: one daemon thread per (host, port) serving every client connection.

The thread runs a ``selectors`` loop around a sans-IO
:class:`~pydist.store._service.StoreService` (no thread per client). It binds only the
address it is given, answers blocking requests when their keys arrive or ``timeout`` at
their deadline, and drops only a connection that sends garbage or fails (logging one
warning); an internal error costs that connection, never the server. A client that does not
read its answers is not read from until they drain (``OUTPUT_LIMIT``). Multi-tenant masters
of one process share the server of a (host, port) through :func:`acquire_server` /
:func:`release_server`; the last release stops it.
"""
from __future__ import annotations

import hmac
import itertools
import logging
import selectors
import socket
import threading
import time
from typing import Any

from .._addresses import family_unusable, host_port
from .._errors import DistNetworkError, DistStoreError
from ._service import OUTPUT_LIMIT, StoreService

logger = logging.getLogger("pydist.store")


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


class _Peer:
    __slots__ = ("cid", "sock", "address", "out", "events", "held")

    def __init__(self, cid: int, sock: socket.socket, address: Any):
        self.cid, self.sock, self.address = cid, sock, address
        self.out = bytearray()
        self.events = selectors.EVENT_READ
        self.held = False  # the service may be holding requests back (OUTPUT_LIMIT)


class Server:
    """The store server of one (host, port): a thread, its sockets, its service."""

    def __init__(self, host: str, port: int, auth_token: bytes | None):
        self._listener = _listen(host, port)
        self.host, self.port = host, self._listener.getsockname()[1]
        self.users = 1
        self.auth_token = auth_token
        self._service = StoreService(auth_token)
        self._peers: dict[int, _Peer] = {}
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
        self._thread.join(10.0)
        self._wake_w.close()

    def _run(self) -> None:
        try:
            while not self._stopping:
                deadline = self._service.next_deadline()
                events = self._sel.select(None if deadline is None else max(0.0, deadline - time.monotonic()))
                for key, mask in events:
                    self._on_event(key, mask)
                self._service.expire(time.monotonic())
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

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.fileobj is self._listener:
            self._accept()
        elif key.fileobj is self._wake_r:
            self._wake_r.recv(4096)
        else:
            peer: _Peer = key.data
            try:
                if mask & selectors.EVENT_READ and peer.cid in self._peers:
                    self._read(peer)
                if mask & selectors.EVENT_WRITE and peer.cid in self._peers:
                    self._flush(peer)
            except Exception as e:  # a bug costs one connection, never the server
                logger.exception("store server %s:%d: error serving %s", self.host, self.port, peer.address)
                if peer.cid in self._peers:
                    self._drop(peer, f"internal error: {e!r}")

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: back off a little
                logger.warning("store server %s:%d: accept failed: %s", self.host, self.port, e)
                time.sleep(0.01)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(next(self._ids), sock, address)
            self._peers[peer.cid] = peer
            self._sel.register(sock, selectors.EVENT_READ, peer)
            self._service.open(peer.cid)

    def _read(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(peer, f"receive failed: {e}")
            return
        if data:
            self._service.receive(peer.cid, data, time.monotonic())
        else:
            self._drop(peer, self._service.close(peer.cid))

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
            del peer.out[:peer.sock.send(peer.out)]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            self._drop(peer, f"send failed: {e}")
            return
        reading = len(peer.out) < OUTPUT_LIMIT  # a client that does not read its answers: stop reading it
        if reading and peer.held:
            self._drained.add(peer.cid)
        peer.held = not reading
        events = (selectors.EVENT_READ if reading else 0) | (selectors.EVENT_WRITE if peer.out else 0)
        if events != peer.events:
            peer.events = events
            self._sel.modify(peer.sock, events, peer)

    def _resume_drained(self) -> None:
        """Let connections whose answers went out handle the requests held back meanwhile."""
        while self._drained:
            cid = self._drained.pop()
            if cid in self._peers:
                self._service.resume(cid, time.monotonic())
                self._deliver()

    def _drop(self, peer: _Peer, reason: str | None) -> None:
        """Close one client connection; ``reason`` (if any) is logged as a warning."""
        if reason is not None:
            logger.warning("store server %s:%d: dropping client %s: %s", self.host, self.port, peer.address, reason)
        self._service.close(peer.cid)
        del self._peers[peer.cid]
        self._sel.unregister(peer.sock)
        peer.sock.close()


_servers: dict[tuple[str, int], Server] = {}
_servers_lock = threading.Lock()


def _same_token(a: bytes | None, b: bytes | None) -> bool:
    return a is None and b is None or a is not None and b is not None and hmac.compare_digest(a, b)


def acquire_server(host: str, port: int, multi_tenant: bool, auth_token: bytes | None) -> Server:
    """A new server, or with ``multi_tenant`` the one already serving (host, port) (which
    must have the same token)."""
    if not multi_tenant:
        return Server(host, port, auth_token)
    with _servers_lock:
        server = _servers.get((host, port)) if port else None
        if server is None:
            server = Server(host, port, auth_token)
            _servers[(host, server.port)] = server
        elif not _same_token(server.auth_token, auth_token):
            raise DistStoreError(f"TCPStore {host}:{port}: this process already serves it with another auth token")
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
