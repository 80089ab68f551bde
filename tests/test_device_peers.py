"""The ranks of a host share their device buffers and events once per group (peers.py): the
offer's wire form, the store plane (an expired deadline is a timeout, never a zero timeout a
torch store reads as "wait forever"), and three processes on the stand-in sharing buffers and
events, then reading each other's memory through the mappings opened once."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from device_support import run_ranks

from pydist.core.deadline import Deadline
from pydist.core.errors import DistStoreError, OpTimeoutError
from pydist.device import open_device
from pydist.device.peers import Offer, PeerTable, StorePlane, decode, encode
from pydist.store import FileStore, HashStore


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


class TorchLikeStore:
    """A store that reads a timeout as torch's stores do: under 1 ms (0 ms once truncated)
    means no timeout at all."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        if timeout < timedelta(milliseconds=1):
            raise AssertionError(f"store.wait({keys}, {timeout!r}) waits forever on a torch store")
        if not self.check(keys):
            raise DistStoreError(f"missing {keys}")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[key] for key in keys]

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


def test_an_expired_deadline_is_a_timeout_naming_the_missing_ranks_not_a_wait_forever():
    plane = StorePlane(TorchLikeStore(), "ipc", 0, 3)
    with pytest.raises(OpTimeoutError, match="ipc/0/1, ipc/0/2 were set"):
        plane.all_gather(b"mine", Deadline.after(0))


def test_an_expired_deadline_with_every_rank_there_still_gathers():
    store = TorchLikeStore()
    store.set("ipc/0/1", b"theirs")
    assert StorePlane(store, "ipc", 0, 2).all_gather(b"mine", Deadline.after(0)) == [b"mine", b"theirs"]


def test_a_rank_that_never_publishes_times_out_naming_its_key():
    plane = StorePlane(HashStore(), "ipc", 0, 2)
    with pytest.raises(DistStoreError, match="ipc/0/1"):
        plane.all_gather(b"mine", Deadline.after(0.05))


def test_a_plane_checks_its_rank():
    with pytest.raises(ValueError, match="rank 2 is not in a plane of 2"):
        StorePlane(HashStore(), "ipc", 2, 2)


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
    assert all(table.same_device(p) for p in table.mappings)
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
