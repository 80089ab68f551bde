"""torch's c10d TCPStore client protocol (torch 2.x), pure sans-IO.

A torch ``TCPStore`` client opens with a VALIDATE query carrying torch's magic number and
then sends queries, each a query type byte followed by its fields, all little-endian with
no length prefix for the whole query:

    s  key     u64 length + bytes (UTF-8 here)     I  u32
    b  value   u64 length + bytes                  q  i64
    S  keys    u64 count + that many s
    P  pairs   u64 count + that many (s, b)        (parsed as two lists: keys, values)

The server answers some queries (see :data:`QUERIES`, kind of reply): nothing, a u32 echo
(ping), an i64, a value, a u8 (check: 0 ready / 1 not ready; wait and barrier: 0 stop
waiting; cancel_wait: 1 wait canceled), one value per requested key (multi_get), an i64
queue length then the value if it was non-zero (queue_pop), or an i64 count then that many
keys (list_keys). Blocking is the client's business: torch's ``get`` is WAIT then GET, a
timed-out WAIT is followed by CANCEL_WAIT, and the server never times a request out.

:class:`TorchRequestParser` (server side) and :class:`TorchReplyParser` (client side, told
which request each reply answers) take bytes through ``feed`` and give messages through
``next`` (None until a whole one is there); ``encode_request`` / ``encode_reply`` are the
inverses. A malformed stream — a first query other than VALIDATE, a wrong magic number, an
unknown query type, a length or count over the bounds, a key that is not UTF-8 — raises
:class:`~pydist.store._protocol.ProtocolError`; the parser then stays broken.
"""
from __future__ import annotations

import struct
from collections import deque
from typing import Any, NamedTuple

from ._protocol import MAX_KEY_BYTES, MAX_MESSAGE_BYTES, MAX_VALUE_BYTES, Message, ProtocolError, StreamParser

#: The u32 a torch client sends in its VALIDATE query.
VALIDATION_MAGIC = 0x3C85F7CE
#: At most this many keys in one check/wait/multi_get/multi_set (torch's own bound).
MAX_KEY_COUNT = 128 * 1024
#: u8 answers: check's READY / NOT_READY, wait's STOP_WAITING / WAIT_CANCELED.
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class Query(NamedTuple):
    """A torch query type: its code (torch's QueryType), fields, and kind of reply."""

    code: int
    fields: str
    reply: str


#: torch's queries by the name this side gives them (pydist's names where they agree).
QUERIES: dict[str, Query] = {
    "validate": Query(0, "I", "none"),
    "set": Query(1, "sb", "none"),
    "compare_set": Query(2, "sbb", "value"),
    "get": Query(3, "s", "value"),
    "add": Query(4, "sq", "int"),
    "check": Query(5, "S", "check"),
    "wait": Query(6, "S", "stop"),
    "num_keys": Query(7, "", "int"),
    "delete_key": Query(8, "s", "int"),
    "append": Query(9, "sb", "none"),
    "multi_get": Query(10, "S", "values"),
    "multi_set": Query(11, "P", "none"),
    "cancel_wait": Query(12, "", "canceled"),
    "ping": Query(13, "I", "nonce"),
    "queue_push": Query(14, "sb", "none"),
    "queue_pop": Query(15, "s", "pop"),
    "queue_len": Query(16, "s", "int"),
    "list_keys": Query(17, "", "keys"),
    "barrier": Query(18, "sq", "stop"),
}
_BY_CODE = {query.code: name for name, query in QUERIES.items()}


def _put_bytes(out: bytearray, data: bytes) -> None:
    out += _U64.pack(len(data))
    out += data


def _put(out: bytearray, kind: str, value: Any) -> None:
    if kind == "s":
        _put_bytes(out, value.encode())
    elif kind == "b":
        _put_bytes(out, bytes(value))
    elif kind == "q":
        out += _I64.pack(value)
    elif kind == "I":
        out += _U32.pack(value)
    else:  # "S": a list of keys
        out += _U64.pack(len(value))
        for key in value:
            _put(out, "s", key)


def encode_request(msg: Message) -> bytes:
    """A query as a torch client sends it. KeyError for an unknown query name."""
    query = QUERIES[msg.name]
    out = bytearray(_U8.pack(query.code))
    if query.fields == "P":
        keys, values = msg.args
        out += _U64.pack(len(keys))
        for key, value in zip(keys, values, strict=True):
            _put(out, "s", key)
            _put(out, "b", value)
    else:
        for kind, value in zip(query.fields, msg.args, strict=True):
            _put(out, kind, value)
    return bytes(out)


def encode_reply(name: str, result: Any) -> bytes:
    """The server's answer to query ``name`` whose outcome is ``result`` (b"" for queries
    torch does not answer). ``result`` is: a bool for check; an int for add, num_keys,
    delete_key, queue_len and ping; bytes for get and compare_set; a list of bytes for
    multi_get; a list of str for list_keys; ``(queue length, value or None)`` for queue_pop;
    ignored for wait, barrier and cancel_wait."""
    kind = QUERIES[name].reply
    out = bytearray()
    if kind == "int":
        out += _I64.pack(int(result))
    elif kind == "nonce":
        out += _U32.pack(result)
    elif kind == "value":
        _put_bytes(out, result)
    elif kind == "values":
        for value in result:
            _put_bytes(out, value)
    elif kind == "check":
        out += _U8.pack(READY if result else NOT_READY)
    elif kind in ("stop", "canceled"):
        out += _U8.pack(STOP_WAITING if kind == "stop" else WAIT_CANCELED)
    elif kind == "pop":
        length, value = result
        out += _I64.pack(length)
        if length > 0:
            _put_bytes(out, value)
    elif kind == "keys":
        out += _I64.pack(len(result))
        for key in result:
            _put_bytes(out, key.encode())
    return bytes(out)


class _Short(Exception):
    """Not enough bytes yet: the parse needs the buffer to hold ``need`` bytes."""

    def __init__(self, need: int):
        self.need = need


class _Cursor:
    """Reads fields from the front of a buffer that may not hold a whole message yet."""

    def __init__(self, buf: bytearray):
        self._buf = buf
        self.pos = 0
        self._payload = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self._buf):
            raise _Short(end)
        data = bytes(self._buf[self.pos:end])
        self.pos = end
        return data

    def unpack(self, layout: struct.Struct) -> int:
        return layout.unpack(self.take(layout.size))[0]

    def count(self) -> int:
        n = self.unpack(_U64)
        if n > MAX_KEY_COUNT:
            raise ProtocolError(f"{n} keys in one query is over the limit of {MAX_KEY_COUNT}")
        return n

    def blob(self, limit: int) -> bytes:
        size = self.unpack(_U64)
        if size > limit:
            raise ProtocolError(f"field of {size} bytes is over the limit of {limit} bytes")
        self._payload += size
        if self._payload > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"query of over {MAX_MESSAGE_BYTES} bytes")
        return self.take(size)

    def key(self) -> str:
        data = self.blob(MAX_KEY_BYTES)
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"key is not valid UTF-8: {e}") from None

    def read(self, kind: str) -> Any:
        if kind == "s":
            return self.key()
        if kind == "b":
            return self.blob(MAX_VALUE_BYTES)
        if kind == "q":
            return self.unpack(_I64)
        if kind == "I":
            return self.unpack(_U32)
        return [self.key() for _ in range(self.count())]  # "S"

    def read_fields(self, fields: str) -> tuple[Any, ...]:
        if fields != "P":
            return tuple(self.read(kind) for kind in fields)
        keys: list[str] = []
        values: list[bytes] = []
        for _ in range(self.count()):
            keys.append(self.key())
            values.append(self.blob(MAX_VALUE_BYTES))
        return keys, values


class _StreamParser(StreamParser):
    """A torch stream: parse attempts wait until the buffer holds the bytes the last
    short attempt needed."""

    def __init__(self) -> None:
        super().__init__()
        self._need = 0  # bytes the buffer must hold before the next parse attempt

    def _next(self) -> Message | None:
        if len(self._buf) < self._need:
            return None
        cursor = _Cursor(self._buf)
        try:
            msg = self._parse(cursor)
        except _Short as short:
            self._need = short.need  # do not re-parse before those bytes are here
            return None
        del self._buf[:cursor.pos]
        self._need = 0
        return msg

    def _parse(self, cursor: _Cursor) -> Message:
        raise NotImplementedError


class TorchRequestParser(_StreamParser):
    """Parses what a torch client sends (server side)."""

    def __init__(self) -> None:
        super().__init__()
        self.validated = False

    def _parse(self, cursor: _Cursor) -> Message:
        code = cursor.unpack(_U8)
        name = _BY_CODE.get(code)
        if name is None:
            raise ProtocolError(f"unknown torch TCPStore query type {code}")
        if not self.validated and name != "validate":
            raise ProtocolError(f"torch TCPStore client sent {name} before VALIDATE")
        args = cursor.read_fields(QUERIES[name].fields)
        if name == "validate":
            if args[0] != VALIDATION_MAGIC:
                raise ProtocolError(f"bad torch TCPStore validation magic {args[0]:#x} "
                                    f"(expected {VALIDATION_MAGIC:#x})")
            self.validated = True
        return Message(name, args)


class TorchReplyParser(_StreamParser):
    """Parses what the server sends (client side). Call :meth:`expect` with each request
    as it is sent; replies come back as ``Message(request name, (result,))`` in order,
    with results as :func:`encode_reply` takes them (wait/barrier/cancel_wait: the u8)."""

    def __init__(self) -> None:
        super().__init__()
        self._expected: deque[Message] = deque()

    def expect(self, request: Message) -> None:
        """Note a sent request; one without a reply is ignored."""
        if QUERIES[request.name].reply != "none":
            self._expected.append(request)

    def _parse(self, cursor: _Cursor) -> Message:
        if not self._expected:
            if not self._buf:
                raise _Short(1)
            raise ProtocolError("the server sent bytes no request asked for")
        request = self._expected[0]
        kind = QUERIES[request.name].reply
        if kind == "int":
            result: Any = cursor.unpack(_I64)
        elif kind == "nonce":
            result = cursor.unpack(_U32)
        elif kind == "value":
            result = cursor.blob(MAX_VALUE_BYTES)
        elif kind == "values":
            result = [cursor.blob(MAX_VALUE_BYTES) for _ in request.args[0]]
        elif kind == "pop":
            length = cursor.unpack(_I64)
            result = (length, cursor.blob(MAX_VALUE_BYTES) if length > 0 else None)
        elif kind == "keys":
            result = [cursor.key() for _ in range(cursor.unpack(_I64))]
        else:  # a u8: check, stop, canceled
            result = self._code(kind, cursor.unpack(_U8))
        self._expected.popleft()
        return Message(request.name, (result,))

    @staticmethod
    def _code(kind: str, code: int) -> Any:
        if code not in (0, 1):
            raise ProtocolError(f"bad {kind} response code {code}")
        return code == READY if kind == "check" else code
