"""The transport's sans-IO frame decoder, fed in every split down to one byte at a time."""
import random

import pytest

from pydist.transport.framing import (
    HEADER_SIZE,
    Chunk,
    FrameDecoder,
    FramingError,
    Header,
    Kind,
    encode_frame,
    encode_header,
)

FRAMES = [
    (Kind.DATA, 1, 2, 3, b"hello"),
    (Kind.DATA, 2**64 - 1, 2**63, -5, b""),
    (Kind.BYE, 0, 0, 0, b""),
    (Kind.ABORT, 7, 9, 0, "group failed: rank 3 ✗".encode()),
    (Kind.DATA, 0, 1, 1 << 40, bytes(range(256)) * 40),
]


def stream() -> bytes:
    return b"".join(encode_frame(kind, group, seq, tag, payload) for kind, group, seq, tag, payload in FRAMES)


def decode(pieces) -> list:
    """Reassemble (header, payload) pairs from the decoder's events."""
    decoder, frames, payload, header = FrameDecoder(), [], bytearray(), None
    for piece in pieces:
        for event in decoder.feed(piece):
            if isinstance(event, Header):
                header, payload = event, bytearray()
                if event.nbytes == 0:
                    frames.append((header, b""))
            else:
                assert isinstance(event, Chunk)
                payload += event.data
                if event.last:
                    frames.append((header, bytes(payload)))
    return frames


def expected() -> list:
    return [(Header(kind, group, seq, tag, len(payload)), payload) for kind, group, seq, tag, payload in FRAMES]


def test_whole_stream_in_one_feed():
    assert decode([stream()]) == expected()


def test_one_byte_at_a_time():
    data = stream()
    assert decode([data[i:i + 1] for i in range(len(data))]) == expected()


@pytest.mark.parametrize("seed", range(20))
def test_random_splits(seed):
    data, rng, pieces, pos = stream(), random.Random(seed), [], 0
    while pos < len(data):
        step = rng.randint(1, 300)
        pieces.append(memoryview(data)[pos:pos + step])
        pos += step
    assert decode(pieces) == expected()


def test_last_flag_is_per_frame_when_frames_share_a_feed():
    """A chunk completes its own frame even when later frames are in the same feed."""
    data = encode_frame(Kind.DATA, 1, 1, 0, b"abc") + encode_frame(Kind.DATA, 1, 2, 0, b"defgh")
    events = FrameDecoder().feed(data)
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert [bytes(c.data) for c in chunks] == [b"abc", b"defgh"]
    assert [c.last for c in chunks] == [True, True]


def test_skip_payload_for_direct_reads():
    decoder = FrameDecoder()
    events = decoder.feed(encode_header(Kind.DATA, 1, 1, 0, 100) + b"x" * 10)
    assert isinstance(events[0], Header) and decoder.payload_left == 90
    decoder.skip_payload(90)
    assert decoder.payload_left == 0
    with pytest.raises(ValueError):
        decoder.skip_payload(1)
    assert isinstance(decoder.feed(encode_header(Kind.BYE, 0, 0, 0, 0))[0], Header)


@pytest.mark.parametrize("garbage, message", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * HEADER_SIZE, "magic"),
    (encode_header(Kind.DATA, 0, 0, 0, 0)[:2] + b"\x09" + encode_header(Kind.DATA, 0, 0, 0, 0)[3:], "version"),
    (encode_header(Kind.DATA, 0, 0, 0, 0)[:3] + b"\x77" + encode_header(Kind.DATA, 0, 0, 0, 0)[4:], "kind"),
    (encode_header(Kind.DATA, 0, 0, 0, 1 << 60), "limit"),
])
def test_garbage_is_rejected(garbage, message):
    with pytest.raises(FramingError, match=message):
        FrameDecoder().feed(garbage)
