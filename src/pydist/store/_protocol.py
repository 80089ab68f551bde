"""The store's wire protocol (and FileStore's record log), pure sans-IO.

A stream starts with a 6-byte hello, ``MAGIC (4 bytes) + version (u16 LE)``, sent by each
side; then messages follow, each ``type (u8) + body length (u32 LE) + body``. The body is
a fixed sequence of fields, by message type:

    s  str    u32 length + UTF-8        (at most MAX_KEY_BYTES)
    b  bytes  u32 length + data         (at most MAX_VALUE_BYTES)
    q  int    i64
    S  list   u32 count + that many s
    B  list   u32 count + that many b

``encode_request`` / ``encode_response`` / ``encode_change`` turn a :class:`Message` into
bytes; :class:`RequestParser` (server side), :class:`ResponseParser` (client side) and
:class:`ChangeParser` (FileStore log) take bytes through ``feed`` and give messages through
``next`` (None until a whole message is there). A malformed stream — bad magic, other
version, unknown type, a length over the bounds, a body that does not match its type —
raises :class:`ProtocolError`; the parser then stays broken.

With a shared token (see :mod:`pydist.net.auth`) a pydist stream opens differently: the hello's
version has :data:`AUTH_FLAG` set and each side's hello carries its nonce, then the client
sends its proof and the server answers a status byte (:data:`AUTH_ACCEPTED` + its own proof,
or :data:`AUTH_REFUSED`)::

    client: MAGIC, u16 VERSION|AUTH_FLAG, nonce_c (32)     server: MAGIC, u16 VERSION|AUTH_FLAG, nonce_s (32)
    client: proof_c (32)                                   server: u8 1, proof_s (32)  |  u8 0, then close

Messages follow as above. :mod:`._auth_opening` runs that opening (``ClientOpening``,
``ServerOpening``). A server with a token answers a plain hello
with a hello whose version has only the flag meaning "authentication required" (the
client's parser raises :class:`AuthRequired`) and closes; a server without one answers an
authenticating hello with its plain hello and closes. Without a token nothing changes on
the wire.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..core.errors import DistStoreError, QueueEmptyError
from ..net.auth import NONCE_BYTES

VERSION = 1
WIRE_MAGIC = b"PDST"
FILE_MAGIC = b"PDSF"
MAX_KEY_BYTES = 64 * 1024
MAX_VALUE_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_BYTES = 512 * 1024 * 1024

_HEADER = struct.Struct("<BI")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
VERSION_FIELD = struct.Struct("<H")
HELLO_BYTES = len(WIRE_MAGIC) + VERSION_FIELD.size
#: Set in the hello's version by a side that authenticates (and in the "authentication
#: required" answer to one that does not).
AUTH_FLAG = 0x8000
AUTH_ACCEPTED, AUTH_REFUSED = 1, 0
AUTH_HELLO_BYTES = HELLO_BYTES + NONCE_BYTES


class ProtocolError(DistStoreError):
    """A peer or a file sent bytes that are not a valid store stream."""


class AuthRequired(ProtocolError):
    """The peer's hello says it authenticates (or requires it) and this side has no token."""


class AuthRefused(ProtocolError):
    """Server side: the client did not authenticate; ``reply`` is what to send it before
    closing the connection."""

    def __init__(self, message: str, reply: bytes):
        super().__init__(message)
        self.reply = reply


class Message(NamedTuple):
    """One request, response or change record: its type name and its fields in order."""

    name: str
    args: tuple[Any, ...]


class Op(NamedTuple):
    """A message type: wire code, field kinds, and for requests the response kind and
    whether it may block (blocking requests carry one more field: timeout in ms)."""

    code: int
    fields: str
    result: str = "ok"
    blocking: bool = False


#: Store operations; names match the methods of :class:`pydist.store._state.KVState`.
REQUESTS: dict[str, Op] = {
    "set": Op(1, "sb"),
    "add": Op(2, "sq", "int"),
    "compare_set": Op(3, "sbb", "bytes"),
    "append": Op(4, "sb"),
    "delete_key": Op(5, "s", "int"),
    "multi_set": Op(6, "SB"),
    "check": Op(7, "S", "int"),
    "num_keys": Op(8, "", "int"),
    "list_keys": Op(9, "", "strs"),
    "queue_push": Op(10, "sb"),
    "queue_len": Op(11, "s", "int"),
    "multi_get": Op(12, "S", "values", blocking=True),
    "wait": Op(13, "S", "ok", blocking=True),
    "queue_pop": Op(14, "s", "bytes", blocking=True),
}

#: Server answers. ``timeout`` carries the missing keys and the time waited (ms);
#: ``error`` an error code (see ERROR_TYPES) and a message.
RESPONSES: dict[str, Op] = {
    "ok": Op(1, ""),
    "int": Op(2, "q"),
    "bytes": Op(3, "b"),
    "strs": Op(4, "S"),
    "values": Op(5, "B"),
    "timeout": Op(6, "Sq"),
    "error": Op(7, "qs"),
}

#: FileStore log records: the primitive changes every operation reduces to.
CHANGES: dict[str, Op] = {
    "set": Op(1, "sb"),
    "del": Op(2, "s"),
    "push": Op(3, "sb"),
    "pop": Op(4, "s"),
}

#: Exception types an ``error`` response re-raises on the client, by code.
ERROR_TYPES: dict[int, type[Exception]] = {1: ValueError, 2: DistStoreError, 3: QueueEmptyError}


def error_code(exc: BaseException) -> int:
    """The ``error`` response code that re-raises ``exc``'s kind on the client."""
    for code in (3, 2, 1):
        if isinstance(exc, ERROR_TYPES[code]):
            return code
    return 2


def wire_fields(op: Op) -> str:
    """The fields of a request on the wire: a blocking request adds its timeout (ms)."""
    return op.fields + "q" if op.blocking else op.fields


class _Table:
    """A set of message types, looked up by name (encoding) and by code (parsing)."""

    def __init__(self, ops: dict[str, Op], requests: bool = False):
        self.by_name = {name: (op.code, wire_fields(op) if requests else op.fields) for name, op in ops.items()}
        self.by_code = {code: (name, fields) for name, (code, fields) in self.by_name.items()}


_REQUEST_TABLE = _Table(REQUESTS, requests=True)
_RESPONSE_TABLE = _Table(RESPONSES)
_CHANGE_TABLE = _Table(CHANGES)


def hello(magic: bytes = WIRE_MAGIC) -> bytes:
    """The 6 bytes that open a stream: magic and protocol version."""
    return magic + VERSION_FIELD.pack(VERSION)


def _checked(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise ValueError(f"{what} of {len(data)} bytes is over the limit of {limit} bytes")
    return data


def _put(out: bytearray, kind: str, value: Any) -> None:
    if kind == "q":
        out += _I64.pack(value)
    elif kind in "SB":
        out += _U32.pack(len(value))
        for item in value:
            _put(out, kind.lower(), item)
    else:
        if kind == "s":
            data = _checked(value.encode(), MAX_KEY_BYTES, "key")
        else:
            data = _checked(value, MAX_VALUE_BYTES, "value")
        out += _U32.pack(len(data))
        out += data


def _encode(table: _Table, msg: Message) -> bytes:
    code, fields = table.by_name[msg.name]
    if len(msg.args) != len(fields):
        raise ValueError(f"{msg.name}: expected {len(fields)} fields, got {len(msg.args)}")
    body = bytearray()
    for kind, value in zip(fields, msg.args):
        _put(body, kind, value)
    if len(body) > MAX_MESSAGE_BYTES:
        raise ValueError(f"{msg.name}: message of {len(body)} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes")
    return _HEADER.pack(code, len(body)) + body


def encode_request(msg: Message) -> bytes:
    """A request as bytes. Raises KeyError for an unknown op, ValueError for a key or
    value over the size bounds or a wrong field count."""
    return _encode(_REQUEST_TABLE, msg)


def encode_response(msg: Message) -> bytes:
    """A response as bytes (same failure modes as :func:`encode_request`)."""
    return _encode(_RESPONSE_TABLE, msg)


def encode_change(msg: Message) -> bytes:
    """A FileStore log record as bytes."""
    return _encode(_CHANGE_TABLE, msg)


def encode_changes(changes: Iterable[Message]) -> bytes:
    """Several log records, concatenated."""
    return b"".join(encode_change(m) for m in changes)


class _Reader:
    """Reads fields from one complete message body; any mismatch is a ProtocolError."""

    def __init__(self, body: bytes):
        self._body = body
        self._pos = 0

    def _take(self, n: int) -> bytes:
        if n > len(self._body) - self._pos:
            raise ProtocolError(f"field of {n} bytes runs past the end of the message")
        data = self._body[self._pos:self._pos + n]
        self._pos += n
        return data

    def _u32(self) -> int:
        return _U32.unpack(self._take(_U32.size))[0]

    def read(self, kind: str) -> Any:
        if kind == "q":
            return _I64.unpack(self._take(_I64.size))[0]
        if kind in "SB":
            return [self.read(kind.lower()) for _ in range(self._u32())]
        size = self._u32()
        limit = MAX_KEY_BYTES if kind == "s" else MAX_VALUE_BYTES
        if size > limit:
            raise ProtocolError(f"field of {size} bytes is over the limit of {limit} bytes")
        data = self._take(size)
        if kind == "b":
            return data
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise ProtocolError(f"key is not valid UTF-8: {e}") from None

    def end(self) -> None:
        if self._pos != len(self._body):
            raise ProtocolError(f"{len(self._body) - self._pos} unexpected bytes at the end of a message")


class StreamParser:
    """Incremental parser of one stream: ``feed(bytes)``, then ``next()`` until None.
    Subclasses implement ``_next`` (a whole message from ``self._buf``, or None)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._error: ProtocolError | None = None

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole message (non-zero: mid-message)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        self._buf += data

    def next(self) -> Message | None:
        """The next whole message, or None if more bytes are needed. Raises ProtocolError
        (again on every later call) if the stream is malformed."""
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ProtocolError as e:
            self._error = e
            raise

    def _next(self) -> Message | None:
        raise NotImplementedError


class Parser(StreamParser):
    """A pydist store stream's parser (see the module docstring)."""

    def __init__(self, table: _Table, magic: bytes):
        super().__init__()
        self._table = table
        self._magic = magic
        self.handshaken = False

    def _next(self) -> Message | None:
        buf = self._buf
        if not self.handshaken and not self._handshake():
            return None
        if not buf:
            return None
        entry = self._table.by_code.get(buf[0])
        if entry is None:
            raise ProtocolError(f"unknown message type {buf[0]}")
        if len(buf) < _HEADER.size:
            return None
        length = _HEADER.unpack_from(buf)[1]
        if length > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message length {length} is over the limit of {MAX_MESSAGE_BYTES} bytes")
        end = _HEADER.size + length
        if len(buf) < end:
            return None
        reader = _Reader(bytes(buf[_HEADER.size:end]))
        del buf[:end]
        name, fields = entry
        args = tuple(reader.read(kind) for kind in fields)
        reader.end()
        return Message(name, args)

    def _handshake(self) -> bool:
        seen = bytes(self._buf[:len(self._magic)])
        if not self._magic.startswith(seen):
            raise ProtocolError(f"bad magic {seen!r} (expected {self._magic!r}): not a pydist store stream")
        if len(self._buf) < HELLO_BYTES:
            return False
        version = VERSION_FIELD.unpack_from(self._buf, len(self._magic))[0]
        if version & AUTH_FLAG and self._magic == WIRE_MAGIC:
            raise AuthRequired("the peer authenticates with a shared token (PYDIST_AUTH_TOKEN) and this side has none")
        if version != VERSION:
            raise ProtocolError(f"protocol version {version} is not supported (this side speaks {VERSION})")
        del self._buf[:HELLO_BYTES]
        self.handshaken = True
        return True


class RequestParser(Parser):
    """Parses what a client sends (server side)."""

    def __init__(self) -> None:
        super().__init__(_REQUEST_TABLE, WIRE_MAGIC)


class ResponseParser(Parser):
    """Parses what the server sends (client side)."""

    def __init__(self) -> None:
        super().__init__(_RESPONSE_TABLE, WIRE_MAGIC)


class ChangeParser(Parser):
    """Parses a FileStore record log."""

    def __init__(self) -> None:
        super().__init__(_CHANGE_TABLE, FILE_MAGIC)


def auth_hello(nonce: bytes = b"") -> bytes:
    """An authenticating hello carrying ``nonce`` (none: the "authentication required" answer)."""
    return WIRE_MAGIC + VERSION_FIELD.pack(VERSION | AUTH_FLAG) + nonce
