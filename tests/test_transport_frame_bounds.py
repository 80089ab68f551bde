"""Lengths from a peer are checked before anything is allocated (issue 46): a control frame
(HELLO, BYE, ABORT, BEAT) carries at most a small payload of its kind; a DATA frame is held
to the size of the receive posted for it, and one that arrives before its receive is held
only within what this process can hold. Sans-IO: a FrameReceiver and a Matcher, fed bytes."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pydist.core.errors import DistBackendError
from pydist.testing.wiring import wired_matcher
from pydist.transport import matching
from pydist.transport.base import MessageKey, Request
from pydist.transport.framing import CONTROL_LIMITS, FramingError, Kind, encode_frame, encode_header
from pydist.transport.matching import HELD_OVERHEAD
from pydist.transport.memory import memory_limit
from pydist.transport.receiver import FrameReceiver

KEY = MessageKey(5, 1, 0)


def _receiver(matcher=None, controls=None) -> FrameReceiver:
    matcher = matcher if matcher is not None else wired_matcher()
    return FrameReceiver(3, matcher, lambda header, payload: controls.append((header, payload))
                         if controls is not None else None)


@pytest.mark.parametrize("kind", [Kind.BEAT, Kind.BYE, Kind.ABORT, Kind.HELLO])
def test_a_control_frame_over_its_limit_is_refused_at_its_header(kind):
    """A 48-byte header claiming one byte more than its kind carries is refused as soon as it
    is parsed, naming the kind and its limit; nothing of the claimed size is allocated."""
    limit = CONTROL_LIMITS[kind]
    claimed = limit + 1
    tracemalloc.start()
    try:
        with pytest.raises(FramingError, match=rf"{kind.name} frame of {claimed} bytes.*at most {limit}"):
            _receiver().feed(memoryview(encode_header(kind, 0, 0, 0, claimed)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, f"{peak} bytes allocated for a refused {kind.name} header"


def test_a_two_gib_beat_costs_nothing():
    """The issue's attack: a heartbeat claiming 2 GiB."""
    tracemalloc.start()
    try:
        with pytest.raises(FramingError, match="BEAT frame of 2147483648 bytes"):
            _receiver().feed(memoryview(encode_header(Kind.BEAT, 0, 0, 0, 2 << 30)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10


@pytest.mark.parametrize("kind", [Kind.BYE, Kind.ABORT])
def test_a_control_frame_at_its_limit_is_delivered(kind):
    controls: list = []
    payload = b"x" * CONTROL_LIMITS[kind]
    _receiver(controls=controls).feed(memoryview(encode_frame(kind, 7, 0, 0, payload)))
    assert [(h.kind, p) for h, p in controls] == [(kind, payload)]


def test_the_limits_are_small():
    assert CONTROL_LIMITS[Kind.BEAT] == 0
    assert max(CONTROL_LIMITS.values()) <= 4 << 20


def test_a_data_frame_longer_than_its_posted_receive_fails_that_receive_and_allocates_nothing():
    """The receive fails naming the sender and both sizes; the frame's payload is read and
    dropped (nothing lands in the buffer, nothing of its size is allocated), and the stream
    goes on: the next frame reaches its receive."""
    matcher = wired_matcher()
    receiver = _receiver(matcher)
    small, after = np.zeros(4, np.uint8), np.zeros(3, np.uint8)
    first, second = Request(3, small.data), Request(3, after.data)
    matcher.post(first, 3, KEY)
    matcher.post(second, 3, KEY)
    claimed = 256 << 20
    tracemalloc.start()
    try:
        receiver.feed(memoryview(encode_header(Kind.DATA, *KEY, claimed)))
        chunk = memoryview(b"\x07" * (1 << 20))
        for _ in range(claimed >> 20):
            receiver.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak} bytes allocated for a frame refused by its receive"
    assert isinstance(first.error, DistBackendError)
    assert "rank 3 sent 268435456 bytes" in str(first.error) and "expects 4 bytes" in str(first.error)
    assert not small.any()
    receiver.feed(memoryview(encode_frame(Kind.DATA, *KEY, b"abc")))
    assert second.done() and second.error is None and bytes(after) == b"abc"


def test_a_message_larger_than_this_process_can_hold_is_refused_before_allocating():
    """No receive posted: a header claiming more than the memory this process may use (here
    128 TiB) is the sender's failure (FramingError naming it), not a MemoryError."""
    claimed = 1 << 47
    assert claimed > memory_limit()
    with pytest.raises(FramingError, match=r"rank 3 .*140737488355328 bytes.*no receive"):
        _receiver().feed(memoryview(encode_header(Kind.DATA, *KEY, claimed)))


def test_the_bytes_held_for_one_peer_are_bounded_across_messages():
    """Messages held for receives not yet posted count together: one that would take the
    peer's total past the bound is refused; other peers are not charged for it."""
    matcher = matching.Matcher(wired_matcher().events, 1 << 20, hold_bound=10 << 20)
    receiver = FrameReceiver(3, matcher, lambda header, payload: None)
    receiver.feed(memoryview(encode_header(Kind.DATA, 5, 1, 0, 6 << 20)))
    receiver.feed(memoryview(bytes(6 << 20)))
    held = (6 << 20) + HELD_OVERHEAD
    with pytest.raises(FramingError, match=rf"rank 3 .*6291456 bytes.*{held} bytes already held.*10485760"):
        receiver.feed(memoryview(encode_header(Kind.DATA, 5, 2, 0, 6 << 20)))
    other = FrameReceiver(4, matcher, lambda header, payload: None)
    other.feed(memoryview(encode_header(Kind.DATA, 5, 2, 0, 6 << 20)))


def test_a_flood_of_empty_messages_counts_against_the_peer():
    """Empty data frames for operations not started cost their bookkeeping each: enough of
    them pause the peer as its bytes would (tcp then stops reading it), and they count
    towards the bound on what is held for it."""
    limit = 1 << 20
    matcher = wired_matcher(held_limit=limit)
    receiver = FrameReceiver(3, matcher, lambda header, payload: None)
    flood = b"".join(encode_header(Kind.DATA, 5, seq, 0, 0) for seq in range(limit // HELD_OVERHEAD))
    receiver.feed(memoryview(flood))
    assert matcher.should_pause(3)
    matcher.post(Request(3, memoryview(bytearray(0))), 3, MessageKey(5, 0, 0))
    assert matcher.throttle.held[3] == limit - HELD_OVERHEAD


def test_an_allocation_that_fails_is_the_senders_failure(monkeypatch):
    """Within the bound, the allocation may still fail (strict overcommit, a fragmented
    address space): a FramingError naming the sender, with the MemoryError as its cause."""
    def refuse(nbytes: int):
        raise MemoryError(nbytes)
    monkeypatch.setattr(matching, "allocate", refuse)
    with pytest.raises(FramingError, match=r"rank 3 .*1048576 bytes.*cannot be allocated") as caught:
        _receiver().feed(memoryview(encode_header(Kind.DATA, *KEY, 1 << 20)))
    assert isinstance(caught.value.__cause__, MemoryError)


def test_memory_limit_is_at_most_the_machine():
    import os
    assert 0 < memory_limit() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_pydist_never_sends_a_control_frame_over_its_limit():
    """An abort of a huge error message (non-ASCII: JSON escapes it), naming 100,000 ranks
    dead, and an eviction notice of a huge reason, stay inside their kinds' limits."""
    from pydist.transport.abort import abort_payload
    from pydist.transport.tcp.connection import notice_payload
    payload = abort_payload(RuntimeError("\u2603" * 10**6), range(100_000))
    assert len(payload) <= CONTROL_LIMITS[Kind.ABORT]
    assert len(notice_payload("\u2603" * 10**6)) <= CONTROL_LIMITS[Kind.BYE]
