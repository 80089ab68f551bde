"""TCPStore: a store served over TCP by the master rank, torch.distributed's TCPStore.

The server is one daemon thread running a ``selectors`` loop around a sans-IO
:class:`~pydist.store._service.StoreService` (no thread per client). It binds only the
address it is given, answers blocking requests when their keys arrive or ``timeout`` at
their deadline, and drops only a connection that sends garbage (logging one warning).

A client holds connections to the server (TCP_NODELAY); a call takes an idle one or opens
another, so threads sharing one client object never wait behind each other's blocking
calls. Connecting retries with backoff until the timeout. Every call has a client-side
deadline (the timeout plus a margin) so a dead server cannot hang it; a closed or failed
connection raises DistNetworkError naming host:port. This is the only store module that
touches sockets.

With a shared token (``auth_token=``, else PYDIST_AUTH_TOKEN; see :mod:`pydist._auth`)
every connection opens with a mutual HMAC challenge–response. The server refuses (and logs,
naming the peer address) a client that fails it, has no token, or speaks torch's protocol;
such a client raises :class:`~pydist._auth.AuthenticationError` (a DistNetworkError and a
DistStoreError) saying authentication failed, without retrying.
"""
from __future__ import annotations

import contextlib
import hmac
import itertools
import logging
import math
import selectors
import socket
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

from .._auth import AuthenticationError, resolve_token
from .._deadline import DEFAULT_STORE_TIMEOUT, Deadline
from .._errors import DistNetworkError, DistStoreError
from ._base import Store, StoreTimeoutError, check_key, timeout_error
from ._protocol import (ERROR_TYPES, REQUESTS, AuthRequired, ClientOpening, Message, ProtocolError, ResponseParser,
                        encode_request, hello)
from ._service import OUTPUT_LIMIT, StoreService
from ._state import INTERNAL_PREFIX

logger = logging.getLogger("pydist.store")

#: Seconds a client waits for an answer beyond the operation's own timeout.
SAFETY_MARGIN_S = 5.0
_MAX_IDLE = 8
_WORKERS = INTERNAL_PREFIX + "workers"
_WORKERS_DONE = INTERNAL_PREFIX + "workers_done"
_CLOSED_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _socket_timeout(deadline: Deadline) -> float:
    """A socket timeout for the time left before ``deadline`` (bounded: retried after)."""
    return min(max(deadline.remaining() or 0.0, 0.001), 60.0)


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
        raise DistNetworkError(f"TCPStore: cannot listen on {host}:{port}: {e}") from e
    return sock


class _Peer:
    __slots__ = ("cid", "sock", "address", "out", "events", "held")

    def __init__(self, cid: int, sock: socket.socket, address: Any):
        self.cid, self.sock, self.address = cid, sock, address
        self.out = bytearray()
        self.events = selectors.EVENT_READ
        self.held = False  # the service may be holding requests back (OUTPUT_LIMIT)


class _Server:
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
    def _farewell(peer: _Peer, data: bytes) -> None:
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


_servers: dict[tuple[str, int], _Server] = {}
_servers_lock = threading.Lock()


def _same_token(a: bytes | None, b: bytes | None) -> bool:
    return a is None and b is None or a is not None and b is not None and hmac.compare_digest(a, b)


def _acquire_server(host: str, port: int, multi_tenant: bool, auth_token: bytes | None) -> _Server:
    """A new server, or with ``multi_tenant`` the one already serving (host, port) (which
    must have the same token)."""
    if not multi_tenant:
        return _Server(host, port, auth_token)
    with _servers_lock:
        server = _servers.get((host, port)) if port else None
        if server is None:
            server = _Server(host, port, auth_token)
            _servers[(host, server.port)] = server
        elif not _same_token(server.auth_token, auth_token):
            raise DistStoreError(f"TCPStore {host}:{port}: this process already serves it with another auth token")
        else:
            server.users += 1
        return server


def _release_server(server: _Server) -> None:
    """Drop one user of ``server``; the last one stops it."""
    with _servers_lock:
        server.users -= 1
        if server.users > 0:
            return
        if _servers.get((server.host, server.port)) is server:
            del _servers[(server.host, server.port)]
    server.stop()


class _Connection:
    """One client socket to the server, past the handshake; not thread-safe."""

    def __init__(self, sock: socket.socket, where: str):
        self._sock = sock
        self._where = where
        self._parser = ResponseParser()
        self.local_address: str = sock.getsockname()[0]

    @classmethod
    def open(cls, host: str, port: int, deadline: Deadline, retry: bool,
             auth_token: bytes | None = None) -> "_Connection":
        """Connect and handshake (with ``auth_token``: authenticate); with ``retry``, keep
        trying (backoff) until ``deadline``. Failed authentication is never retried."""
        where, started, delay = f"{host}:{port}", time.monotonic(), 0.01
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=_socket_timeout(deadline))
            except OSError as e:
                error: Exception = e
            else:
                conn = cls(sock, where)
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if auth_token is None:
                        conn.roundtrip(hello(), deadline, "the handshake", handshake=True)
                    else:
                        conn.authenticate(auth_token, deadline)
                    return conn
                except DistNetworkError as e:
                    conn.close()
                    if isinstance(e, AuthenticationError) or isinstance(e.__cause__, ProtocolError):
                        raise
                    error = e
            left = deadline.remaining() or 0.0
            if not retry or left <= 0:
                raise DistNetworkError(
                    f"could not connect to store server at {where} (tried for {time.monotonic() - started:.1f}s): {error}"
                ) from error
            time.sleep(min(delay, left))
            delay = min(delay * 2, 1.0)

    @contextlib.contextmanager
    def _io(self, what: str):
        """Socket failures during ``what`` as DistNetworkError naming the server."""
        try:
            yield
        except _CLOSED_ERRORS:
            raise DistNetworkError(f"store server at {self._where} closed the connection (during {what})") from None
        except socket.timeout:
            raise DistNetworkError(f"store server at {self._where} did not answer {what} in time") from None
        except OSError as e:
            raise DistNetworkError(f"connection to store server at {self._where} failed during {what}: {e}") from e

    def authenticate(self, auth_token: bytes, deadline: Deadline) -> None:
        """The authenticated opening (``_protocol.ClientOpening``). Raises AuthenticationError."""
        what = "authentication"
        opening = ClientOpening(auth_token)
        try:
            with self._io(what):
                self._sock.settimeout(_socket_timeout(deadline))
                self._sock.sendall(opening.start())
                while not opening.done:
                    reply = opening.feed(self._recv(deadline, what))
                    if reply:
                        self._sock.sendall(reply)
        except AuthenticationError as e:
            raise AuthenticationError(f"authentication with store server at {self._where} failed: {e}") from None
        except ProtocolError as e:
            raise DistNetworkError(f"store server at {self._where} sent a malformed answer to {what}: {e}") from e
        self._parser.handshaken = True
        self._parser.feed(opening.leftover())

    def roundtrip(self, data: bytes, deadline: Deadline, what: str, handshake: bool = False) -> Message | None:
        """Send ``data`` and return the answer (with ``handshake``: wait for the hello)."""
        with self._io(what):
            self._sock.settimeout(_socket_timeout(deadline))
            self._sock.sendall(data)
            while True:
                try:
                    msg = self._parser.next()
                except AuthRequired:
                    raise AuthenticationError(
                        f"authentication with store server at {self._where} failed: the server requires a token "
                        "and this client has none (set PYDIST_AUTH_TOKEN or pass auth_token=)") from None
                except ProtocolError as e:
                    raise DistNetworkError(f"store server at {self._where} sent a malformed answer to {what}: {e}") from e
                if msg is not None or (handshake and self._parser.handshaken):
                    return msg
                self._parser.feed(self._recv(deadline, what))

    def _recv(self, deadline: Deadline, what: str) -> bytes:
        """Bytes from the server (b"" if none came within a bounded wait; the caller loops)."""
        if deadline.expired():
            raise socket.timeout()
        self._sock.settimeout(_socket_timeout(deadline))
        try:
            data = self._sock.recv(262144)
        except socket.timeout:
            return b""  # the deadline is checked again by the caller's loop
        if not data:
            raise DistNetworkError(f"store server at {self._where} closed the connection (during {what})")
        return data

    def close(self) -> None:
        self._sock.close()


class _Pool:
    """The connections of one client; a call takes an idle one or opens another."""

    def __init__(self, host: str, port: int, where: str, auth_token: bytes | None):
        self._host, self._port, self._where = host, port, where
        self._auth_token = auth_token
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False

    def put(self, conn: _Connection) -> None:
        """Give back a connection after a call."""
        with self._lock:
            if not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
            self._open.discard(conn)
        conn.close()

    def connect(self, timeout: float, retry: bool) -> _Connection:
        """A new connection (not yet idle); with ``retry``, wait up to ``timeout`` for the server."""
        conn = _Connection.open(self._host, self._port, Deadline.after(timeout), retry, self._auth_token)
        with self._lock:
            self._open.add(conn)
        return conn

    def _take(self, connect_timeout: float) -> _Connection:
        with self._lock:
            if self._closed:
                raise DistStoreError(f"{self._where} is closed")
            if self._idle:
                return self._idle.pop()
        return self.connect(connect_timeout, retry=False)

    def request(self, msg: Message, deadline: Deadline, connect_timeout: float) -> Message:
        """Send one request and return the answer; a connection that failed is closed."""
        data = encode_request(msg)
        conn = self._take(connect_timeout)
        try:
            answer = conn.roundtrip(data, deadline, msg.name)
        except BaseException:
            with self._lock:
                self._open.discard(conn)
            conn.close()
            raise
        self.put(conn)
        assert answer is not None
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open, self._idle = self._open, set(), []
        for conn in conns:
            conn.close()


def _shutdown(pool: _Pool, server: _Server | None) -> None:
    pool.close()
    if server is not None:
        _release_server(server)


class TCPStore(Store):
    """A store served over TCP. The master (``is_master=True``) runs the server on
    ``host_name:port`` (port 0: a free one, see ``.port``) and is a client too.

    With ``world_size`` and ``wait_for_workers``, every client counts itself in and the
    master's constructor waits until ``world_size`` clients did, else DistStoreError
    saying how many arrived. ``multi_tenant`` masters in one process share one server per
    (host, port). Closing a master stops its server (the last user's, if shared).

    The server binds only ``host_name`` ("" or "0.0.0.0": every interface). ``auth_token``
    (str or bytes; default PYDIST_AUTH_TOKEN, "" for none) makes the server and this client
    authenticate each other on every connection; the transports of a process group met
    through this store use the same token. Wrong or missing token: AuthenticationError.
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: timedelta = DEFAULT_STORE_TIMEOUT, wait_for_workers: bool = True,
                 multi_tenant: bool = False, auth_token: str | bytes | None = None):
        super().__init__(timeout)
        self._auth_token = resolve_token(auth_token)
        check_key(host_name, "host_name")
        for name, value in (("port", port), ("world_size", 1 if world_size is None else world_size)):
            if not isinstance(value, int):
                raise TypeError(f"{name}: expected int, got {type(value).__name__}")
        if not 0 <= port <= 65535 or (port == 0 and not is_master):
            raise ValueError(f"port: expected 1..65535 (0 only for the master), got {port}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size: expected a positive int or None, got {world_size}")
        self._server = _acquire_server(host_name, port, multi_tenant, self._auth_token) if is_master else None
        self._host, self._port = host_name, self._server.port if self._server else port
        self._pool = _Pool(host_name or "localhost", self._port, self._where(), self._auth_token)
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._server)
        try:
            first = self._pool.connect(self.timeout.total_seconds(), retry=True)
            self._client_address = first.local_address
            self._pool.put(first)
            if wait_for_workers and world_size is not None:
                self._count_in(world_size, is_master)
        except BaseException:
            self.close()
            raise

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def auth_token(self) -> bytes | None:
        """The shared token this store authenticates with (None: it does not); transports
        rendezvousing through this store use it (see ``pydist._auth.token_of``)."""
        return self._auth_token

    def client_address(self) -> str:
        """The local IP address of this client's connection to the server."""
        return self._client_address

    def _where(self) -> str:
        return f"TCPStore {self._host}:{self._port}"

    def _count_in(self, world_size: int, is_master: bool) -> None:
        if self._call("add", _WORKERS, 1) >= world_size:
            self._call("set", _WORKERS_DONE, b"1")
        if not is_master:
            return
        try:
            self._call_blocking("wait", ([_WORKERS_DONE],), self.timeout.total_seconds())
        except StoreTimeoutError:
            arrived = self._call("add", _WORKERS, 0)
            raise DistStoreError(
                f"{self._where()}: only {arrived} of {world_size} workers connected "
                f"within {self.timeout.total_seconds():g}s") from None

    def _request(self, msg: Message, wait_s: float) -> Any:
        answer = self._pool.request(msg, Deadline.after(wait_s + SAFETY_MARGIN_S), self.timeout.total_seconds())
        if answer.name == "timeout":
            missing, waited_ms = answer.args
            raise timeout_error(self._where(), missing, waited_ms / 1000)
        if answer.name == "error":
            code, message = answer.args
            raise ERROR_TYPES.get(code, DistStoreError)(message)
        if answer.name != REQUESTS[msg.name].result:
            raise DistNetworkError(f"store server at {self._host}:{self._port} answered {msg.name} with {answer.name}")
        return answer.args[0] if answer.args else None

    def _call(self, op: str, *args: Any) -> Any:
        return self._request(Message(op, args), self.timeout.total_seconds())

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        return self._request(Message(op, (*args, math.ceil(timeout_s * 1000))), timeout_s)

    def close(self) -> None:
        """Close this client's connections; a master also stops (or releases) its server."""
        self._finalizer()
