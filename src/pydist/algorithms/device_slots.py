"""A group's device buffers on one host, and the round protocol every device collective follows.

Behaviour
    :class:`DeviceSlots` is one rank's share of its host's device memory for a group: a buffer
    of two slots of ``slot_bytes`` (taken in turn, round after round, as the arena alternates
    its parities) allocated outside any caching allocator (``Device.allocate``); per slot one
    interprocess event per phase, the *mark* (this rank's writes of that phase are enqueued
    before it), and a *done* event (its reads of the peers' slots are enqueued before it); and
    the peers' buffers and events, opened once for the group's life (pydist.device.peers,
    exchanged over the host's arena by :class:`ArenaPlane`). Every round of a device collective:

    1. ``begin(stream)``: the next slot; the stream waits for every peer's *done* of that slot
       (their reads of its previous use, two rounds ago, are done before it is overwritten);
    2. the rank writes its slot on the stream (copies, PREMUL_SUM's prescale), then
       ``publish(round, phase)``: record the phase's mark, then the host barrier (``Arena.sync``,
       which also compares the call's fingerprint and names a rank that does not come);
    3. ``await_peers(round, phase, peers)``: the stream waits for those peers' marks; it reads
       their slots (a two-phase algorithm writes again, publishes phase 1, awaits, reads);
    4. ``finish(round)``: record *done*.

    Why that is safe: cudaStreamWaitEvent waits for an event's most recent record *at the
    call*. Every wait here is made after a host barrier that the peer passed only after
    recording what is waited for, and before a barrier that it must pass before recording that
    event again (a mark is recorded once per use of its slot, *done* once per round, a slot is
    used every second round). Nothing spins on the device for another process (without MPS
    the kernels of processes sharing a GPU do not run side by side); the host never waits for
    the device.

    :class:`DeviceCall` is one call as an algorithm sees it: the slots, the stream its work goes
    to (the caller's current stream for a blocking call, the group's for async_op), the
    operation (its deadline and description for the barrier's errors) and the fingerprint,
    checked at the call's first barrier.

    **Entry points for the composition across hosts (issue 47 item 3).** The one-host
    algorithms ``device_allreduce_oneshot.all_reduce``, ``device_allreduce_twoshot.all_reduce``,
    ``device_broadcast.broadcast``, ``device_reduce.reduce``, ``device_allgather.all_gather`` and
    ``device_reduce_scatter.reduce_scatter`` each take a DeviceCall and device arrays of this
    rank (any shape, contiguous: ``Device.flat``), with roots as ranks *of the slots* (0 ..
    ``slots.size - 1``: the arena's order). For a group spanning hosts, open the slots on the
    host's arena (``DeviceSlots.open(device, host_arena, operation, slot_bytes)``, once per
    group, every rank of the host at once): the algorithms then run among this host's ranks.
    They only enqueue: the results are on ``call.stream`` (a host that reads them synchronizes
    it, e.g. ``Device.to_host``).

Cost
    Per round: one host barrier per phase, one event record per phase plus one, one event wait
    per peer and phase plus one per peer; device memory: ``2 * slot_bytes`` per rank and group.
    Opening: one exchange of ~1 KiB per rank over the arena, an open per peer buffer and event.

Failure modes
    A rank that does not come to a barrier: the arena's OpTimeoutError naming it (its
    PeerFailedError, once the rank is known dead); ranks in different calls: DesyncError. A
    device call that fails: DeviceError naming the call, the rank and the device. ``open``
    closes what it opened before re-raising.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..device.dtypes import dtype
from ..device.errors import DeviceError
from ..device.events import Event, Stream
from ..device.interface import Device
from ..device.memory import Buffer, Memory
from ..device.peers import PeerTable
from . import _shm_sizes

#: Marks per slot: the most phases a round of a device algorithm has (two-shot all_reduce: 2).
PHASES = 2
_LENGTH = struct.Struct("<Q")


class ArenaPlane:
    """pydist.device.peers.ControlPlane over a group's arena: an all-gather of bytes, in
    pieces of a slot (minus 8 bytes of length) per barrier, within ``operation``'s deadline."""

    def __init__(self, arena: Any, operation: Any):
        self.arena = arena
        self.operation = operation

    def all_gather(self, payload: bytes, deadline: Deadline | None = None) -> list[bytes]:
        """Every member's ``payload``, in arena order (``deadline``: the operation's governs)."""
        arena = self.arena
        room = arena.slot_bytes - _LENGTH.size
        if room < 1:
            raise ValueError(f"an arena slot of {arena.slot_bytes} bytes carries no payload")
        found: list[bytearray] = [bytearray() for _ in range(arena.size)]
        lengths = [len(payload)] + [0] * (arena.size - 1)
        sent, first = 0, True
        while first or any(len(got) < length for got, length in zip(found, lengths)):
            parity = arena.next_parity()
            slot = arena.slot(parity, arena.rank, np.dtype(np.uint8))
            piece = payload[sent:sent + room]
            _LENGTH.pack_into(slot, 0, len(payload))
            slot[_LENGTH.size:_LENGTH.size + len(piece)] = np.frombuffer(piece, np.uint8)
            sent += len(piece)
            arena.sync(self.operation)
            for member in range(arena.size):
                theirs = arena.slot(parity, member, np.dtype(np.uint8))
                length = _LENGTH.unpack_from(theirs, 0)[0]
                if first:
                    lengths[member] = length
                take = min(room, lengths[member] - len(found[member]))
                found[member] += theirs[_LENGTH.size:_LENGTH.size + take].tobytes()
            first = False
        return [bytes(got) for got in found]


def free_when_closed(device: Device, buffer: Buffer, deadline: Deadline) -> None:
    """Free ``buffer`` once no live peer has it open (polling until ``deadline``; then the
    device's DeviceError naming them)."""
    if buffer.closed:
        return
    if buffer.ledger is not None:
        ledger = buffer.ledger
        _deadline.poll_until(lambda: not ledger.openers(), deadline)
    device.free(buffer)


def _same_build(device: Device, arena: Any, builds: list[bytes]) -> None:
    """DeviceError on every member when the members drive their devices with different builds
    (their IPC handles may not be each other's)."""
    if len(set(builds)) > 1:
        said = "; ".join(f"rank {arena.group_ranks[m]} runs {build.decode(errors='replace')}"
                         for m, build in enumerate(builds))
        raise DeviceError("open the group's device buffers", device.where,
                          f"the ranks of this host differ in build ({said}): run one torch and CUDA everywhere")


@dataclasses.dataclass
class Round:
    """One round of a collective: the slot (parity) it uses."""

    parity: int


class DeviceSlots:
    """One rank's device slots and events for a group on its host, and its peers' (module docstring)."""

    def __init__(self, device: Device, arena: Any, slot_bytes: int, buffer: Buffer, marks: list[list[Event]],
                 done: list[Event], table: PeerTable):
        self.device = device
        self.arena = arena  # None for a group of one rank
        self.rank = arena.rank if arena is not None else 0
        self.size = arena.size if arena is not None else 1
        self.slot_bytes = slot_bytes
        self.buffer = buffer
        self.marks = marks  # [parity][phase]
        self.done = done  # [parity]
        self.table = table
        self.peers = [member for member in range(self.size) if member != self.rank]
        self._uses = 0

    @classmethod
    def open(cls, device: Device, arena: Any, operation: Any, slot_bytes: int) -> DeviceSlots:
        """Allocate this rank's buffer and events and open the peers' (every member of the
        arena calls it at once, as a collective; ``arena`` None: a group of one rank)."""
        if slot_bytes < 64 or slot_bytes % 64:
            raise ValueError(f"slot_bytes: expected a multiple of 64 of at least 64, got {slot_bytes}")
        buffer = device.allocate(2 * slot_bytes)
        try:
            marks = [[device.event(interprocess=True) for _ in range(PHASES)] for _ in range(2)]
            done = [device.event(interprocess=True) for _ in range(2)]
            events = [event for parity in range(2) for event in (*marks[parity], done[parity])]
            if arena is None:
                table = PeerTable(device, [], 0)
            else:
                plane = ArenaPlane(arena, operation)
                _same_build(device, arena, plane.all_gather(device.build.encode()))
                table = PeerTable.exchange(device, plane, arena.rank, buffer, events, operation.deadline)
        except BaseException:
            device.free(buffer)
            raise
        return cls(device, arena, slot_bytes, buffer, marks, done, table)

    # -- memory -----------------------------------------------------------------------------

    def memory(self, member: int) -> Memory:
        """Member ``member``'s buffer: this rank's own, or its mapping of a peer's."""
        return self.buffer if member == self.rank else self.table.mappings[member]

    def capacity(self, dtype_name: str) -> int:
        """Elements of ``dtype_name`` a slot holds."""
        return self.slot_bytes // dtype(dtype_name).itemsize

    def view(self, member: int, round_: Round, dtype_name: str, count: int, offset: int = 0) -> Any:
        """``count`` elements of ``dtype_name`` at element ``offset`` of member's slot of ``round_``."""
        itemsize = dtype(dtype_name).itemsize
        if (offset + count) * itemsize > self.slot_bytes:
            raise ValueError(f"{count} elements at {offset} of {dtype_name} exceed a slot of {self.slot_bytes} bytes")
        return self.device.view(self.memory(member), dtype_name, count,
                                round_.parity * self.slot_bytes + offset * itemsize)

    # -- the round protocol -----------------------------------------------------------------

    def begin(self, stream: Stream) -> Round:
        """The next round: its slot, once every peer's reads of that slot's last use are done."""
        parity = self._uses & 1
        self._uses += 1
        for peer in self.peers:
            stream.wait_event(self._peer_event(peer, parity, PHASES))
        return Round(parity)

    def publish(self, call: DeviceCall, round_: Round, phase: int = 0) -> None:
        """This rank's writes of ``phase`` are enqueued: record its mark, then the host barrier."""
        self.marks[round_.parity][phase].record(call.stream)
        if self.arena is not None:
            self.arena.sync(call.operation, call.fingerprint)
        call.fingerprint = 0  # compared once per call

    def await_peers(self, stream: Stream, round_: Round, peers: Iterable[int], phase: int = 0) -> None:
        """Later work on ``stream`` waits for those peers' writes of ``phase`` in this round."""
        for peer in peers:
            if peer != self.rank:
                stream.wait_event(self._peer_event(peer, round_.parity, phase))

    def finish(self, stream: Stream, round_: Round) -> None:
        """This rank's reads of the round are enqueued (peers may rewrite their slots after them)."""
        self.done[round_.parity].record(stream)

    def _peer_event(self, peer: int, parity: int, index: int) -> Event:
        return self.table.events[peer][parity * (PHASES + 1) + index]

    def close(self, deadline: Deadline) -> None:
        """Close the peers' mappings, then free this rank's buffer once the peers closed theirs
        (they do at their own destroy), waiting until ``deadline`` (DeviceError past it, or
        while work or arrays still use them). Its events go in any case (their files with
        them), even while a failed call's traceback still holds this object."""
        try:
            self.table.close()
            free_when_closed(self.device, self.buffer, deadline)
        finally:
            self.marks, self.done = [], []


@dataclasses.dataclass
class DeviceCall:
    """One call of a device algorithm: the slots, the stream its work goes to, the operation
    (``deadline``, ``timeout_text``, ``describe()``: a Comm) and the call's fingerprint."""

    slots: DeviceSlots
    stream: Stream
    operation: Any
    fingerprint: int = 0

    @property
    def device(self) -> Device:
        return self.slots.device

    def rounds(self, count: int, per_round: int) -> list[tuple[int, int]]:
        """[start, stop) element ranges of at most ``per_round`` covering ``count`` (one empty
        range for 0: every call meets its peers at least once, so they compare fingerprints)."""
        per_round = max(1, per_round)
        return [(start, min(start + per_round, count)) for start in range(0, count, per_round)] or [(0, 0)]


def contribute(call: DeviceCall, round_: Round, dtype_name: str, part: Any, op: Any = None, offset: int = 0) -> None:
    """Enqueue ``part`` (1-D, this rank's device) into this rank's slot at element ``offset``,
    prescaled by ``op`` (PREMUL_SUM) when one is given."""
    device, stream = call.device, call.stream
    mine = call.slots.view(call.slots.rank, round_, dtype_name, count_of(device, part), offset)
    device.copy(mine, part, stream)
    if op is not None:
        device.prescale(mine, op, stream)


def combine(call: DeviceCall, round_: Round, dtype_name: str, out: Any, op: Any, offset: int = 0) -> None:
    """Enqueue ``out`` = the reduction of every member's slot at element ``offset``, in rank
    order (so every rank that computes it gets the same bits)."""
    device, stream, slots = call.device, call.stream, call.slots
    count = count_of(device, out)
    device.copy(out, slots.view(0, round_, dtype_name, count, offset), stream)
    for member in range(1, slots.size):
        device.reduce_into(out, slots.view(member, round_, dtype_name, count, offset), op, stream)


def piece_elements(slots: DeviceSlots, dtype_name: str) -> int:
    """Elements of ``dtype_name`` in each of a slot's pieces (one per rank: reduce_scatter,
    scatter, all_to_all); ValueError when a slot cannot give every rank one."""
    per = slots.capacity(dtype_name) // slots.size
    if per < 1:
        raise ValueError(f"a device slot of {slots.slot_bytes} bytes cannot hold one {dtype_name} element for each "
                         f"of {slots.size} ranks: raise PYDIST_DEVICE_SLOT_BYTES")
    return per


def exchange_sizes(call: DeviceCall, table: list[int]) -> list[Any]:
    """Every member's ``table`` of sizes (pydist.algorithms._shm_sizes over the slots' arena,
    with the call's fingerprint; a group of one: its own)."""
    if call.slots.arena is None:
        return [np.asarray(table, np.int64)]
    tables = _shm_sizes.exchange_sizes(call.operation, table)
    call.fingerprint = 0  # compared by that barrier
    return tables


def dtype_of(device: Device, array: Any) -> str:
    """The dtype name of a device array."""
    return device.describe(array)[0].name


def count_of(device: Device, array: Any) -> int:
    """The number of elements of a device array."""
    return int(np.prod(device.describe(array)[1]))
