"""The cache of peers' device memory mapped into this process (CUDA IPC), per (peer, segment).

Behaviour
    A peer shares a tensor as a :class:`SegmentHandle`: the base address and length of the
    allocator segment holding it (in the peer's address space) and the opaque handle bytes
    that map it (CUDA: ``cudaIpcMemHandle_t`` from ``reduce_tensor``). ``acquire(peer,
    handle)`` returns the local mapping, opening it through the ``open_handle`` callable on a
    miss and reusing it on a hit; ``release(peer, mapping)`` ends that use. The key is
    (peer, base, length) as UCX keys its receive-side cache; each peer's entries are an LRU
    of ``per_peer`` (16, MPICH's size): past it the least recently used mapping that no call
    is using is closed through ``close_mapping``.

    Invalidation: a peer that frees a segment (its caching allocator returns it to the
    driver) says so and this side calls ``invalidate(peer, base)``; and a handle arriving for
    a cached (peer, base, length) with *different* handle bytes is a new allocation at the
    same address, so the stale mapping is closed and the new one opened (MPICH's check). A
    mapping in use when invalidated or evicted is closed when its last user releases it,
    never under a running kernel. ``drop_peer(peer)`` closes all of a peer's mappings (it
    died, or a shrink removed it); ``close()`` all of them.

    A mapped peer tensor cannot be shared again (CUDA refuses to export memory it imported):
    ``check_shareable(address, nbytes)`` raises ValueError, "clone it", for a local range
    inside any open mapping; the exporter calls it before making a handle.

Cost
    A hit: one dict lookup and an LRU move (~1 µs). A miss: ``open_handle`` (CUDA: a
    ``cudaIpcOpenMemHandle``, tens to hundreds of µs, the reason for this cache). Memory:
    at most ``per_peer`` idle mappings per peer (plus those in use).

Failure modes
    ``open_handle`` raising propagates and caches nothing. ``release`` of a mapping not
    acquired raises ValueError. ``close_mapping`` raising propagates after the entry is gone
    (it is not retried). A peer that frees a segment without telling leaves a stale mapping
    until the next handle for that address arrives with new bytes; the memory itself stays
    valid (a CUDA mapping holds the peer's allocation until closed).
"""
from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

M = TypeVar("M")

#: Mappings kept per peer (MPICH's IPC cache size).
PER_PEER = 16


@dataclasses.dataclass(frozen=True)
class SegmentHandle:
    """A peer's allocator segment: its base and length there, and the bytes that map it."""

    base: int
    length: int
    handle: bytes


@dataclasses.dataclass
class _Entry(Generic[M]):
    handle: SegmentHandle
    mapping: M
    address: int
    users: int = 0
    stale: bool = False  # invalidated or evicted while in use: close on the last release


class IpcCache(Generic[M]):
    """Mappings of peers' segments, per (peer, base, length), LRU per peer."""

    def __init__(self, open_handle: Callable[[int, SegmentHandle], M], close_mapping: Callable[[M], None],
                 local_address: Callable[[M], int], per_peer: int = PER_PEER):
        if per_peer < 1:
            raise ValueError(f"per_peer: expected at least 1, got {per_peer}")
        self._open = open_handle
        self._close = close_mapping
        self._address = local_address
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._peers: dict[int, OrderedDict[tuple[int, int], _Entry[M]]] = {}
        self._live: dict[int, _Entry[M]] = {}  # id(mapping) -> entry, for every open mapping
        #: Counters: mappings opened, closed; lookups found, not found.
        self.opens = self.closes = self.hits = self.misses = 0

    def acquire(self, peer: int, handle: SegmentHandle) -> M:
        """The local mapping of ``peer``'s segment (opened on a miss); pair with ``release``."""
        key = (handle.base, handle.length)
        to_close: list[M] = []
        with self._lock:
            entries = self._peers.setdefault(peer, OrderedDict())
            entry = entries.get(key)
            if entry is not None and entry.handle.handle != handle.handle:
                to_close += self._retire(entries.pop(key))  # a new allocation at the same address
                entry = None
            if entry is not None:
                self.hits += 1
                entries.move_to_end(key)
                entry.users += 1
                found: M | None = entry.mapping
            else:
                self.misses += 1
                found = None
        if found is not None:
            self._close_all(to_close)
            return found
        mapping = self._open(peer, handle)  # outside the lock: it is slow
        with self._lock:
            self.opens += 1
            entries = self._peers.setdefault(peer, OrderedDict())
            racing = entries.get(key)
            if racing is not None:  # another thread opened it meanwhile: keep one mapping
                to_close += self._retire(entries.pop(key))
            entries[key] = self._live[id(mapping)] = _Entry(handle, mapping, self._address(mapping), users=1)
            to_close += self._evict(entries)
        self._close_all(to_close)
        return mapping

    def release(self, peer: int, mapping: M) -> None:
        """End one use of ``mapping``, which ``acquire(peer, ...)`` returned."""
        to_close: list[M] = []
        with self._lock:
            entry = self._live.get(id(mapping))
            if entry is None or entry.users < 1:
                raise ValueError(f"released a mapping of peer {peer} that is not acquired")
            entry.users -= 1
            if entry.stale and entry.users == 0:
                to_close.append(entry.mapping)
            else:
                to_close += self._evict(self._peers.get(peer, OrderedDict()))
        self._close_all(to_close)

    def invalidate(self, peer: int, base: int) -> bool:
        """``peer`` freed its segment at ``base``: close its mapping (when unused); whether one was cached."""
        with self._lock:
            entries = self._peers.get(peer, OrderedDict())
            keys = [key for key in entries if key[0] == base]
            to_close = [m for key in keys for m in self._retire(entries.pop(key))]
        self._close_all(to_close)
        return bool(keys)

    def drop_peer(self, peer: int) -> None:
        """Close every mapping of ``peer`` (dead, or removed by a shrink); in-use ones on release."""
        with self._lock:
            entries = self._peers.pop(peer, OrderedDict())
            to_close = [m for entry in entries.values() for m in self._retire(entry)]
        self._close_all(to_close)

    def close(self) -> None:
        """Close every mapping (those in use when released)."""
        for peer in list(self._peers):
            self.drop_peer(peer)

    def check_shareable(self, address: int, nbytes: int) -> None:
        """ValueError if local bytes [address, address + nbytes) lie in a peer's mapped segment."""
        with self._lock:
            for entry in self._live.values():
                if address < entry.address + entry.handle.length and entry.address < address + max(nbytes, 1):
                    raise ValueError(
                        f"the tensor at {address:#x} is a peer's memory mapped by CUDA IPC, which cannot "
                        "be shared again: clone it first")

    def mapped(self, peer: int) -> int:
        """How many of ``peer``'s segments are cached (in-use stale ones not counted)."""
        with self._lock:
            return len(self._peers.get(peer, ()))

    # -- under the lock: which mappings to close once it is let go ------------------------

    def _retire(self, entry: _Entry[M]) -> list[M]:
        """``entry`` leaves the cache: close it now, or on its last release if in use."""
        if entry.users:
            entry.stale = True
            return []
        return [entry.mapping]

    def _evict(self, entries: OrderedDict[tuple[int, int], _Entry[M]]) -> list[M]:
        """Close the least recently used idle mappings past ``per_peer`` (in-use ones stay)."""
        to_close = []
        for key in list(entries):
            if len(entries) <= self.per_peer:
                break
            if entries[key].users == 0:
                to_close.append(entries.pop(key).mapping)
        return to_close

    def _close_all(self, mappings: list[M]) -> None:
        """Close ``mappings`` (lock not held: closing is slow)."""
        for mapping in mappings:
            with self._lock:
                self._live.pop(id(mapping), None)
                self.closes += 1
            self._close(mapping)
