"""The ranks of a host share their device buffers and events once per group (peers.py): the
offer's wire form, and three processes on the stand-in sharing buffers and events, then
reading each other's memory through the mappings opened once (the engine's exchange over the
arena: tests/test_device_collectives.py)."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from device_support import run_ranks

from pydist.core.deadline import Deadline
from pydist.device import open_device
from pydist.device.peers import Offer, PeerTable, decode, encode
from pydist.store import FileStore


def test_an_offer_round_trips():
    for offer in (Offer(3, "GPU-1", b"h" * 150, (b"e" * 140, b"f")), Offer(0, "", b"")):
        assert decode(encode(offer)) == offer


@pytest.mark.parametrize("mangle, message", [
    (lambda b: b[:5], "at least"),
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + b"\x00\x07" + b[6:], "version 7"),
    (lambda b: b[:-1], "cut short"),
    (lambda b: b + b"\x00", "past its end"),
    (lambda b: b[:10] + b"\xff\xff" + b[12:], "of 65535 events"),
])
def test_a_malformed_offer_says_what_is_wrong(mangle, message):
    with pytest.raises(ValueError, match=message):
        decode(mangle(encode(Offer(1, "GPU-0", b"handle", (b"event",)))))


class StorePlane:
    """A ControlPlane over a store for these processes (the engine's is the arena's)."""

    def __init__(self, store, prefix: str, rank: int, size: int):
        self.store, self.prefix, self.rank, self.size, self.round = store, prefix, rank, size, 0

    def all_gather(self, payload: bytes, deadline: Deadline) -> list[bytes]:
        keys = [f"{self.prefix}/{self.round}/{r}" for r in range(self.size)]
        self.round += 1
        self.store.set(keys[self.rank], payload)
        self.store.wait(keys, timedelta(seconds=deadline.remaining() or JOIN_S))
        return self.store.multi_get(keys)


SIZE = 3
JOIN_S = 30.0  # only a bound on a hang


def _host_rank(kind, rank, link, path):
    """Each rank fills its buffer with its rank, records "written", shares buffer and events
    once; then reads every peer's buffer after waiting on the peer's event."""
    device = open_device(kind, 0, rank)
    stream = device.current_stream()
    buffer = device.allocate(4 * 4)
    written, read = device.event(interprocess=True), device.event(interprocess=True)
    device.copy(device.view(buffer, "int32"), np.full(4, rank, np.int32), stream)
    written.record(stream)
    plane = StorePlane(FileStore(path, SIZE), "device/g0", rank, SIZE)
    table = PeerTable.exchange(device, plane, rank, buffer, [written, read], Deadline.after(JOIN_S))
    assert sorted(table.mappings) == [p for p in range(SIZE) if p != rank]
    assert all(table.offers[p].device_uuid == device.uuid for p in table.mappings)
    seen = {}
    for peer, mapping in table.mappings.items():
        stream.wait_event(table.events[peer][0])
        seen[peer] = device.to_host(device.view(mapping, "int32"), stream, Deadline.after(JOIN_S)).tolist()
    read.record(stream)
    plane.all_gather(b"read", Deadline.after(JOIN_S))  # every rank has read: close, then free
    table.close()
    plane.all_gather(b"closed", Deadline.after(JOIN_S))
    device.free(buffer)
    return seen


@pytest.mark.slow
@pytest.mark.device
def test_three_ranks_share_buffers_and_events_once(tmp_path):
    results = run_ranks("standin", [_host_rank] * SIZE, str(tmp_path / "store"))
    for rank, seen in enumerate(results):
        assert seen == {p: [p] * 4 for p in range(SIZE) if p != rank}
