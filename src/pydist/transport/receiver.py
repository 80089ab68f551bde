"""One peer's incoming byte stream turned into deliveries (shared by the tcp and shm transports).

Frames are decoded sans-IO; a DATA frame goes straight into its posted receive, or is held
as unexpected (see _matching); BYE and ABORT frames go to ``on_control``. A transport that
can read a large payload directly into its destination asks ``direct_view`` for the place
and reports with ``direct_done``. A receive cancelled while its frame arrives gets no more
of it (the rest is read and dropped); only a read already under way when it is cancelled
may still land.
"""
from __future__ import annotations

from typing import Callable

from .base import MessageKey, Request
from .framing import HEADER_SIZE, Chunk, FrameDecoder, FramingError, Header, Kind, decode_header
from .matching import Matcher, Unexpected, mismatch


class FrameReceiver:
    """Decoding and delivery state for the frames coming from one peer."""

    def __init__(self, peer: int, matcher: Matcher, on_control: Callable[[Header, bytes], None]):
        self.peer = peer
        self.matcher = matcher
        self.on_control = on_control
        self.decoder = FrameDecoder()
        self._header: Header | None = None
        self._target: Request | Unexpected | bytearray | None = None
        self._dest: memoryview | None = None
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
        """The stream broke: fail the receive being filled, if any, with ``error``, or with
        the abort of its group when a peer aborted it first (the root cause: a peer that
        raised, aborted the group and left broke the stream only after)."""
        if isinstance(self._target, Request):
            aborted = self.matcher.aborted(self._header.group) if self._header is not None else None
            self._target.complete(aborted or error)
        self._header, self._target, self._dest = None, None, None

    def _start(self, header: Header) -> None:
        self._header, self._filled = header, 0
        if header.kind == Kind.DATA:
            key = MessageKey(header.group, header.seq, header.tag)
            target = self.matcher.arrive(self.peer, key, header.nbytes, header.call)
            if isinstance(target, Unexpected):
                self._target, self._dest = target, memoryview(target.data)
            elif (error := mismatch(target, self.peer, key, header.nbytes, header.call)) is not None:
                target.complete(error)
                self._target, self._dest = None, None
            else:
                self._target, self._dest = target, target.buffer
        elif header.kind in (Kind.ABORT, Kind.BYE):
            self._target = bytearray(header.nbytes)
            self._dest = memoryview(self._target)
        else:
            raise FramingError(f"unexpected {header.kind.name} frame from rank {self.peer}")
        if header.nbytes == 0:
            self._finish()

    def _destination(self) -> memoryview | None:
        """Where the current payload goes; None for a refused frame, or once its receive
        finished meanwhile (cancelled after an error: its buffer is the caller's again, so
        the rest of the frame is read and dropped)."""
        if self._dest is not None and isinstance(self._target, Request) and self._target._completed:
            self._dest = None
        return self._dest

    def _payload(self, chunk: Chunk) -> None:
        size = chunk.data.nbytes
        dest = self._destination()
        if dest is not None:
            dest[self._filled:self._filled + size] = chunk.data
        self._filled += size
        if chunk.last:
            self._finish()

    def _finish(self) -> None:
        header, target = self._header, self._target
        assert header is not None  # _finish ends the frame _start began
        self._header, self._target, self._dest = None, None, None
        if isinstance(target, Request):
            target.complete(source=self.peer)
        elif isinstance(target, Unexpected):
            self.matcher.unexpected_done(target)
        elif header.kind in (Kind.BYE, Kind.ABORT):
            assert isinstance(target, bytearray)  # _start gave control frames a bytearray
            self.on_control(header, bytes(target))
