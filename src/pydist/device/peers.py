"""The ranks of a host share their device buffers and events once per group, then reuse them.

Behaviour
    A group's engine gives each rank one dedicated buffer and a few interprocess events (per
    slot: "written" and "read", say). :class:`Offer` is what a rank offers its host peers:
    its rank, its device's UUID, its buffer's handle and its events' handles; ``encode`` /
    ``decode`` are its sans-IO wire form. ``PeerTable.exchange`` all-gathers the offers over a
    :class:`ControlPlane` (the engine's: the host's shared-memory arena,
    pydist.algorithms.device_slots.ArenaPlane), checks that position i holds rank i, and
    opens each peer's buffer and events once, for the group's life: calls then copy through
    the same mappings (no handle per call, no reopening). ``close`` closes the mappings (each
    owner frees its buffer after every peer closed: the ledger refuses before).

Cost
    One all-gather of ~100 bytes plus the handles (~150 bytes each) per rank at group
    creation; an open per peer buffer and event (CUDA: tens to hundreds of µs each); nothing
    per call.

Failure modes
    A malformed offer: ValueError naming what is wrong. A record in the wrong position:
    DistBackendError. A rank that never publishes: the plane's timeout error naming it. A
    handle that cannot be opened: DeviceError (pydist.device.interface), after closing what
    was opened.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Protocol

from ..core.deadline import Deadline
from ..core.errors import DistBackendError
from .events import Event
from .interface import Device
from .memory import Buffer, Mapping

_MAGIC = b"PDPO"
_VERSION = 1
#: magic, version, rank, events, uuid length, buffer handle length
_HEAD = struct.Struct("!4sHIHHH")
_LENGTH = struct.Struct("!H")
MAX_EVENTS = 64


@dataclasses.dataclass(frozen=True)
class Offer:
    """One rank's shared memory for its host peers: a buffer's handle, its events' handles."""

    rank: int
    device_uuid: str
    buffer: bytes
    events: tuple[bytes, ...] = ()


def encode(offer: Offer) -> bytes:
    """``offer`` as bytes (``decode`` reads it back)."""
    if len(offer.events) > MAX_EVENTS:
        raise ValueError(f"an offer holds at most {MAX_EVENTS} events, got {len(offer.events)}")
    uuid = offer.device_uuid.encode()
    head = _HEAD.pack(_MAGIC, _VERSION, offer.rank, len(offer.events), len(uuid), len(offer.buffer))
    return head + uuid + offer.buffer + b"".join(_LENGTH.pack(len(e)) + e for e in offer.events)


def decode(data: bytes) -> Offer:
    """The offer ``encode`` made; ValueError naming what is wrong with anything else."""
    if len(data) < _HEAD.size:
        raise ValueError(f"a device offer is at least {_HEAD.size} bytes, got {len(data)}")
    magic, version, rank, count, n_uuid, n_buffer = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not a device offer (magic {magic!r})")
    if version != _VERSION:
        raise ValueError(f"device offer version {version}, this pydist reads {_VERSION}")
    if count > MAX_EVENTS:
        raise ValueError(f"a device offer of {count} events (at most {MAX_EVENTS})")
    at = _HEAD.size + n_uuid + n_buffer
    if len(data) < at:
        raise ValueError(f"a device offer of {len(data)} bytes, its header says at least {at}")
    uuid, buffer = data[_HEAD.size:_HEAD.size + n_uuid], data[_HEAD.size + n_uuid:at]
    events = []
    for _ in range(count):
        if len(data) < at + _LENGTH.size:
            raise ValueError("a device offer cut short in its events")
        (length,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if len(data) < at + length:
            raise ValueError("a device offer cut short in its events")
        events.append(bytes(data[at:at + length]))
        at += length
    if at != len(data):
        raise ValueError(f"a device offer with {len(data) - at} bytes past its end")
    return Offer(rank, bytes(uuid).decode(errors="replace"), bytes(buffer), tuple(events))


class ControlPlane(Protocol):
    """An all-gather of bytes among the ranks of one host (position i: rank i's bytes)."""

    def all_gather(self, payload: bytes, deadline: Deadline) -> list[bytes]: ...


class PeerTable:
    """This rank's host peers' buffers and events, opened once (module docstring)."""

    def __init__(self, device: Device, offers: Sequence[Offer], rank: int):
        self.device = device
        self.rank = rank
        self.offers = {offer.rank: offer for offer in offers}
        self.mappings: dict[int, Mapping] = {}
        self.events: dict[int, list[Event]] = {}

    @classmethod
    def exchange(cls, device: Device, plane: ControlPlane, rank: int, buffer: Buffer, events: Sequence[Event],
                 deadline: Deadline) -> PeerTable:
        """Share ``buffer`` and ``events`` with the host's ranks over ``plane`` and open theirs."""
        mine = Offer(rank, device.uuid, device.export(buffer), tuple(event.export() for event in events))
        offers = [decode(data) for data in plane.all_gather(encode(mine), deadline)]
        for position, offer in enumerate(offers):
            if offer.rank != position:
                raise DistBackendError(f"device handle exchange: position {position} holds rank {offer.rank}'s offer")
        table = cls(device, offers, rank)
        try:
            for offer in offers:
                if offer.rank != rank:
                    table.mappings[offer.rank] = device.open(offer.buffer)
                    table.events[offer.rank] = [device.open_event(handle) for handle in offer.events]
        except BaseException:
            table.close()
            raise
        return table

    def close(self) -> None:
        """Close every peer mapping (DeviceError, from the device, while one is in use)."""
        self.events.clear()
        while self.mappings:
            peer, mapping = self.mappings.popitem()
            self.device.close(mapping)
