"""TCPStore's client side: connections to the server and the pool of them.

A client holds connections to the server (TCP_NODELAY); a call takes an idle one or opens
another, so threads sharing one client never wait behind each other's blocking calls.
Connecting retries with backoff until the timeout; failed authentication is never retried.
Every socket wait is bounded by the call's deadline; a closed or failed connection raises
DistNetworkError naming host:port, a failed authentication
:class:`~pydist.net.auth.AuthenticationError`.

With TLS (a client ``ssl.SSLContext``, see :mod:`pydist.net.tls`) a connection opens with a TLS
handshake, then the store's opening inside it. Until that opening is done a TLS error is a
refusal (:class:`Refused`, never retried) saying which side refused what: the store refused
this client's certificate (a TLS alert, which TLS 1.3 delivers only at the first read), this
client refused the store's, or the store does not use TLS (it answers a TLS client with
bytes that are not TLS). A server that requires TLS answers a plain client with an
``error``, also a Refused.

A connection the server closes without a word (no TLS alert, no answer) before its opening
is done, during the TLS handshake or after it, was cut by the server's admission policy
(its deadline, PYDIST_HANDSHAKE_TIMEOUT, or its cap on connections not proven yet, which a
flood fills): it is dialled again until the timeout, even by a call that does not retry a
server that is down (:class:`Cut`).
"""
from __future__ import annotations

import contextlib
import socket
import ssl
import threading

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import DistNetworkError, DistStoreError
from ..net.addresses import family_unusable, host_port
from ..net.auth import AuthenticationError
from ..net.tls import reason as tls_reason
from ._auth_opening import ClientOpening
from ._protocol import AuthRequired, Message, ProtocolError, ResponseParser, encode_request, hello

_MAX_IDLE = 8
_CLOSED_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
#: a TLS connection closed without an alert (a cut, once the TLS handshake is done)
_TLS_CLOSED = (ssl.SSLEOFError, ssl.SSLZeroReturnError)


class Cut(DistNetworkError):
    """The server closed the connection without a word before its opening was done (see the
    module): dialled again."""


class Refused(DistNetworkError, DistStoreError):
    """The server refused this client, or this client the server, for a reason a retry cannot
    change (TLS on one side only, a certificate not trusted)."""


def _tls_refused(where: str, error: BaseException) -> Refused:
    """A TLS opening with the store at ``where`` that failed with ``error``, in words."""
    why = tls_reason(error)
    if isinstance(error, ssl.SSLCertVerificationError):
        return Refused(f"this client refused the certificate of the store at {where}: {why} (is the store's "
                       "PYDIST_TLS_CERT signed by this client's PYDIST_TLS_CA, and still valid?)")
    if "alert" in why:
        return Refused(f"the store at {where} refused this client's certificate: {why} "
                       "(is PYDIST_TLS_CERT signed by the CA the store trusts, and still valid?)")
    return Refused(f"the store at {where} does not use TLS or refused it: {why} "
                   "(PYDIST_TLS_* must be set for the store and its clients alike)")


def _first_answer(data: bytes) -> Message | None:
    """The first message of a server's stream ``data`` (None: not a whole one)."""
    parser = ResponseParser()
    parser.feed(data)
    with contextlib.suppress(ProtocolError):
        return parser.next()
    return None


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
        self._tls_opening = False  # a TLS connection before its store opening is done
        self._tls_up = False  # its TLS handshake is done
        self._opened = False  # its opening is done (a close is then no cut)

    @classmethod
    def open(cls, host: str, port: int, deadline: Deadline, retry: bool,
             auth_token: bytes | None = None, tls: ssl.SSLContext | None = None) -> Connection:
        """Connect (with ``tls``: over TLS) and handshake (with ``auth_token``: authenticate);
        with ``retry``, keep trying (backoff) until ``deadline``; without, only a connection
        the server cut (:class:`Cut`). A refusal or failed authentication is never retried."""
        where, started, delay = host_port(host, port), _deadline.now(), 0.01
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
                    if tls is not None:
                        conn._start_tls(tls, deadline)
                    if auth_token is None:
                        conn._check_refusal(conn.roundtrip(hello(), deadline, "the handshake", handshake=True))
                    else:
                        conn.authenticate(auth_token, deadline)
                    conn._tls_opening, conn._opened = False, True
                    return conn
                except DistNetworkError as e:
                    conn.close()
                    if isinstance(e, (AuthenticationError, Refused)) or isinstance(e.__cause__, ProtocolError):
                        raise
                    error = e
            left = deadline.remaining() or 0.0
            if not (retry or isinstance(error, Cut)) or left <= 0:
                raise DistNetworkError(
                    f"could not connect to store server at {where} "
                    f"(tried for {_deadline.now() - started:.1f}s): {error}"
                ) from error
            _deadline.sleep(min(delay, left))
            delay = min(delay * 2, 1.0)

    def _start_tls(self, context: ssl.SSLContext, deadline: Deadline) -> None:
        """Wrap the socket in TLS and run the handshake (failures: see ``_io``)."""
        self._tls_opening = True
        with self._io("the TLS handshake"):
            self._sock.settimeout(_socket_timeout(deadline))
            self._sock = context.wrap_socket(self._sock, do_handshake_on_connect=False)
            self._sock.do_handshake()
        self._tls_up = True

    def _check_refusal(self, answer: Message | None) -> None:
        """Raise Refused if the server's first answer is an error (e.g. it requires TLS)."""
        if answer is not None and answer.name == "error":
            raise Refused(f"store server at {self._where} refused this client: {answer.args[1]}")

    @contextlib.contextmanager
    def _io(self, what: str):
        """Socket failures during ``what`` as DistNetworkError naming the server: a connection
        closed without a word before the opening is done as :class:`Cut`; another TLS error
        during a TLS opening as Refused."""
        try:
            yield
        except OSError as e:
            if isinstance(e, (*_CLOSED_ERRORS, *_TLS_CLOSED)):  # no TLS alert, no answer: cut (see the module)
                hint = " without a TLS alert: cut while the store sheds connections, or it does not use TLS" \
                    if self._tls_opening and not self._tls_up else ""
                closed = DistNetworkError if self._opened else Cut
                raise closed(f"store server at {self._where} closed the connection (during {what}){hint}") from None
            if self._tls_opening and isinstance(e, ssl.SSLError):
                raise _tls_refused(self._where, e) from None
            if isinstance(e, socket.timeout):
                raise DistNetworkError(f"store server at {self._where} did not answer {what} in time") from None
            raise DistNetworkError(f"connection to store server at {self._where} failed during {what}: "
                                   f"{tls_reason(e)}") from e

    def authenticate(self, auth_token: bytes, deadline: Deadline) -> None:
        """The authenticated opening (``_auth_opening.ClientOpening``). Raises AuthenticationError."""
        what = "authentication"
        opening = ClientOpening(auth_token)
        received = bytearray()  # the server's bytes: a refusal instead of an opening is told apart
        try:
            with self._io(what):
                self._sock.settimeout(_socket_timeout(deadline))
                self._sock.sendall(opening.start())
                while not opening.done:
                    data = self._recv(deadline)
                    received += data
                    reply = opening.feed(data)
                    if reply:
                        self._sock.sendall(reply)
        except AuthenticationError as e:
            self._check_refusal(_first_answer(bytes(received)))
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
                self._parser.feed(self._recv(deadline))

    def _recv(self, deadline: Deadline) -> bytes:
        """Bytes from the server (b"" if none came within a bounded wait; the caller loops);
        called inside ``_io``, which words the errors."""
        if deadline.expired():
            raise TimeoutError()
        self._sock.settimeout(_socket_timeout(deadline))
        try:
            data = self._sock.recv(262144)
        except TimeoutError:
            return b""  # the deadline is checked again by the caller's loop
        if not data:
            raise ConnectionAbortedError("the server closed the connection")
        return data

    def close(self) -> None:
        self._sock.close()


class Pool:
    """The connections of one client; a call takes an idle one or opens another."""

    def __init__(self, host: str, port: int, where: str, auth_token: bytes | None, tls: ssl.SSLContext | None = None):
        self._host, self._port, self._where = host, port, where
        self._auth_token, self._tls = auth_token, tls
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
        conn = Connection.open(self._host, self._port, Deadline.after(timeout), retry, self._auth_token, self._tls)
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
