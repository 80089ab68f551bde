"""The ranks of a host exchange their tensors' IPC handles over a control plane, per call.

Behaviour
    Each rank of a host describes the device tensor of a call as a :class:`TensorHandle`: its
    position among the host's ranks, the call's sequence number, the allocator segment holding
    the tensor (pydist.device.ipc_cache.SegmentHandle), the tensor's offset and size in it, the
    interprocess event recorded after the producer's last write (CUDA:
    ``torch.cuda.Event(interprocess=True).ipc_handle()``), and the bases of the segments it
    freed since its last exchange. ``encode``/``decode`` are the sans-IO wire form.
    ``exchange(plane, mine, deadline)`` all-gathers the records over a :class:`ControlPlane`
    (the host's shared-memory control plane once wired; :class:`StorePlane` over any pydist or
    torch store today) and checks that every rank is at the same call. ``open_peers`` then
    applies the peers' freed lists to an IpcCache (invalidation) and maps their segments
    through it; ``release_peers`` ends those uses.

Cost
    One all-gather of ~100 bytes plus the handle and event bytes (CUDA: 64 each) per rank per
    call: over the store, one set, one wait and one multi_get (a few round trips of the
    store, ~100 µs over TCP); over the shared-memory plane, a few µs. Store keys: each rank
    keeps at most two of its own (it deletes round r-1's key once round r is complete, when
    every rank has read it).

Failure modes
    A malformed record raises ValueError saying what is wrong (wrong magic, version, length).
    A rank at another call (sequence number) raises DesyncError naming both ranks and both
    numbers; a record in the wrong position DistBackendError. A rank that never publishes
    makes the store wait raise DistStoreError (StoreTimeoutError) naming the missing key, at
    the deadline.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol, TypeVar

from ..core.deadline import Deadline
from ..core.errors import DesyncError, DistBackendError
from .ipc_cache import IpcCache, SegmentHandle

M = TypeVar("M")

_MAGIC = b"PDIH"
_VERSION = 1
#: magic, version, rank, seq, segment base, segment length, offset, nbytes, handle, event, freed
_HEAD = struct.Struct("!4sHIQQQQQHHI")


@dataclasses.dataclass(frozen=True)
class TensorHandle:
    """One rank's device tensor for one call, as its peers on the host need it."""

    rank: int
    seq: int
    segment: SegmentHandle
    offset: int
    nbytes: int
    event: bytes = b""
    freed: tuple[int, ...] = ()


def encode(record: TensorHandle) -> bytes:
    """``record`` as bytes (``decode`` reads it back)."""
    segment = record.segment
    head = _HEAD.pack(_MAGIC, _VERSION, record.rank, record.seq, segment.base, segment.length,
                      record.offset, record.nbytes, len(segment.handle), len(record.event), len(record.freed))
    return head + segment.handle + record.event + struct.pack(f"!{len(record.freed)}Q", *record.freed)


def decode(data: bytes) -> TensorHandle:
    """The record ``encode`` made; ValueError naming what is wrong with anything else."""
    if len(data) < _HEAD.size:
        raise ValueError(f"an IPC handle record is at least {_HEAD.size} bytes, got {len(data)}")
    magic, version, rank, seq, base, length, offset, nbytes, handle_len, event_len, freed = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not an IPC handle record (magic {magic!r})")
    if version != _VERSION:
        raise ValueError(f"IPC handle record version {version}, this pydist reads {_VERSION}")
    expected = _HEAD.size + handle_len + event_len + 8 * freed
    if len(data) != expected:
        raise ValueError(f"IPC handle record of {len(data)} bytes, its header says {expected}")
    at = _HEAD.size
    handle = bytes(data[at:at + handle_len])
    event = bytes(data[at + handle_len:at + handle_len + event_len])
    bases = struct.unpack_from(f"!{freed}Q", data, at + handle_len + event_len)
    return TensorHandle(rank, seq, SegmentHandle(base, length, handle), offset, nbytes, event, tuple(bases))


class ControlPlane(Protocol):
    """An all-gather of bytes among the ranks of one host (position i: rank i's bytes)."""

    def all_gather(self, payload: bytes, deadline: Deadline) -> list[bytes]: ...


class KeyValue(Protocol):
    """The part of pydist's (or torch's) Store that StorePlane uses."""

    def set(self, key: str, value: bytes) -> None: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...

    def delete_key(self, key: str) -> bool: ...


class StorePlane:
    """ControlPlane over a store: round r's bytes of rank i under ``{prefix}/{r}/{i}``."""

    def __init__(self, store: KeyValue, prefix: str, rank: int, size: int):
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a plane of {size} ranks")
        self.store, self.prefix, self.rank, self.size = store, prefix, rank, size
        self.round = 0

    def _key(self, round_: int, rank: int) -> str:
        return f"{self.prefix}/{round_}/{rank}"

    def all_gather(self, payload: bytes, deadline: Deadline) -> list[bytes]:
        keys = [self._key(self.round, i) for i in range(self.size)]
        self.store.set(keys[self.rank], payload)
        left = deadline.remaining()
        self.store.wait(keys, timedelta(days=365) if left is None else timedelta(seconds=left))
        found = self.store.multi_get(keys)
        if self.round:  # every rank set this round's key, so all have read the last one
            self.store.delete_key(self._key(self.round - 1, self.rank))
        self.round += 1
        return found


def exchange(plane: ControlPlane, mine: TensorHandle, deadline: Deadline) -> list[TensorHandle]:
    """Every host rank's record for this call (position i: rank i's), checked to be one call."""
    records = [decode(data) for data in plane.all_gather(encode(mine), deadline)]
    for position, record in enumerate(records):
        if record.rank != position:
            raise DistBackendError(f"IPC handle exchange: position {position} holds rank {record.rank}'s record")
        if record.seq != mine.seq:
            raise DesyncError(f"IPC handle exchange: rank {mine.rank} is at call {mine.seq}, "
                              f"rank {record.rank} at call {record.seq}")
    return records


def open_peers(cache: IpcCache[M], records: Sequence[TensorHandle], me: int) -> dict[int, M]:
    """{peer: mapping of its segment} for every record but ``me``'s, after invalidating the
    segments each peer says it freed; pair with ``release_peers``."""
    mapped: dict[int, M] = {}
    try:
        for record in records:
            if record.rank == me:
                continue
            for base in record.freed:
                cache.invalidate(record.rank, base)
            mapped[record.rank] = cache.acquire(record.rank, record.segment)
    except BaseException:
        release_peers(cache, mapped)
        raise
    return mapped


def release_peers(cache: IpcCache[M], mapped: dict[int, M]) -> None:
    """End the uses ``open_peers`` began."""
    for peer, mapping in mapped.items():
        cache.release(peer, mapping)
