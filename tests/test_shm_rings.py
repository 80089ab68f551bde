"""The shared-memory rings of one host, two ranks of one process (no store, no tcp)."""
from __future__ import annotations

import time

import numpy as np

from pydist.core.deadline import Deadline
from pydist.core.errors import PeerFailedError
from pydist.testing.wiring import wired_matcher
from pydist.transport.base import MessageKey, Request
from pydist.transport.shm.segment import anonymous
from pydist.transport.shm.transport import ShmTransport, host_segment_bytes, ring_bytes_for

KEY = MessageKey(7, 1, 0)


def _pair() -> tuple[ShmTransport, ShmTransport]:
    ring = ring_bytes_for(2, 64 << 10)
    memory, base = anonymous(host_segment_bytes(2, ring))
    pair = []
    for rank in (0, 1):
        matcher = wired_matcher()
        pair.append(ShmTransport(rank, [0, 1], memory, base, ring, matcher, True, matcher.events.peer_gone))
    return pair[0], pair[1]


def _half_sent(sender: ShmTransport, receiver: ShmTransport) -> Request:
    """Rank 0 sends 1 MiB through a 64 KiB ring and stops (its progress thread ends, as if
    killed): rank 1's receive holds part of it and waits for the rest."""
    data = np.arange(1 << 18, dtype=np.float32)
    request = Request(0, memoryview(np.zeros_like(data)).cast("B"))
    receiver.matcher.post(request, 0, KEY)
    sender.isend(1, memoryview(data).cast("B"), KEY)
    sender.close(Deadline.after(0))  # pending bytes are never written
    assert not request.wait(0.2), "the whole message went through a ring smaller than it"
    return request


def test_a_receive_half_filled_when_its_sender_goes_fails_naming_the_sender():
    """Rank 0 sends 1 MiB through a 64 KiB ring and stops (its progress thread ends, as if
    killed); rank 1 has taken part of it when it learns that rank 0 is gone: the receive
    fails with that error instead of waiting for the rest until the operation's timeout."""
    sender, receiver = _pair()
    try:
        request = _half_sent(sender, receiver)
        gone = PeerFailedError("rank 0 closed its connection to rank 1", rank=0)
        receiver.peer_gone(0, gone)
        assert request.wait(30), "the half-filled receive still waits after its sender left"
        assert request.error is gone
    finally:
        sender.close(Deadline.after(0))
        receiver.close(Deadline.after(0))


def test_a_receive_whose_waiter_stopped_polling_is_delivered_by_the_progress_thread():
    """A waiter drains the ring itself only for ``spin_seconds``; a message sent after that
    (the waiter now asleep) is delivered by the receiver's progress thread."""
    sender, receiver = _pair()
    try:
        receiver.spin_seconds = 0.0
        into = np.zeros(4, np.uint8)
        request = Request(0, memoryview(into).cast("B"))
        receiver.matcher.post(request, 0, KEY)
        assert not receiver.drive(request, 0.01)  # nothing sent: it polls, sleeps, times out
        sender.isend(1, memoryview(b"\x01\x02\x03\x04"), KEY)
        assert receiver.drive(request, 30)
        assert request.error is None and bytes(into) == b"\x01\x02\x03\x04"
    finally:
        sender.close(Deadline.after(0))
        receiver.close(Deadline.after(0))


def test_a_sender_wakes_no_sleeper_while_the_receiver_polls(monkeypatch):
    """While a thread of the receiving process polls (announced on its Signal), ringing it
    makes no futex wake (its progress thread stays asleep); once it leaves, ringing wakes."""
    from pydist.transport.shm import atomics as _atomics
    from pydist.transport.shm.signal import Signal
    memory, base = anonymous(4096)
    signal = Signal(memory.data, base, 64, oversubscribed=True)
    memory.data.cast("I")[(64 + 4) // 4] = 1  # one sleeper
    woken = []
    monkeypatch.setattr(_atomics, "futex_wake", woken.append)
    assert signal.polling(1) == 1
    signal.ring()
    assert woken == []
    assert signal.polling(-1) == 0
    signal.ring()
    assert woken == [base + 64]
    signal.wake()
    assert len(woken) == 2


def test_a_half_filled_receive_of_an_aborted_group_fails_with_the_abort_when_its_sender_goes():
    """Rank 0 aborts the group (it saw another rank die) and leaves while a message of that
    group is half through the ring: the receive fails with the abort (naming the rank that
    died), not with rank 0's departure, which is only its consequence."""
    from pydist.core.errors import GroupAbortedError
    sender, receiver = _pair()
    try:
        request = _half_sent(sender, receiver)
        aborted = GroupAbortedError("rank 0 aborted: rank 5 died", rank=0)
        receiver.matcher.events.abort_group(KEY.group, aborted)
        receiver.peer_gone(0, PeerFailedError("rank 0 has shut down its process group", rank=0))
        assert request.wait(30)
        assert request.error is aborted
    finally:
        sender.close(Deadline.after(0))
        receiver.close(Deadline.after(0))


def test_a_signal_wake_ends_a_members_sleep():
    """Signal.wake (what Arena.wake does when a peer died) ends a member's futex sleep at
    once instead of at the end of its slice: a thread asleep with a 60 s slice returns (10 s
    allowed: a loaded machine)."""
    import threading

    from pydist.transport.shm.signal import Signal
    memory, base = anonymous(4096)
    signal = Signal(memory.data, base, 0, oversubscribed=True)
    woke = threading.Event()
    thread = threading.Thread(target=lambda: (signal.sleep(lambda: False, 60.0), woke.set()))
    thread.start()
    while not memory.data.cast("I")[1]:  # the sleeper counted itself in
        threading.Event().wait(0.001)
    signal.wake()
    assert woke.wait(10), "the sleeper was not woken"
    thread.join()


def test_a_waiter_yields_the_cpu_for_a_bounded_time_then_sleeps(monkeypatch):
    """Beside busy processes each yield can cost a scheduler slice: the yield phase ends after
    YIELD_SECONDS of (here a fake, 100 us per reading) time, however few yields that was."""
    import os
    import types

    import pytest

    from pydist.transport.shm import signal as signal_module
    memory, base = anonymous(4096)
    signal = signal_module.Signal(memory.data, base, 0, oversubscribed=True)
    now = [0.0]

    def perf_counter():
        now[0] += 100e-6
        return now[0]

    yields = []
    monkeypatch.setattr(signal_module, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(now[0]))
    with pytest.raises(signal_module.WaitTimeout):  # the counter never arrives; the deadline has passed
        signal.wait_at_least(8, 1, Deadline.after(0.0))
    assert 1 <= len(yields) <= signal_module.YIELD_SECONDS / 100e-6


def test_an_idle_progress_thread_sleeps_until_its_doorbell_rings(monkeypatch):
    """With nothing to do, the progress thread sleeps until rung (a send, a peer leaving,
    close), its timeout only a backstop: each wake takes the GIL, and while the caller's
    thread runs torch code (whose bindings release the GIL at every tensor method) a thread
    waiting for it wakes at each release, taking the CPU another rank runs on (issue 49).
    Half a second idle: at most the first look and one backstop nap's end (not ten 50 ms
    naps); then a message sent still arrives through it."""
    looks = []
    poll = ShmTransport._poll
    monkeypatch.setattr(ShmTransport, "_poll", lambda self: looks.append(self.rank) or poll(self))
    sender, receiver = _pair()
    try:
        time.sleep(0.5)  # the interval observed, not a synchronisation
        assert looks.count(1) <= 2, f"the idle progress thread looked {looks.count(1)} times in 0.5 s"
        receiver.spin_seconds = 0.0
        into = np.zeros(4, np.uint8)
        request = Request(0, memoryview(into).cast("B"))
        receiver.matcher.post(request, 0, KEY)
        sender.isend(1, memoryview(b"\x05\x06\x07\x08"), KEY)
        assert request.wait(30) and bytes(into) == b"\x05\x06\x07\x08"
    finally:
        sender.close(Deadline.after(0))
        receiver.close(Deadline.after(0))
