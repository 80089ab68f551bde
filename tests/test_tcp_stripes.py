"""Striping over several lanes (one connection per interface): how a message is cut, and the
tcp transport carrying collectives' large messages in parts over two lanes on loopback
(a lane that dies fails the transfer naming the peer, never a hang)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydist.core.deadline import Deadline
from pydist.core.errors import GroupAbortedError, PeerFailedError
from pydist.core.settings import settings
from pydist.store import HashStore
from pydist.testing.wiring import wired_matcher
from pydist.transport.base import MessageKey
from pydist.transport.tcp.stripes import ALIGN, bounds, part_key
from pydist.transport.tcp.transport import TcpTransport

KEY = MessageKey(group=5, seq=3, tag=2)
CALL = 0x5EED  # a collective's fingerprint: only collectives stripe


@given(st.integers(1, 1 << 26), st.integers(1, 8))
def test_bounds_cover_every_byte_once_in_page_aligned_parts(nbytes, lanes):
    parts = bounds(nbytes, lanes)
    assert parts[0][0] == 0 and parts[-1][1] == nbytes
    assert all(a < b for a, b in parts) and len(parts) <= lanes
    assert all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1))
    assert all(a % ALIGN == 0 for a, _ in parts)


def test_part_keys_differ_from_the_message_and_from_each_other():
    keys = [KEY] + [part_key(KEY, k) for k in range(4)]
    assert len(set(keys)) == 5
    assert all(k.group == KEY.group and k.seq == KEY.seq for k in keys)


def open_pair(lanes: tuple[list[str], list[str]]) -> list[TcpTransport]:
    """Two tcp transports in this process, met through a HashStore; rank r listens on
    127.0.0.1 and on each address of ``lanes[r]``."""
    store, made, errors = HashStore(), [None, None], []

    def build(rank: int) -> None:
        try:
            matcher = wired_matcher(settings().max_unexpected_bytes)
            made[rank] = TcpTransport(rank, 2, store, Deadline.after(30), "127.0.0.1", "localhost",
                                      f"host{rank}", matcher, matcher.events, settings(), lanes=lanes[rank])
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for transport in made:
            if transport is not None:
                transport.close()
        raise errors[0]
    return made  # type: ignore[return-value]


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.setenv("PYDIST_STRIPE_BYTES", str(64 << 10))
    monkeypatch.setenv("PYDIST_PEER_TIMEOUT", "0")
    transports = open_pair((["127.0.0.1"], ["127.0.0.1"]))
    yield transports
    close(transports)


def close(transports: list[TcpTransport]) -> None:
    """Close both at once (each waits for the other's goodbye)."""
    threads = [threading.Thread(target=t.close) for t in transports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def exchange(transports: list[TcpTransport], nbytes: int, call: int) -> np.ndarray:
    sent = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    got = np.zeros(nbytes, np.uint8)
    receive = transports[1].irecv(0, memoryview(got), KEY, call)
    send = transports[0].isend(1, memoryview(sent), KEY, call)
    assert send.wait(30) and receive.wait(30)
    assert send.error is None and receive.error is None, (send.error, receive.error)
    assert np.array_equal(got, sent)
    return got


def test_two_lanes_connect_every_pair(pair):
    assert [len(t.lanes(1 - t.rank)) for t in pair] == [2, 2]
    assert [len(r.lanes) for r in pair[0].records.values()] == [1, 1]
    assert pair[0].records[1].where == "127.0.0.1, lo; 127.0.0.1, lo"  # as python -m pydist.debug shows it


@pytest.mark.parametrize("nbytes", [1, 4096, (64 << 10) - 1, 64 << 10, (1 << 20) + 17, 5 << 20])
def test_striped_and_whole_messages_arrive_intact(pair, nbytes):
    exchange(pair, nbytes, CALL)


def test_messages_sent_before_their_receive_is_posted_are_held_and_matched(pair):
    sent = [np.full(256 << 10, i, np.uint8) for i in range(3)]
    sends = [pair[0].isend(1, memoryview(s), KEY, CALL) for s in sent]
    got = [np.zeros(256 << 10, np.uint8) for _ in sent]
    receives = [pair[1].irecv(0, memoryview(g), KEY, CALL) for g in got]
    assert all(r.wait(30) and r.error is None for r in sends + receives)
    assert [int(g[0]) for g in got] == [0, 1, 2] and all(np.array_equal(g, s) for g, s in zip(got, sent))


def kill_lane(transport: TcpTransport, peer: int, lane: int) -> None:
    """The link of one lane fails: its connection is reset under the transport."""
    transport.lanes(peer)[lane].sock.shutdown(socket.SHUT_RDWR)


def test_a_dead_second_lane_fails_a_striped_receive_naming_the_peer(pair):
    kill_lane(pair[0], 1, 1)
    got = np.zeros(1 << 20, np.uint8)
    receive = pair[1].irecv(0, memoryview(got), KEY, CALL)
    pair[0].isend(1, memoryview(np.ones(1 << 20, np.uint8)), KEY, CALL)
    assert receive.wait(30), "a striped receive over a dead lane hung"
    assert isinstance(receive.error, PeerFailedError) and receive.error.rank == 0
    assert "rank 0 on localhost (127.0.0.1" in str(receive.error)


def test_only_collectives_large_messages_use_the_second_lane(pair, monkeypatch):
    second = pair[0].lanes(1)[1]
    carried: list[int] = []
    send = second.send
    monkeypatch.setattr(second, "send", lambda parts, request: carried.append(parts[-1].nbytes) or send(parts, request))
    exchange(pair, 1 << 20, 0)  # point-to-point: the receiver's size may differ, so never split
    exchange(pair, (64 << 10) - 1, CALL)  # under PYDIST_STRIPE_BYTES
    assert carried == []
    exchange(pair, 1 << 20, CALL)
    assert carried == [512 << 10]
    monkeypatch.undo()


def test_ranks_offering_different_lane_counts_use_the_lanes_both_offer(monkeypatch):
    monkeypatch.setenv("PYDIST_STRIPE_BYTES", str(64 << 10))
    transports = open_pair((["127.0.0.1", "127.0.0.1"], []))
    try:
        assert [len(t.lanes(1 - t.rank)) for t in transports] == [1, 1]
        exchange(transports, 1 << 20, CALL)
    finally:
        close(transports)


def test_every_lane_runs_tls_when_the_mesh_does(monkeypatch, tmp_path):
    pytest.importorskip("cryptography")
    from pydist.testing.tls import Authority
    from pydist.transport.tcp.tls_socket import TlsSocket
    for name, value in Authority(str(tmp_path)).issue("rank").env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYDIST_STRIPE_BYTES", str(64 << 10))
    transports = open_pair((["127.0.0.1"], ["127.0.0.1"]))
    try:
        exchange(transports, 3 << 20, CALL)  # first: with lazy connections the pair connects here
        assert all(isinstance(c.sock, TlsSocket) for t in transports for c in t.connections())
        assert len(transports[0].connections()) == 2
    finally:
        close(transports)


def test_an_abort_fails_the_groups_unfinished_sends(monkeypatch):
    """A send of a group still queued when the group is aborted fails with the abort (a
    broadcast root only sends: it learns of the abort this way, not when the peer leaves);
    another group's send goes on."""
    monkeypatch.setenv("PYDIST_MAX_UNEXPECTED_BYTES", str(64 << 10))  # the receiver stops reading early
    transports = open_pair(([], []))
    try:
        filler = np.ones(1 << 20, np.uint8)  # held by the receiver, over its limit: it stops reading
        assert transports[0].isend(1, memoryview(filler), MessageKey(KEY.group + 2, 0, 0), CALL).wait(30)
        big = np.ones(32 << 20, np.uint8)  # far more than the socket buffers hold
        stuck = transports[0].isend(1, memoryview(big), KEY, CALL)
        other = transports[0].isend(1, memoryview(big[:16]), MessageKey(KEY.group + 1, 0, 0), CALL)
        assert not stuck.wait(0.2), "the receiver read on past its limit of unexpected bytes"
        aborted = GroupAbortedError("rank 1 aborted the group", rank=1)
        transports[0].matcher.events.abort_group(KEY.group, aborted)
        transports[0].fail_sends(KEY.group, aborted)  # what the world transport does on the abort
        assert stuck.wait(30) and stuck.error is aborted
        assert other.error is None
    finally:
        close(transports)
