"""The IPC mapping cache with fake open/close (no CUDA): hits, per-peer LRU eviction,
invalidation on free, re-open at the same address, in-use mappings kept, no re-share."""
from __future__ import annotations

import itertools

import pytest

from pydist.device.ipc_cache import PER_PEER, IpcCache, SegmentHandle


class FakeMapping:
    addresses = itertools.count(0x7000_0000, 0x10_0000)

    def __init__(self, peer: int, handle: SegmentHandle):
        self.peer, self.handle, self.address, self.closed = peer, handle, next(self.addresses), False


class Driver:
    """Counts opens and closes; closing twice would be a bug."""

    def __init__(self, fail: bool = False) -> None:
        self.opened: list[FakeMapping] = []
        self.closed: list[FakeMapping] = []
        self.fail = fail

    def open(self, peer: int, handle: SegmentHandle) -> FakeMapping:
        if self.fail:
            raise RuntimeError("cudaIpcOpenMemHandle failed")
        mapping = FakeMapping(peer, handle)
        self.opened.append(mapping)
        return mapping

    def close(self, mapping: FakeMapping) -> None:
        assert not mapping.closed
        mapping.closed = True
        self.closed.append(mapping)

    def cache(self, per_peer: int = PER_PEER) -> IpcCache[FakeMapping]:
        return IpcCache(self.open, self.close, lambda m: m.address, per_peer)


def seg(base: int, handle: bytes = b"h", length: int = 0x1000) -> SegmentHandle:
    return SegmentHandle(base, length, handle + base.to_bytes(8, "little"))


def use(cache: IpcCache[FakeMapping], peer: int, handle: SegmentHandle) -> FakeMapping:
    mapping = cache.acquire(peer, handle)
    cache.release(peer, mapping)
    return mapping


def test_a_segment_is_opened_once_and_then_found():
    driver = Driver()
    cache = driver.cache()
    first = use(cache, 1, seg(0x1000))
    assert use(cache, 1, seg(0x1000)) is first
    assert (cache.opens, cache.hits, cache.misses, cache.closes) == (1, 1, 1, 0)
    other_peer = use(cache, 2, seg(0x1000))  # the same address in another process is another segment
    assert other_peer is not first and cache.opens == 2


def test_same_base_other_length_is_another_segment():
    cache = Driver().cache()
    assert use(cache, 1, seg(0x1000, length=0x1000)) is not use(cache, 1, seg(0x1000, length=0x2000))
    assert cache.mapped(1) == 2


def test_each_peer_keeps_its_16_most_recently_used():
    driver = Driver()
    cache = driver.cache()
    mappings = [use(cache, 1, seg(0x1000 * i)) for i in range(PER_PEER)]
    use(cache, 2, seg(0x99000))
    use(cache, 1, seg(0))  # segment 0 is used again: segment 1 is now the least recent
    use(cache, 1, seg(0x1000 * PER_PEER))
    assert driver.closed == [mappings[1]] and cache.mapped(1) == PER_PEER and cache.mapped(2) == 1
    use(cache, 1, seg(0x1000))  # evicted, so opened again
    assert cache.opens == PER_PEER + 3 and driver.closed == [mappings[1], mappings[2]]


def test_mappings_in_use_are_not_evicted_until_released():
    driver = Driver()
    cache = driver.cache(per_peer=2)
    held = [cache.acquire(1, seg(0x1000 * i)) for i in range(4)]
    assert driver.closed == [] and cache.mapped(1) == 4
    for mapping in held:
        cache.release(1, mapping)
    assert driver.closed == held[:2] and cache.mapped(1) == 2


def test_invalidation_when_the_peer_frees_the_segment():
    driver = Driver()
    cache = driver.cache()
    first = use(cache, 1, seg(0x1000))
    assert cache.invalidate(1, 0x1000) and driver.closed == [first]
    assert not cache.invalidate(1, 0x1000) and not cache.invalidate(2, 0x1000)
    again = use(cache, 1, seg(0x1000))  # re-opened after the free, at the same address
    assert again is not first and cache.opens == 2


def test_new_handle_bytes_at_a_cached_address_reopen():
    driver = Driver()
    cache = driver.cache()
    old = use(cache, 1, seg(0x1000, b"old"))
    new = use(cache, 1, seg(0x1000, b"new"))
    assert new is not old and driver.closed == [old] and cache.mapped(1) == 1


def test_a_segment_invalidated_while_in_use_is_closed_on_release():
    driver = Driver()
    cache = driver.cache()
    in_use = cache.acquire(1, seg(0x1000, b"old"))
    cache.invalidate(1, 0x1000)
    new = cache.acquire(1, seg(0x1000, b"new"))
    assert driver.closed == [] and new is not in_use
    cache.release(1, in_use)
    assert driver.closed == [in_use]
    cache.release(1, new)
    assert driver.closed == [in_use] and cache.mapped(1) == 1


def test_a_mapped_peer_tensor_cannot_be_shared_again():
    cache = Driver().cache()
    mapping = use(cache, 1, seg(0x1000, length=0x4000))
    with pytest.raises(ValueError, match="clone it"):
        cache.check_shareable(mapping.address + 0x100, 64)
    with pytest.raises(ValueError, match="clone it"):
        cache.check_shareable(mapping.address - 8, 16)  # straddles the start
    cache.check_shareable(mapping.address + 0x4000, 64)  # just past it: own memory
    cache.check_shareable(mapping.address - 64, 64)
    cache.invalidate(1, 0x1000)
    cache.check_shareable(mapping.address + 0x100, 64)  # unmapped now


def test_drop_peer_and_close_release_everything():
    driver = Driver()
    cache = driver.cache()
    a, b = use(cache, 1, seg(0x1000)), use(cache, 1, seg(0x2000))
    c = cache.acquire(2, seg(0x1000))
    cache.drop_peer(1)
    assert set(driver.closed) == {a, b} and cache.mapped(1) == 0
    cache.close()
    assert c not in driver.closed  # in use: closed when released
    cache.release(2, c)
    assert set(driver.closed) == {a, b, c} and cache.closes == 3


def test_misuse_and_a_failed_open():
    cache = Driver().cache()
    with pytest.raises(ValueError, match="not acquired"):
        cache.release(1, FakeMapping(1, seg(0)))
    mapping = use(cache, 1, seg(0x1000))
    with pytest.raises(ValueError, match="not acquired"):
        cache.release(1, mapping)
    failing = Driver(fail=True).cache()
    with pytest.raises(RuntimeError, match="OpenMemHandle"):
        failing.acquire(1, seg(0x1000))
    assert failing.mapped(1) == 0 and failing.opens == 0
    with pytest.raises(ValueError):
        Driver().cache(per_peer=0)
