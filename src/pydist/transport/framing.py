"""The transport's frame format, sans-IO: encode a header, decode a byte stream into events.

Every frame is a fixed 48-byte header followed by ``nbytes`` of payload::

    magic u16 'PD' | version u8 | kind u8 | flags u32 | group u64 | seq u64 | tag i64 | nbytes u64
    | call u64

(little endian). ``call`` is the sender's call fingerprint (``pydist.core.fingerprint.fingerprint``:
operation, dtype, count, root, reduce op; 0 for point-to-point), which the receiver
compares with its own to detect ranks that called different operations.
``FrameDecoder.feed(data)`` turns any split of the stream, down to one byte at a time, into
``Header`` events each followed by its payload as ``Chunk`` events.
A length is checked when its header is parsed, before anything is allocated: a control frame
carries at most ``CONTROL_LIMITS[kind]`` bytes, any frame at most MAX_PAYLOAD (a DATA frame's
length is then checked against its receive, see matching); beyond is a FramingError.
A caller that reads a large payload straight into its destination (no copy through the
decoder) reports those bytes with ``skip_payload(n)``. No sockets here.
"""
from __future__ import annotations

import enum
import struct
from typing import NamedTuple

MAGIC = 0x4450  # b"PD" little endian
VERSION = 2
HEADER = struct.Struct("<HBBIQQqQQ")
HEADER_SIZE = HEADER.size  # 48
MAX_PAYLOAD = 1 << 48


class Kind(enum.IntEnum):
    DATA = 0    # a message for (group, seq, tag)
    HELLO = 1   # first frame on a connection: payload is the sender's handshake
    BYE = 2     # the sender shut down cleanly; EOF follows (payload: why it evicted the receiver, if it did)
    ABORT = 3   # the sender failed an operation of ``group``; payload is its message
    BEAT = 4    # the sender is alive: sent on a connection idle for a third of PYDIST_PEER_TIMEOUT


#: The most payload a control frame of each kind carries: a HELLO's handshake fields, a BYE's
#: reason (see tcp.connection.notify), an ABORT's account (see abort.abort_payload, which clips
#: its message to fit), a BEAT's nothing.
CONTROL_LIMITS = {Kind.HELLO: 4096, Kind.BYE: 64 << 10, Kind.ABORT: 4 << 20, Kind.BEAT: 0}


class FramingError(ValueError):
    """The byte stream is not pydist frames (bad magic, version, kind or length)."""


class Header(NamedTuple):
    kind: Kind
    group: int
    seq: int
    tag: int
    nbytes: int
    call: int = 0


def encode_header(kind: Kind, group: int, seq: int, tag: int, nbytes: int, call: int = 0) -> bytes:
    """The 48 header bytes of one frame."""
    return HEADER.pack(MAGIC, VERSION, kind, 0, group, seq, tag, nbytes, call)


def pack_header_into(buffer: memoryview, offset: int, kind: Kind, group: int, seq: int, tag: int, nbytes: int,
                     call: int = 0) -> None:
    """Write the 48 header bytes of one frame into ``buffer`` at ``offset`` (no intermediate bytes)."""
    HEADER.pack_into(buffer, offset, MAGIC, VERSION, kind, 0, group, seq, tag, nbytes, call)


def encode_frame(kind: Kind, group: int, seq: int, tag: int, payload: bytes = b"") -> bytes:
    """A whole frame (header and payload) as bytes: for small control frames."""
    return encode_header(kind, group, seq, tag, len(payload)) + payload


_KINDS = {kind.value: kind for kind in Kind}


def decode_header(data: bytes | memoryview, offset: int = 0) -> Header:
    """Parse the HEADER_SIZE bytes of ``data`` at ``offset``; FramingError when they are
    not a pydist header."""
    magic, version, code, _flags, group, seq, tag, nbytes, call = HEADER.unpack_from(data, offset)
    if magic != MAGIC:
        raise FramingError(f"bad frame magic 0x{magic:04x} (expected 0x{MAGIC:04x}): not a pydist peer")
    if version != VERSION:
        raise FramingError(f"peer speaks frame version {version}, this rank speaks {VERSION}")
    kind = _KINDS.get(code)
    if kind is None:
        raise FramingError(f"unknown frame kind {code}")
    limit = CONTROL_LIMITS.get(kind, MAX_PAYLOAD)
    if nbytes > limit:
        raise FramingError(f"a {kind.name} frame of {nbytes} bytes is beyond the limit (a {kind.name} carries "
                           f"at most {limit} bytes)")
    return Header(kind, group, seq, tag, nbytes, call)


class Chunk(NamedTuple):
    """Part of the current frame's payload; ``last`` when it completes the frame."""
    data: memoryview
    last: bool


class FrameDecoder:
    """Stateful splitter of a byte stream into Header events and payload chunks."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self.payload_left = 0  # payload bytes of the current frame not yet delivered

    def feed(self, data: bytes | bytearray | memoryview) -> list[Header | Chunk]:
        """Consume all of ``data``; return the events it completes, in stream order.

        Payload chunks are views into ``data``: use them before reusing its memory. A frame
        with an empty payload has no Chunk.
        """
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        events: list[Header | Chunk] = []
        pos, end = 0, len(view)
        while pos < end:
            if self.payload_left:
                take = min(self.payload_left, end - pos)
                self.payload_left -= take
                events.append(Chunk(view[pos:pos + take], self.payload_left == 0))
                pos += take
                continue
            if not self._partial and end - pos >= HEADER_SIZE:  # a whole header here: no staging
                header = decode_header(view, pos)
                pos += HEADER_SIZE
                self.payload_left = header.nbytes
                events.append(header)
                continue
            take = min(HEADER_SIZE - len(self._partial), end - pos)
            self._partial += view[pos:pos + take]
            pos += take
            if len(self._partial) == HEADER_SIZE:
                header = decode_header(bytes(self._partial))
                self._partial.clear()
                self.payload_left = header.nbytes
                events.append(header)
        return events

    def at_boundary(self) -> bool:
        """No frame is partly decoded: the next byte fed starts a header."""
        return not self.payload_left and not self._partial

    def skip_payload(self, n: int) -> None:
        """Account for ``n`` payload bytes the caller read directly into its destination."""
        if n > self.payload_left:
            raise ValueError(f"skip_payload({n}) beyond the {self.payload_left} bytes left")
        self.payload_left -= n
