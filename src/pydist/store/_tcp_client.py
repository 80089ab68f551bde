"""TCPStore's client side: connections to the server and the pool of them.

A client holds connections to the server (TCP_NODELAY); a call takes an idle one or opens
another, so threads sharing one client never wait behind each other's blocking calls.
Connecting retries with backoff until the timeout; failed authentication is never retried.
Every socket wait is bounded by the call's deadline; a closed or failed connection raises
DistNetworkError naming host:port, a failed authentication
:class:`~pydist._auth.AuthenticationError`.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time

from .._addresses import family_unusable, host_port
from .._auth import AuthenticationError
from .._deadline import Deadline
from .._errors import DistNetworkError, DistStoreError
from ._auth_opening import ClientOpening
from ._protocol import AuthRequired, Message, ProtocolError, ResponseParser, encode_request, hello

_MAX_IDLE = 8
_CLOSED_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _socket_timeout(deadline: Deadline) -> float:
    """A socket timeout for the time left before ``deadline`` (bounded: retried after)."""
    return min(max(deadline.remaining() or 0.0, 0.001), 60.0)


class Connection:
    """One client socket to the server, past the handshake; not thread-safe."""

    def __init__(self, sock: socket.socket, where: str):
        self._sock = sock
        self._where = where
        self._parser = ResponseParser()
        self.local_address: str = sock.getsockname()[0]

    @classmethod
    def open(cls, host: str, port: int, deadline: Deadline, retry: bool,
             auth_token: bytes | None = None) -> "Connection":
        """Connect and handshake (with ``auth_token``: authenticate); with ``retry``, keep
        trying (backoff) until ``deadline``. Failed authentication is never retried."""
        where, started, delay = host_port(host, port), time.monotonic(), 0.01
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=_socket_timeout(deadline))
            except OSError as e:
                error: Exception = e
                unusable = family_unusable(host, e)
                if unusable is not None:
                    raise unusable from None
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
                    f"could not connect to store server at {where} "
                    f"(tried for {time.monotonic() - started:.1f}s): {error}"
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
        """The authenticated opening (``_auth_opening.ClientOpening``). Raises AuthenticationError."""
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
                    raise DistNetworkError(
                        f"store server at {self._where} sent a malformed answer to {what}: {e}") from e
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


class Pool:
    """The connections of one client; a call takes an idle one or opens another."""

    def __init__(self, host: str, port: int, where: str, auth_token: bytes | None):
        self._host, self._port, self._where = host, port, where
        self._auth_token = auth_token
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._closed = False

    def put(self, conn: Connection) -> None:
        """Give back a connection after a call."""
        with self._lock:
            if not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
            self._open.discard(conn)
        conn.close()

    def connect(self, timeout: float, retry: bool) -> Connection:
        """A new connection (not yet idle); with ``retry``, wait up to ``timeout`` for the server."""
        conn = Connection.open(self._host, self._port, Deadline.after(timeout), retry, self._auth_token)
        with self._lock:
            self._open.add(conn)
        return conn

    def _take(self, connect_timeout: float) -> Connection:
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
