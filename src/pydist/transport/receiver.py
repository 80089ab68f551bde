"""One peer's incoming byte stream turned into deliveries (shared by the tcp and shm transports).

Frames are decoded sans-IO; a DATA frame goes where the matcher's Delivery says (straight
into its posted receive, or held as unexpected; see matching); BYE, ABORT and BEAT frames go to
``on_control``. A transport that
can read a large payload directly into its destination asks ``direct_view`` for the place
and reports with ``direct_done``. A receive cancelled while its frame arrives gets no more
of it (the rest is read and dropped); only a read already under way when it is cancelled
may still land.
"""
from __future__ import annotations

from collections.abc import Callable

from .base import MessageKey
from .framing import HEADER_SIZE, Chunk, FrameDecoder, FramingError, Header, Kind, decode_header
from .matching import Delivery, Matcher


class FrameReceiver:
    """Decoding and delivery state for the frames coming from one peer."""

    def __init__(self, peer: int, matcher: Matcher, on_control: Callable[[Header, bytes], None]):
        self.peer = peer
        self.matcher = matcher
        self.on_control = on_control
        self.decoder = FrameDecoder()
        self._header: Header | None = None
        self._delivery: Delivery | None = None  # a DATA frame's
        self._control: bytearray | None = None  # a BYE or ABORT frame's payload
        self._filled = 0

    def feed(self, data: memoryview) -> None:
        """Consume bytes of the stream (any split); FramingError on garbage. Whole frames
        at the start of ``data`` are delivered without the decoder's events (the small-
        message path); the rest goes through it."""
        pos, end = 0, data.nbytes
        while end - pos >= HEADER_SIZE and self._header is None and self.decoder.at_boundary():
            header = decode_header(data, pos)
            stop = pos + HEADER_SIZE + header.nbytes
            if stop > end:
                break
            self._start(header)
            if header.nbytes:
                self._payload(Chunk(data[pos + HEADER_SIZE:stop], True))
            pos = stop
        if pos == end:
            return
        for event in self.decoder.feed(data[pos:] if pos else data):
            if isinstance(event, Header):
                self._start(event)
            else:
                self._payload(event)

    def direct_view(self, minimum: int) -> memoryview | None:
        """Where the rest of the current payload goes, when at least ``minimum`` bytes remain."""
        dest = self._destination()
        if dest is None or self.decoder.payload_left < minimum:
            return None
        return dest[self._filled:self._filled + self.decoder.payload_left]

    def direct_done(self, nbytes: int) -> None:
        """``nbytes`` of payload were written into ``direct_view()`` by the caller."""
        self.decoder.skip_payload(nbytes)
        self._filled += nbytes
        if self.decoder.payload_left == 0:
            self._finish()

    def between_frames(self) -> bool:
        """No frame is being received (its header seen, its payload not all in)."""
        return self._header is None

    def abandon(self, error: BaseException) -> None:
        """The stream broke: fail the receive being filled, if any (see Delivery.broken)."""
        if self._delivery is not None and self._header is not None:
            self._delivery.broken(error, self._header.group)
        self._header, self._delivery, self._control = None, None, None

    def _start(self, header: Header) -> None:
        self._header, self._filled = header, 0
        if header.kind == Kind.DATA:
            self._delivery = self.matcher.arrive(self.peer, MessageKey(header.group, header.seq, header.tag),
                                                 header.nbytes, header.call)
        elif header.kind in (Kind.ABORT, Kind.BYE, Kind.BEAT):
            self._control = bytearray(header.nbytes)
        else:
            raise FramingError(f"unexpected {header.kind.name} frame from rank {self.peer}")
        if header.nbytes == 0:
            self._finish()

    def _destination(self) -> memoryview | None:
        """Where the current payload goes; None once its receive finished meanwhile (the
        rest of the frame is read and dropped)."""
        if self._delivery is not None:
            return self._delivery.into()
        return memoryview(self._control) if self._control is not None else None

    def _payload(self, chunk: Chunk) -> None:
        size = chunk.data.nbytes
        dest = self._destination()
        if dest is not None:
            dest[self._filled:self._filled + size] = chunk.data
        self._filled += size
        if chunk.last:
            self._finish()

    def _finish(self) -> None:
        header, delivery, control = self._header, self._delivery, self._control
        assert header is not None  # _finish ends the frame _start began
        self._header, self._delivery, self._control = None, None, None
        if delivery is not None:
            delivery.landed()
        elif control is not None:
            self.on_control(header, bytes(control))
