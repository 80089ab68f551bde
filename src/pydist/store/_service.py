"""The TCPStore server's logic without sockets: connections are integer ids, time is
passed in, and the answers wait in per-connection output buffers.

A connection speaks the protocol its first byte names: pydist's (``b"PDST"`` hello, see
``_protocol``; the server's hello answers it) or torch's TCPStore client protocol (a
VALIDATE query, byte 0; see ``_torch_protocol`` and ``_torch_service``). Both run on the
one :class:`KVState`, so pydist and torch clients share keys; a codec per connection
(:class:`PydistCodec` or :class:`~pydist.store._torch_service.TorchCodec`) parses its
requests, names the operations to run and frames their answers.

The I/O loop (``_tcp_server.py``) calls ``open`` / ``receive`` / ``close`` as connections come,
send bytes and go, ``expire`` when ``next_deadline`` passes, and then sends what
``take_output`` returns and closes what ``take_dropped`` names (connections that sent a
malformed stream). A connection's requests are answered in order: while one of them is
blocked (get/wait/multi_get/queue_pop on missing keys) the ones after it stay buffered
(a torch connection's are still read: its CANCEL_WAIT ends the blocked one).
A blocked request is parked on the keys it misses and re-run when one of them changes;
at its deadline (torch's: none) it is answered ``timeout`` with the keys still missing,
so the client and server stay in sync.

With a token (``StoreService(auth_token=...)``) a pydist connection must first pass the
authenticated opening (``_auth_opening.ServerOpening``): until it has, none of its bytes reach
a request parser, so it can neither read nor write a key. A connection that fails it, or
speaks torch's protocol (torch's clients cannot authenticate), is dropped with a reason
naming authentication, after its refusal reply is sent.

What a connection may make the server hold in memory is bounded (:mod:`._limits`: the
connection whose bytes pass a limit is dropped); ``stats`` counts what is held, its peaks,
and the drops. ``proven`` says when a connection has proven it may use the store (with a
token: its opening is done; without: its hello came, or a torch client's VALIDATE): until
then the I/O loop holds it to the admission policy (:mod:`pydist.net.admission`: a deadline
and a cap on such connections).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from typing import Any

from ..core.errors import DistStoreError
from ..net.log_limit import LogLimit
from ..net.tls import HANDSHAKE_RECORD
from ._auth_opening import ServerOpening
from ._limits import Holdings, ServiceStats
from ._protocol import (
    REQUESTS,
    WIRE_MAGIC,
    AuthRefused,
    AuthRequired,
    Message,
    ProtocolError,
    RequestParser,
    encode_response,
    error_code,
    hello,
)
from ._state import KVState, NotReady
from ._torch_service import TorchCodec

logger = logging.getLogger("pydist.store")
#: Longest error text sent to a client (error messages may quote keys of up to 64 KiB).
MAX_ERROR_CHARS = 2000
#: Answers pending for one connection beyond which its next requests wait (back-pressure on a
#: client that does not read): the I/O loop calls ``resume`` once they are sent.
OUTPUT_LIMIT = 4 << 20
class PydistCodec(RequestParser):
    """A pydist client's connection: its request parser, the operations it runs (the
    state's methods) and how answers are framed."""

    greeting = hello()
    cancel_op: str | None = None

    @property
    def greeted(self) -> bool:
        """Its hello came."""
        return self.handshaken

    def bind(self, state: KVState) -> KVState:
        return state

    def split(self, msg: Message) -> tuple[tuple[Any, ...], float]:
        """Arguments and timeout in ms (a blocking request's last field; else 0)."""
        return (msg.args[:-1], msg.args[-1]) if REQUESTS[msg.name].blocking else (msg.args, 0)

    def answer(self, name: str, result: Any) -> bytes:
        kind = REQUESTS[name].result
        args = () if kind == "ok" else (int(result),) if kind == "int" else (result,)
        return encode_response(Message(kind, args))

    def timeout(self, name: str, missing: list[str], waited_ms: int) -> bytes | None:
        return encode_response(Message("timeout", (missing, waited_ms)))

    def error(self, name: str, exc: BaseException) -> bytes | None:
        text = str(exc)
        if len(text) > MAX_ERROR_CHARS:  # it may quote a long key: keep it under the string limit
            text = text[:MAX_ERROR_CHARS] + f"... ({len(text)} characters)"
        return encode_response(Message("error", (error_code(exc), text)))


Codec = PydistCodec | TorchCodec
#: what a TLS client of a store without TLS gets before the close: not TLS, so its TLS layer
#: fails at once (a refusal), where a close without a word would be a cut that it retries
_NOT_TLS_FAREWELL = hello() + encode_response(Message("error", (error_code(DistStoreError()), (
    "this store does not use TLS: unset PYDIST_TLS_* for its clients, or set them for the store too"))))


def _codec_for(first: bytes) -> Codec:
    """The codec of a connection whose first byte is ``first``. Raises ProtocolError."""
    if WIRE_MAGIC.startswith(first):
        return PydistCodec()
    if first == b"\x00":  # torch's VALIDATE query type
        return TorchCodec()
    if first == bytes([HANDSHAKE_RECORD]):
        raise ProtocolError("a TLS client (PYDIST_TLS_* set there) and this store does not use TLS")
    raise ProtocolError(f"bad magic {first!r}: neither a pydist store stream ({WIRE_MAGIC!r}) "
                        "nor a torch TCPStore client")


class _Conn:
    __slots__ = ("cid", "codec", "ops", "waiter", "opening")

    def __init__(self, cid: int):
        self.cid = cid
        self.codec: Codec | None = None
        self.ops: Any = None
        self.waiter: _Waiter | None = None
        self.opening: ServerOpening | None = None  # with a token: until the client proved it


class _Waiter:
    """A parked blocking request."""

    __slots__ = ("conn", "op", "args", "timeout_ms", "keys", "done")

    def __init__(self, conn: _Conn, op: str, args: tuple[Any, ...], timeout_ms: float):
        self.conn, self.op, self.args, self.timeout_ms = conn, op, args, timeout_ms
        self.keys: set[str] = set()
        self.done = False


class StoreService:
    """One store's state and every connection to it; single-threaded, never raises on
    bad input (the offending connection is reported through ``take_dropped``)."""

    def __init__(self, auth_token: bytes | None = None) -> None:
        self.auth_token = auth_token
        self.state = KVState()
        self.stats = ServiceStats()
        self._conns: dict[int, _Conn] = {}
        self._parked: dict[str, dict[_Waiter, None]] = {}
        self._timers: list[tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._changed: deque[str] = deque()
        self._output: dict[int, bytearray] = {}
        self._dropped: dict[int, str] = {}
        self._holdings = Holdings(self.stats)
        self._warnings = LogLimit(logger, "store server: operations failed")

    # -- the I/O loop's interface ----------------------------------------------------
    def open(self, cid: int, now: float = 0.0) -> None:
        """A new connection (accepted at ``now``); its first bytes will say which protocol it speaks."""
        self._conns[cid] = _Conn(cid)
        stats = self.stats
        stats.connections += 1
        stats.opened += 1
        stats.peak_connections = max(stats.peak_connections, stats.connections)
        self._holdings.open(cid, unproven=self.auth_token is not None)

    def receive(self, cid: int, data: bytes, now: float) -> None:
        """Bytes from connection ``cid``; answers what they complete."""
        conn = self._conns.get(cid)
        if conn is None or cid in self._dropped or not data:
            return
        if conn.codec is None and not self._start(conn, data[:1]):
            return
        if conn.opening is not None:
            data = self._open(conn, data)
            if not data:
                self._account(conn)
                return
        assert conn.codec is not None  # set by _start
        conn.codec.feed(data)
        self._drain(conn, now)
        self._settle(now)
        self._account(conn)

    def close(self, cid: int) -> str | None:
        """Forget connection ``cid`` and its parked request; what was wrong with how it ended
        (mid-message, mid-authentication), or None."""
        conn = self._conns.pop(cid, None)
        self._output.pop(cid, None)
        self._dropped.pop(cid, None)
        if conn is None:
            return None
        self.stats.connections -= 1
        self._holdings.forget(cid)
        if conn.waiter is not None:
            self._unpark(conn.waiter)
        if conn.opening is not None:
            return "authentication failed: disconnected before proving it holds the token"
        if conn.codec is not None and conn.codec.pending > 0:
            return "disconnected in the middle of a message"
        return None

    def resume(self, cid: int, now: float) -> None:
        """The connection's answers were sent: handle the requests held back by OUTPUT_LIMIT."""
        conn = self._conns.get(cid)
        if conn is not None and conn.codec is not None and cid not in self._dropped:
            self._drain(conn, now)
            self._settle(now)
            self._account(conn)

    def proven(self, cid: int) -> bool:
        """Whether connection ``cid`` proved it may use the store: with a token its opening
        is done, without one its hello came (a torch client's VALIDATE)."""
        conn = self._conns.get(cid)
        return (conn is not None and cid not in self._dropped and conn.opening is None and conn.codec is not None
                and conn.codec.greeted)

    def greeted(self, cid: int) -> bool:
        """Whether connection ``cid``'s authenticating hello was answered (it owes its proof)."""
        conn = self._conns.get(cid)
        return conn is not None and conn.opening is not None and conn.opening.answered

    def next_deadline(self) -> float | None:
        """When the earliest parked request times out (monotonic seconds), if any."""
        while self._timers and self._timers[0][2].done:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def expire(self, now: float) -> None:
        """Answer ``timeout`` to every parked request whose deadline is past."""
        while self._timers and self._timers[0][0] <= now:
            waiter = heapq.heappop(self._timers)[2]
            if not waiter.done:
                conn = waiter.conn
                assert conn.codec is not None  # a parked request was parsed by it
                try:
                    answer = self._run(conn, waiter.op, waiter.args)
                except NotReady as e:
                    # an expiring timer's timeout is finite (inf ones are not timed): the wire's int
                    timeout = conn.codec.timeout(waiter.op, e.missing, int(waiter.timeout_ms))
                    answer = self._checked(conn, timeout, "timed out")
                self._finish(waiter, answer, now)
        self._settle(now)

    def take_output(self) -> dict[int, bytearray]:
        """Bytes to send, by connection id."""
        output, self._output = self._output, {}
        return output

    def take_dropped(self) -> dict[int, str]:
        """Connections to close, with the reason (a malformed stream, a failed operation on a
        torch connection, failed authentication). Send what ``take_output`` gives them first:
        their farewell (e.g. a refusal), nothing else."""
        dropped, self._dropped = self._dropped, {}
        return dropped

    # -- limits ----------------------------------------------------------------------
    def _account(self, conn: _Conn) -> None:
        """Count what ``conn`` holds unparsed now; drop it if that passes a limit."""
        if conn.cid in self._dropped:  # closed next: held no longer
            self._holdings.forget(conn.cid)
            return
        held = (conn.opening.pending if conn.opening is not None else 0) + (conn.codec.pending if conn.codec else 0)
        over = self._holdings.count(conn.cid, held)
        if over is not None:
            self.stats.dropped_for_limits += 1
            self._drop(conn.cid, f"over a limit: {over}")
            self._holdings.forget(conn.cid)

    # -- internals -------------------------------------------------------------------
    def _send(self, cid: int, data: bytes) -> None:
        if data and cid not in self._dropped:
            self._output.setdefault(cid, bytearray()).extend(data)

    def _drop(self, cid: int, reason: str, farewell: bytes = b"") -> None:
        """Mark ``cid`` to be closed after sending only ``farewell``."""
        if cid not in self._dropped:
            self._dropped[cid] = reason
            self._output.pop(cid, None)
            if farewell:
                self._output[cid] = bytearray(farewell)

    def _start(self, conn: _Conn, first: bytes) -> bool:
        """Pick the connection's codec from its first byte (with a token: start its opening)."""
        try:
            conn.codec = _codec_for(first)
        except ProtocolError as e:
            tls_client = first == bytes([HANDSHAKE_RECORD])
            self._drop(conn.cid, f"malformed stream: {e}", _NOT_TLS_FAREWELL if tls_client else b"")
            return False
        if self.auth_token is not None:
            if isinstance(conn.codec, TorchCodec):
                self._drop(conn.cid, "authentication failed: a torch TCPStore client, refused because this store "
                                     "requires a token (PYDIST_AUTH_TOKEN) and torch's clients cannot authenticate")
                return False
            conn.opening = ServerOpening(self.auth_token)
            conn.codec.handshaken = True
        else:
            self._send(conn.cid, conn.codec.greeting)
        conn.ops = conn.codec.bind(self.state)
        return True

    def _open(self, conn: _Conn, data: bytes) -> bytes:
        """Feed the opening; the bytes after it once the client is authenticated."""
        assert conn.opening is not None  # the caller checked
        try:
            self._send(conn.cid, conn.opening.feed(data))
        except AuthRefused as e:
            self._drop(conn.cid, f"authentication failed: {e}", e.reply)
            return b""
        except ProtocolError as e:
            self._drop(conn.cid, f"authentication failed: malformed opening: {e}")
            return b""
        if not conn.opening.done:
            return b""
        self._holdings.forget(conn.cid)  # authenticated: what it holds is counted again as any connection's
        data, conn.opening = conn.opening.leftover(), None
        return data

    def _checked(self, conn: _Conn, answer: bytes | None, what: str) -> bytes:
        """``answer``, or if the codec has none to give (torch), drop the connection."""
        if answer is None:
            self._drop(conn.cid, f"{what} (torch's protocol has no error reply)")
            return b""
        return answer

    def _drain(self, conn: _Conn, now: float) -> None:
        """Handle the connection's buffered requests until one blocks (a torch connection
        reads on: its CANCEL_WAIT ends the blocked request)."""
        codec = conn.codec
        assert codec is not None  # only connections past _start are drained
        while ((conn.waiter is None or codec.cancel_op) and conn.cid not in self._dropped
               and len(self._output.get(conn.cid, b"")) < OUTPUT_LIMIT):  # else: resume() later
            try:
                msg = codec.next()
            except AuthRequired as e:  # an authenticating client: say this server does not
                self._drop(conn.cid, f"authentication failed: {e}", codec.greeting)
                return
            except ProtocolError as e:
                self._drop(conn.cid, f"malformed stream: {e}")
                return
            if msg is None:
                return
            self.stats.requests[msg.name] = self.stats.requests.get(msg.name, 0) + 1
            if msg.name == codec.cancel_op:
                if conn.waiter is not None:
                    self._unpark(conn.waiter)
                self._send(conn.cid, codec.answer(msg.name, None))
            else:
                self._handle(conn, msg, now)

    def _handle(self, conn: _Conn, msg: Message, now: float) -> None:
        assert conn.codec is not None  # msg was parsed by it
        args, timeout_ms = conn.codec.split(msg)
        try:
            answer = self._run(conn, msg.name, args)
        except NotReady as e:
            if timeout_ms <= 0:
                answer = self._checked(conn, conn.codec.timeout(msg.name, e.missing, 0), f"{msg.name} timed out")
            elif conn.waiter is not None:
                self._drop(conn.cid, f"malformed stream: {msg.name} sent while another request is blocked")
                return
            else:
                retry = args if e.retry_args is None else e.retry_args
                self._park(_Waiter(conn, msg.name, retry, timeout_ms), e.missing, now)
                return
        self._send(conn.cid, answer)

    def _run(self, conn: _Conn, op: str, args: tuple[Any, ...]) -> bytes:
        """Run one operation of ``conn`` on the state; its answer. Raises NotReady."""
        assert conn.codec is not None  # its requests were parsed by it
        try:
            result = getattr(conn.ops, op)(*args)
        except NotReady:
            raise
        except Exception as e:  # a failing operation is answered, never fatal
            if not isinstance(e, (ValueError, DistStoreError)):
                self._warnings.warning("store server: %s failed: %r", op, e)
            return self._checked(conn, conn.codec.error(op, e), f"{op} failed: {e}")
        finally:
            self._changed.extend(change.args[0] for change in self.state.take_changes())
        try:
            return conn.codec.answer(op, result)
        except ValueError as e:  # the answer is over the protocol's limits: say so instead
            too_big = DistStoreError(f"{op}: the answer cannot be sent: {e}")
            return self._checked(conn, conn.codec.error(op, too_big), str(too_big))

    def _park(self, waiter: _Waiter, missing: list[str], now: float) -> None:
        waiter.conn.waiter = waiter
        self._watch(waiter, missing)
        if not math.isinf(waiter.timeout_ms):
            heapq.heappush(self._timers, (now + waiter.timeout_ms / 1000, next(self._seq), waiter))

    def _watch(self, waiter: _Waiter, keys: list[str]) -> None:
        for key in keys:
            self._parked.setdefault(key, {})[waiter] = None
        waiter.keys.update(keys)

    def _unpark(self, waiter: _Waiter) -> None:
        waiter.done = True
        waiter.conn.waiter = None
        for key in waiter.keys:
            parked = self._parked.get(key)
            if parked is not None:
                parked.pop(waiter, None)
                if not parked:
                    del self._parked[key]

    def _finish(self, waiter: _Waiter, answer: bytes, now: float) -> None:
        self._unpark(waiter)
        self._send(waiter.conn.cid, answer)
        if waiter.conn.cid in self._conns:
            self._drain(waiter.conn, now)
            self._account(waiter.conn)

    def _settle(self, now: float) -> None:
        """Re-run the requests parked on every changed key, oldest first."""
        while self._changed:
            key = self._changed.popleft()
            for waiter in list(self._parked.get(key, ())):
                if waiter.done:
                    continue
                try:
                    answer = self._run(waiter.conn, waiter.op, waiter.args)
                except NotReady as e:
                    self._watch(waiter, e.missing)
                    continue
                self._finish(waiter, answer, now)
