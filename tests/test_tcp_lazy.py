"""Connections on first use (PYDIST_TCP_CONNECT=lazy, transport/tcp/lazy.py): tcp transports
in this process, met through a HashStore, connect a pair when it first exchanges a message;
both ends dialling at once keep each one's messages in order; a peer gone before anyone
dialled it is named at the first operation that needs it."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import PeerFailedError
from pydist.core.settings import settings
from pydist.store import HashStore
from pydist.testing.wiring import wired_matcher
from pydist.transport.base import MessageKey
from pydist.transport.tcp.lazy import LAZY_FROM, lazy
from pydist.transport.tcp.transport import TcpTransport

KEY = MessageKey(group=7, seq=1, tag=0)


def open_world(size: int, lanes: list[str] | None = None, stripe_bytes: int = 1 << 20) -> list[TcpTransport]:
    """``size`` lazy tcp transports in this process (rank r: host ``host<r>``, no shared
    memory; ``lanes``: each rank's further addresses, one connection per pair on each)."""
    store, made, errors = HashStore(), [None] * size, []
    lazily = dataclasses.replace(settings(), tcp_connect="lazy", peer_timeout=0.0, stripe_bytes=stripe_bytes)

    def build(rank: int) -> None:
        try:
            matcher = wired_matcher(lazily.max_unexpected_bytes)
            made[rank] = TcpTransport(rank, size, store, Deadline.after(30), "127.0.0.1", "localhost",
                                      f"host{rank}", matcher, matcher.events, lazily, lanes=lanes)
        except BaseException as error:  # reported below
            errors.append(error)

    _together([lambda r=r: build(r) for r in range(size)])
    if errors:
        raise errors[0]
    return made  # type: ignore[return-value]


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")


def _together(calls) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture
def world():
    transports = open_world(4)
    yield transports
    _together([t.close for t in transports])


def test_auto_connects_lazily_from_64_ranks():
    assert [lazy("auto", n) for n in (2, LAZY_FROM - 1, LAZY_FROM, 1024)] == [False, False, True, True]
    assert lazy("lazy", 2) and not lazy("eager", 4096)


def test_no_connection_until_a_pair_first_exchanges_a_message(world):
    assert [sorted(t._lanes) for t in world] == [[], [], [], []]
    # the directory (rank 0 read every record, the others only it): every host, one record
    assert all(t.hosts == {r: f"host{r}" for r in range(4)} for t in world)
    assert [sorted(t.records) for t in world] == [[0, 1, 2, 3], [1], [2], [3]]
    sent, got = np.arange(1000, dtype=np.int64), np.zeros(1000, np.int64)
    receive = world[2].irecv(0, _bytes(got), KEY)
    send = world[0].isend(2, _bytes(sent), KEY)
    assert send.wait(30) and receive.wait(30) and send.error is None and receive.error is None
    assert np.array_equal(got, sent)
    assert [sorted(t._lanes) for t in world] == [[2], [], [0], []]
    assert sorted(world[2].records) == [0, 2]  # read when rank 0 dialled it


def test_both_ends_dialling_at_once_keep_each_ones_messages_in_order(world):
    """Ranks 1 and 3 send each other 50 messages of one key at once, before either is
    connected: each gets the other's in the order sent."""
    count = 50
    got = {r: [np.zeros(1, np.int64) for _ in range(count)] for r in (1, 3)}
    receives = {r: [world[r].irecv(4 - r, _bytes(g), KEY) for g in got[r]] for r in (1, 3)}

    def send_all(rank: int) -> None:
        for value in range(count):
            assert world[rank].isend(4 - rank, _bytes(np.array([value], np.int64)), KEY).wait(30)

    _together([lambda: send_all(1), lambda: send_all(3)])
    for rank in (1, 3):
        assert all(r.wait(30) and r.error is None for r in receives[rank])
        assert [int(g[0]) for g in got[rank]] == list(range(count))


def test_a_peer_gone_before_anyone_dialled_it_is_named_at_first_use(world):
    world[3].close()  # never connected to anyone; its listeners are closed
    got = np.zeros(4, np.uint8)
    receive = world[0].irecv(3, _bytes(got), KEY)
    assert receive.wait(30)
    assert isinstance(receive.error, PeerFailedError) and receive.error.rank == 3, receive.error
    assert "could not connect to rank 3" in str(receive.error)
    send = world[1].isend(3, _bytes(got), KEY)
    assert send.wait(30) and isinstance(send.error, PeerFailedError) and send.error.rank == 3


def test_a_receive_posted_before_the_pair_connects_takes_a_striped_message():
    """Two lanes: a collective's large message goes in one part per lane. The receiver posts
    first, unconnected: it cuts the receive as the sender will cut the message (by the lanes
    both records offer), not whole."""
    transports = open_world(2, lanes=["127.0.0.1"], stripe_bytes=64 << 10)
    try:
        sent = np.random.default_rng(3).integers(0, 255, 1 << 20, dtype=np.uint8)
        got = np.zeros_like(sent)
        receive = transports[1].irecv(0, _bytes(got), KEY, 0x5EED)  # call set: a collective's message
        send = transports[0].isend(1, _bytes(sent), KEY, 0x5EED)
        assert send.wait(30) and receive.wait(30) and send.error is None and receive.error is None
        assert np.array_equal(got, sent) and len(transports[0].lanes(1)) == 2
    finally:
        _together([t.close for t in transports])
