"""The TCPStore server's logic without sockets: connections are integer ids, time is
passed in, and the answers wait in per-connection output buffers.

The I/O loop (``tcp.py``) calls ``open`` / ``receive`` / ``close`` as connections come,
send bytes and go, ``expire`` when ``next_deadline`` passes, and then sends what
``take_output`` returns and closes what ``take_dropped`` names (connections that sent a
malformed stream). A connection's requests are answered in order: while one of them is
blocked (get/wait/multi_get/queue_pop on missing keys) the ones after it stay buffered.
A blocked request is parked on the keys it misses and re-run when one of them changes;
at its deadline it is answered ``timeout`` with the keys still missing, so the client
and server stay in sync.
"""
from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from typing import Any

from .._errors import DistStoreError
from ._protocol import REQUESTS, Message, ProtocolError, RequestParser, encode_response, error_code, hello
from ._state import KVState, NotReady

logger = logging.getLogger("pydist.store")


class _Conn:
    __slots__ = ("cid", "parser", "waiter")

    def __init__(self, cid: int):
        self.cid = cid
        self.parser = RequestParser()
        self.waiter: _Waiter | None = None


class _Waiter:
    """A parked blocking request."""

    __slots__ = ("conn", "op", "args", "timeout_ms", "keys", "done")

    def __init__(self, conn: _Conn, op: str, args: tuple[Any, ...], timeout_ms: int):
        self.conn, self.op, self.args, self.timeout_ms = conn, op, args, timeout_ms
        self.keys: set[str] = set()
        self.done = False


def _answer(kind: str, result: Any) -> Message:
    if kind == "ok":
        return Message("ok", ())
    return Message(kind, (int(result),) if kind == "int" else (result,))


class StoreService:
    """One store's state and every connection to it; single-threaded, never raises on
    bad input (the offending connection is reported through ``take_dropped``)."""

    def __init__(self) -> None:
        self.state = KVState()
        self._conns: dict[int, _Conn] = {}
        self._parked: dict[str, dict[_Waiter, None]] = {}
        self._timers: list[tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._changed: deque[str] = deque()
        self._output: dict[int, bytearray] = {}
        self._dropped: dict[int, str] = {}

    # -- the I/O loop's interface ----------------------------------------------------
    def open(self, cid: int) -> None:
        """A new connection; the server's hello is queued for it."""
        self._conns[cid] = _Conn(cid)
        self._send(cid, hello())

    def receive(self, cid: int, data: bytes, now: float) -> None:
        """Bytes from connection ``cid``; answers what they complete."""
        conn = self._conns.get(cid)
        if conn is None or cid in self._dropped:
            return
        conn.parser.feed(data)
        self._drain(conn, now)
        self._settle(now)

    def close(self, cid: int) -> bool:
        """Forget connection ``cid`` and its parked request; whether it ended mid-message."""
        conn = self._conns.pop(cid, None)
        self._output.pop(cid, None)
        self._dropped.pop(cid, None)
        if conn is None:
            return False
        if conn.waiter is not None:
            self._unpark(conn.waiter)
        return conn.parser.pending > 0

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
                try:
                    answer = self._run(waiter.op, waiter.args)
                except NotReady as e:
                    answer = Message("timeout", (e.missing, waiter.timeout_ms))
                self._finish(waiter, answer, now)
        self._settle(now)

    def take_output(self) -> dict[int, bytearray]:
        """Bytes to send, by connection id."""
        output, self._output = self._output, {}
        return output

    def take_dropped(self) -> dict[int, str]:
        """Connections to close, with the reason (a malformed stream)."""
        dropped, self._dropped = self._dropped, {}
        return dropped

    # -- internals -------------------------------------------------------------------
    def _send(self, cid: int, data: bytes) -> None:
        self._output.setdefault(cid, bytearray()).extend(data)

    def _drain(self, conn: _Conn, now: float) -> None:
        """Handle the connection's buffered requests until one blocks."""
        while conn.waiter is None and conn.cid not in self._dropped:
            try:
                msg = conn.parser.next()
            except ProtocolError as e:
                self._dropped[conn.cid] = str(e)
                return
            if msg is None:
                return
            self._handle(conn, msg, now)

    def _handle(self, conn: _Conn, msg: Message, now: float) -> None:
        op = REQUESTS[msg.name]
        args, timeout_ms = (msg.args[:-1], msg.args[-1]) if op.blocking else (msg.args, 0)
        try:
            answer = self._run(msg.name, args)
        except NotReady as e:
            if timeout_ms <= 0:
                answer = Message("timeout", (e.missing, 0))
            else:
                self._park(_Waiter(conn, msg.name, args, timeout_ms), e.missing, now)
                return
        self._send(conn.cid, encode_response(answer))

    def _run(self, op: str, args: tuple[Any, ...]) -> Message:
        """Run one operation on the state; its answer. Raises NotReady."""
        try:
            result = getattr(self.state, op)(*args)
        except NotReady:
            raise
        except Exception as e:  # a failing operation is answered, never fatal
            if not isinstance(e, (ValueError, DistStoreError)):
                logger.warning("store server: %s failed: %r", op, e)
            return Message("error", (error_code(e), str(e)))
        finally:
            self._changed.extend(change.args[0] for change in self.state.take_changes())
        return _answer(REQUESTS[op].result, result)

    def _park(self, waiter: _Waiter, missing: list[str], now: float) -> None:
        waiter.conn.waiter = waiter
        self._watch(waiter, missing)
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

    def _finish(self, waiter: _Waiter, answer: Message, now: float) -> None:
        self._unpark(waiter)
        self._send(waiter.conn.cid, encode_response(answer))
        if waiter.conn.cid in self._conns:
            self._drain(waiter.conn, now)

    def _settle(self, now: float) -> None:
        """Re-run the requests parked on every changed key, oldest first."""
        while self._changed:
            key = self._changed.popleft()
            for waiter in list(self._parked.get(key, ())):
                if waiter.done:
                    continue
                try:
                    answer = self._run(waiter.op, waiter.args)
                except NotReady as e:
                    self._watch(waiter, e.missing)
                    continue
                self._finish(waiter, answer, now)
