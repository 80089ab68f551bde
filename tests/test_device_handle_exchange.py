"""The ranks of a host exchange fake IPC handles over a store (threads as ranks, no CUDA):
the wire form, one all-gather per call, desync caught, freed segments invalidated."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DesyncError, DistStoreError
from pydist.device.handle_exchange import StorePlane, TensorHandle, decode, encode, exchange, open_peers, release_peers
from pydist.device.ipc_cache import IpcCache, SegmentHandle
from pydist.store import HashStore

JOIN_S = 30.0  # only a bound on a hang, never a measurement


def record(rank: int, seq: int, base: int = 0x1000, handle: bytes | None = None,
           freed: tuple[int, ...] = ()) -> TensorHandle:
    fake = handle if handle is not None else bytes([rank, seq % 256]) * 32  # 64 bytes, as cudaIpcMemHandle_t
    return TensorHandle(rank, seq, SegmentHandle(base, 1 << 20, fake), 256 * rank, 4096, b"E" * 64, freed)


def on_threads(size: int, body: Callable[[int], object]) -> list[object]:
    results: list[object] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            results[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    return results


def test_the_wire_form_round_trips():
    for value in (record(3, 7, freed=(0x2000, 0x3000)), record(0, 0, handle=b""),
                  TensorHandle(1, 2**40, SegmentHandle(2**63, 2**33, b"x"), 0, 0)):
        assert decode(encode(value)) == value


@pytest.mark.parametrize("mangle, message", [
    (lambda b: b[:10], "at least"),
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + b"\x00\x09" + b[6:], "version 9"),
    (lambda b: b + b"\x00", "header says"),
    (lambda b: b[:-1], "header says"),
])
def test_a_malformed_record_says_what_is_wrong(mangle, message):
    with pytest.raises(ValueError, match=message):
        decode(mangle(encode(record(1, 1))))


def test_the_ranks_of_a_host_see_each_others_handles_call_after_call():
    store, size, calls = HashStore(), 4, 5

    def rank(me: int) -> list[list[TensorHandle]]:
        plane = StorePlane(store, "ipc/g0", me, size)
        return [exchange(plane, record(me, seq), Deadline.after(JOIN_S)) for seq in range(calls)]

    results = on_threads(size, rank)
    for seen in results:
        assert not isinstance(seen, BaseException), seen
        assert seen == [[record(r, seq) for r in range(size)] for seq in range(calls)]
    assert len(store.list_keys()) <= 2 * size  # each rank deletes the previous round's key


def test_ranks_at_different_calls_are_a_desync():
    store = HashStore()

    def rank(me: int) -> object:
        return exchange(StorePlane(store, "ipc", me, 2), record(me, seq=10 + me), Deadline.after(JOIN_S))

    results = on_threads(2, rank)
    assert all(isinstance(r, DesyncError) for r in results), results
    assert "rank 0 is at call 10, rank 1 at call 11" in str(results[0])


def test_a_rank_that_never_publishes_times_out_naming_its_key():
    plane = StorePlane(HashStore(), "ipc", 0, 2)
    with pytest.raises(DistStoreError, match="ipc/0/1"):
        exchange(plane, record(0, 0), Deadline.after(0.05))


def test_a_plane_checks_its_rank():
    with pytest.raises(ValueError, match="rank 2 is not in a plane of 2"):
        StorePlane(HashStore(), "ipc", 2, 2)


def test_peers_segments_are_mapped_once_and_invalidated_when_freed():
    opened: list[tuple[int, bytes]] = []
    closed: list[tuple[int, bytes]] = []
    cache: IpcCache[tuple[int, bytes]] = IpcCache(
        lambda peer, h: opened.append((peer, h.handle)) or (peer, h.handle), closed.append,
        lambda m: 0x9000_0000 + 0x10_0000 * len(opened))

    def call(records: list[TensorHandle]) -> dict[int, tuple[int, bytes]]:
        mapped = open_peers(cache, records, me=0)
        release_peers(cache, mapped)
        return mapped

    first = call([record(r, 0, handle=b"A%d" % r) for r in range(3)])
    assert set(first) == {1, 2} and len(opened) == 2
    call([record(r, 1, handle=b"A%d" % r) for r in range(3)])
    assert len(opened) == 2 and cache.hits == 2  # same segments: no new open
    # rank 2 freed its segment and got a new one at the same address
    later = call([record(0, 2), record(1, 2, handle=b"A1"), record(2, 2, handle=b"B2", freed=(0x1000,))])
    assert closed == [(2, b"A2")] and later[2] == (2, b"B2") and len(opened) == 3
