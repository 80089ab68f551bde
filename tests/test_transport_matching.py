"""Matching of posted receives and arriving messages (the transports' shared core), with the
knowledge it asks of the layer above (a GroupStates: aborted groups, gone ranks)."""
import threading

import numpy as np
import pytest

from pydist.core.errors import DistBackendError, PeerFailedError
from pydist.testing.wiring import wired_matcher
from pydist.transport.base import MessageKey, Request
from pydist.transport.matching import HELD_OVERHEAD, Matcher, deliver_whole

KEY = MessageKey(1, 0, 5)


def recv_request(nbytes: int, peer=None) -> Request:
    return Request(peer, memoryview(bytearray(nbytes)))


def deliver(matcher: Matcher, source: int, key: MessageKey, payload: bytes) -> None:
    deliver_whole(matcher, source, key, memoryview(payload))


def test_posted_first_then_arrival():
    matcher, request = wired_matcher(), recv_request(3, 2)
    matcher.post(request, 2, KEY)
    deliver(matcher, 2, KEY, b"abc")
    assert request.done() and bytes(request.buffer) == b"abc" and request.source == 2


def test_arrival_first_is_held_then_matched():
    matcher, request = wired_matcher(), recv_request(3, 2)
    deliver(matcher, 2, KEY, b"xyz")
    matcher.post(request, 2, KEY)
    assert request.done() and bytes(request.buffer) == b"xyz"


def test_fifo_per_source_and_key():
    matcher = wired_matcher()
    for payload in (b"1", b"2", b"3"):
        deliver(matcher, 0, KEY, payload)
    got = []
    for _ in range(3):
        request = recv_request(1, 0)
        matcher.post(request, 0, KEY)
        got.append(bytes(request.buffer))
    assert got == [b"1", b"2", b"3"]


def test_in_flight_unexpected_is_not_overtaken():
    """A receive posted while an unexpected message is still arriving waits for that one."""
    matcher = wired_matcher()
    first = matcher.arrive(0, KEY, 1)
    early = recv_request(1, 0)
    matcher.post(early, 0, KEY)
    assert not early.done()
    second = matcher.arrive(0, KEY, 1)
    second.into()[:] = b"B"
    second.landed()
    first.into()[:] = b"A"
    first.landed()
    assert bytes(early.buffer) == b"A" and early.done()


def test_any_source_takes_the_earliest_arrival():
    matcher = wired_matcher()
    deliver(matcher, 3, KEY, b"c")
    deliver(matcher, 1, KEY, b"a")
    request = recv_request(1)
    matcher.post(request, None, KEY)
    assert request.source == 3 and bytes(request.buffer) == b"c"
    specific = recv_request(1, 1)
    matcher.post(specific, 1, KEY)
    assert bytes(specific.buffer) == b"a"


def test_any_source_and_specific_posted_in_order():
    matcher = wired_matcher()
    anywhere, specific = recv_request(1), recv_request(1, 4)
    matcher.post(anywhere, None, KEY)
    matcher.post(specific, 4, KEY)
    deliver(matcher, 4, KEY, b"1")
    deliver(matcher, 4, KEY, b"2")
    assert bytes(anywhere.buffer) == b"1" and bytes(specific.buffer) == b"2"


def test_keys_do_not_mix():
    matcher = wired_matcher()
    deliver(matcher, 0, MessageKey(1, 0, 6), b"6")
    request = recv_request(1, 0)
    matcher.post(request, 0, KEY)
    assert not request.done()
    deliver(matcher, 0, KEY, b"5")
    assert bytes(request.buffer) == b"5"


def test_size_mismatch_fails_the_receive_without_writing():
    matcher, request = wired_matcher(), recv_request(4, 0)
    deliver(matcher, 0, KEY, b"toolong!")
    matcher.post(request, 0, KEY)
    assert isinstance(request.error, DistBackendError) and "8 bytes" in str(request.error)
    assert bytes(request.buffer) == b"\0" * 4


def test_dead_source_fails_pending_and_later_receives():
    matcher = wired_matcher()
    pending = recv_request(1, 2)
    matcher.post(pending, 2, KEY)
    deliver(matcher, 2, MessageKey(1, 0, 9), b"z")  # arrived before the failure: still delivered
    matcher.events.peer_gone(2, PeerFailedError("rank 2 died", rank=2))
    assert isinstance(pending.error, PeerFailedError)
    later = recv_request(1, 2)
    matcher.post(later, 2, KEY)
    assert isinstance(later.error, PeerFailedError)
    early_data = recv_request(1, 2)
    matcher.post(early_data, 2, MessageKey(1, 0, 9))
    assert early_data.error is None and bytes(early_data.buffer) == b"z"


def test_cancelled_receive_is_skipped():
    matcher, request = wired_matcher(), recv_request(1, 0)
    matcher.post(request, 0, KEY)
    matcher.cancel(request, DistBackendError("cancelled"))
    held = matcher.arrive(0, KEY, 1)
    assert held.into() is not None and held.into() is not request.buffer  # held, not into the cancelled one
    assert matcher.pending_receives() == 0


def test_request_wait_and_callbacks_across_threads():
    request, seen = recv_request(1), []
    request.add_callback(lambda r: seen.append(r.source))
    threading.Timer(0.05, lambda: request.complete(source=7)).start()
    assert not request.wait(0.001)
    assert request.wait(5)
    request.complete(source=9)  # only the first completion counts
    assert request.source == 7 and seen == [7]
    late = []
    request.add_callback(lambda r: late.append(r.source))
    assert late == [7]


@pytest.mark.parametrize("threads", [4])
def test_concurrent_posts_and_arrivals(threads):
    """Many senders and one receiver per source, racing: every message lands exactly once."""
    matcher, count = wired_matcher(), 300
    received = {s: [] for s in range(threads)}

    def sender(source):
        for i in range(count):
            deliver(matcher, source, KEY, np.int32(i).tobytes())

    def receiver(source):
        for _ in range(count):
            request = recv_request(4, source)
            matcher.post(request, source, KEY)
            assert request.wait(10)
            received[source].append(int(np.frombuffer(request.buffer, np.int32)[0]))

    workers = [threading.Thread(target=f, args=(s,)) for s in range(threads) for f in (sender, receiver)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert all(received[s] == list(range(count)) for s in range(threads))


def test_aborted_group_fails_its_receives_only():
    from pydist.core.errors import GroupAbortedError
    matcher = wired_matcher()
    mine, other = recv_request(1, 0), recv_request(1, 0)
    matcher.post(mine, 0, KEY)
    matcher.post(other, 0, MessageKey(2, 0, 5))
    matcher.events.abort_group(KEY.group, GroupAbortedError("rank 0 aborted", rank=0))
    assert isinstance(mine.error, GroupAbortedError) and not other.done()
    later = recv_request(1)
    matcher.post(later, None, MessageKey(KEY.group, 3, 0))
    assert isinstance(later.error, GroupAbortedError)


def test_a_receive_on_an_aborted_group_fails_even_if_its_message_is_already_here():
    """A peer's message arrived before its group was aborted: a receive posted afterwards
    fails with the abort instead of completing the operation as if nothing happened."""
    from pydist.core.errors import GroupAbortedError
    matcher = wired_matcher()
    deliver(matcher, 1, KEY, b"x")
    matcher.events.abort_group(KEY.group, GroupAbortedError("rank 2 aborted", rank=2))
    late = recv_request(1, 1)
    matcher.post(late, 1, KEY)
    assert isinstance(late.error, GroupAbortedError)


def test_a_receive_waiting_on_a_message_still_arriving_fails_when_its_sender_dies():
    """The message's header came before the receive was posted, then the sender died in the
    middle of its payload: the receive fails naming it instead of waiting for ever."""
    matcher = wired_matcher()
    matcher.arrive(0, KEY, 8)
    waiting = recv_request(8, 0)
    matcher.post(waiting, 0, KEY)
    assert not waiting.done()
    matcher.events.peer_gone(0, PeerFailedError("rank 0 died", rank=0))
    assert isinstance(waiting.error, PeerFailedError)


def test_a_receive_waiting_on_a_message_still_arriving_fails_when_the_group_is_aborted():
    from pydist.core.errors import GroupAbortedError
    matcher = wired_matcher()
    matcher.arrive(0, KEY, 8)
    waiting = recv_request(8, 0)
    matcher.post(waiting, 0, KEY)
    matcher.events.abort_group(KEY.group, GroupAbortedError("rank 1 aborted", rank=1))
    assert isinstance(waiting.error, GroupAbortedError)


def test_a_message_cut_off_fails_the_receive_posted_after_it_was_cut():
    matcher = wired_matcher()
    partial = matcher.arrive(0, KEY, 8)
    matcher.events.peer_gone(0, PeerFailedError("rank 0 died", rank=0))
    late = recv_request(8, 0)
    matcher.post(late, 0, KEY)
    assert isinstance(late.error, PeerFailedError)
    partial.landed()  # the rest of its bytes can no longer come: nothing waits on them
    assert isinstance(late.error, PeerFailedError)


def test_held_bytes_count_every_unexpected_message_once():
    """Empty messages (barriers) and full ones: held bytes go back to nothing once taken."""
    matcher = wired_matcher()
    for payload in (b"", b"", b"abcd", b""):
        deliver(matcher, 2, KEY, payload)
    assert matcher.throttle.held == {2: 4 + 4 * HELD_OVERHEAD}  # each counts its bookkeeping too
    for nbytes in (0, 0, 4, 0):
        matcher.post(recv_request(nbytes, 2), 2, KEY)
    assert matcher.throttle.held == {}


def _receiver_with_a_posted_receive(nbytes: int):
    from pydist.transport.receiver import FrameReceiver
    matcher = wired_matcher()
    receiver = FrameReceiver(1, matcher, lambda header, payload: None)
    buffer = np.zeros(nbytes, np.uint8)
    request = Request(1, buffer.data)
    matcher.post(request, 1, MessageKey(5, 1, 0))
    return matcher, receiver, buffer, request


def test_a_cancelled_receive_gets_no_more_of_a_frame_already_started():
    """After an error the operation withdraws its receives: bytes of a frame that was being
    read into one are discarded, so nothing lands in the caller's buffer later."""
    from pydist.transport.framing import Kind, encode_header
    nbytes = 64 * 1024
    matcher, receiver, buffer, request = _receiver_with_a_posted_receive(nbytes)
    receiver.feed(memoryview(encode_header(Kind.DATA, 5, 1, 0, nbytes) + b"\x01" * 1000))
    assert receiver.direct_view(1) is not None  # the rest would go straight into the buffer
    matcher.cancel(request, DistBackendError("receive cancelled"))
    assert receiver.direct_view(1) is None
    receiver.feed(memoryview(b"\x02" * (nbytes - 1000)))
    assert receiver.between_frames()
    assert bytes(buffer[:1000]) == b"\x01" * 1000 and not buffer[1000:].any()
    assert isinstance(request.error, DistBackendError)


@pytest.mark.parametrize("split", [0, 1, 47, 48, 60, 95, 96, 130])
def test_whole_frames_and_a_partial_one_in_one_feed_arrive_in_order(split):
    """Frames wholly inside a feed take the receiver's whole-frame path, the rest the
    decoder's: wherever the stream is cut, every message lands in its receive, in order."""
    from pydist.transport.framing import Kind, encode_header
    from pydist.transport.receiver import FrameReceiver
    matcher = wired_matcher()
    receiver = FrameReceiver(1, matcher, lambda header, payload: None)
    buffers = [np.zeros(size, np.uint8) for size in (12, 0, 40)]
    requests = [Request(1, b.data) for b in buffers]
    for request in requests:
        matcher.post(request, 1, MessageKey(5, 1, 0))
    stream = b"".join(encode_header(Kind.DATA, 5, 1, 0, b.nbytes) + bytes([i + 1]) * b.nbytes
                      for i, b in enumerate(buffers))
    receiver.feed(memoryview(stream[:split]))
    receiver.feed(memoryview(stream[split:]))
    assert all(r.done() and r.error is None for r in requests)
    assert [bytes(b) for b in buffers] == [bytes([i + 1]) * b.nbytes for i, b in enumerate(buffers)]
    assert receiver.between_frames()
