"""send and recv between two ranks of one host, device to device: one channel per direction.

Behaviour
    A :class:`Sender` (this rank to a peer, made at the first send there) owns a device buffer
    of two slots and a *sent* event per slot; it hands their handles to the peer once (a HELLO
    message), and the peer's :class:`Receiver` hands back its *done* event per slot once (DONE).
    Each message goes in chunks of a slot, the channel's chunks numbered c = 0, 1, 2...:

    - the sender (chunk c in slot c % 2): from c = 2 on, once the receiver acknowledged chunk
      c - 2 (ACK) its stream waits for the receiver's *done* of the slot; it copies the chunk
      into the slot, records *sent*, and sends a READY header (message number, chunk, offset,
      count, total, dtype) over the host transport: the first chunk of a message under the
      user's tag (so receives match messages by tag, in order, as host ones do), the others
      under the message's number;
    - the receiver, given READY, makes its stream wait for the sender's *sent* of the slot,
      copies the chunk out, records *done* and sends ACK(c).

    Every wait is on a record made before the host message that announced it, and the event
    is recorded again only after a host message this wait precedes (two slots: chunk c + 2
    needs ACK(c)), which is what cudaStreamWaitEvent needs. Nothing waits on the device for
    the host or another process. The machine runs on transport callbacks (``Request``
    completions), so sends and receives posted in any order progress independently; a
    channel sends its messages one after another. A message's ``on_enqueued(error, source)``
    is called once all its device work is enqueued (the host part is done) or it failed.

    Messages are keyed by sequence numbers no collective reaches (READY_SEQ and below), in the
    group's message space.

    A group spanning hosts sends to a rank on another host through the staged path
    (algorithms/device_staged_p2p.py), whose header is a READY header of magic STAGED under the
    same key: a receive, from that rank or from any, takes either kind; given a STAGED one it
    hands the message to the Channels' ``staged`` (the sender's message number and elements
    per chunk with it).

Cost
    Per chunk: one device copy, one record and one wait on each side, a READY and an ACK of a
    few dozen bytes over the host transport; per channel: a buffer of two slots, once.

Failure modes
    A received header whose size or dtype differs from the receive's: DistBackendError naming
    the sender. A transport error (a peer gone): the messages of that channel fail with it.
    At most two chunks per direction are in flight: a sender of a longer message waits for the
    receiver to take the first (it posts its receive), as NCCL's and MPI's large sends may.
"""
from __future__ import annotations

import dataclasses
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.deadline import Deadline
from ..core.errors import DistBackendError
from ..device.dtypes import DTYPES, dtype
from ..device.events import Event, Stream
from ..device.interface import Device
from ..device.memory import Mapping
from ..device.peers import Offer, decode, encode
from ..transport.base import MessageKey, Request
from .device_slots import free_when_closed

READY_SEQ, CHUNK_SEQ, ACK_SEQ, HELLO_SEQ, DONE_SEQ, STAGED_SEQ = ((1 << 64) - n for n in range(1, 7))
_NAMES = list(DTYPES)
_READY = struct.Struct("<4sQQQQQBB")  # magic, message, chunk, offset, count, total, dtype, slot
_CHANNEL = b"PDP2"
#: The READY header's magic for a message staged across hosts (module docstring)
STAGED = b"PDST"
_ACK = struct.Struct("<4sQ")
_HELLO_BYTES = 2048
_LENGTH = struct.Struct("<I")
OnEnqueued = Callable[[BaseException | None, int | None], None]


def _hello(offer: Offer) -> bytearray:
    data = encode(offer)
    message = bytearray(_HELLO_BYTES)
    _LENGTH.pack_into(message, 0, len(data))
    message[_LENGTH.size:_LENGTH.size + len(data)] = data
    return message


def _offer(message: bytearray) -> Offer:
    (length,) = _LENGTH.unpack_from(message, 0)
    if length > _HELLO_BYTES - _LENGTH.size:
        raise ValueError(f"a device p2p handshake of {length} bytes")
    return decode(bytes(message[_LENGTH.size:_LENGTH.size + length]))


@dataclasses.dataclass
class Message:
    """One send or receive: a contiguous 1-D device array, its tag, the stream its work goes to."""

    flat: Any
    count: int
    dtype_name: str
    tag: int
    stream: Stream
    on_enqueued: OnEnqueued
    number: int = 0
    offset: int = 0
    started: bool = False
    deadline: Deadline | None = None  # a staged message's (the group's timeout from its post)
    what: str = "a device send or recv"


#: A staged message taken by a receive: (the receive's message, the sender's group rank, the
#: sender's message number, its elements per chunk)
OnStaged = Callable[[Message, int, int, int], None]


def staged_header(number: int, unit: int, message: Message) -> bytes:
    """The READY header of a staged ``message`` (module docstring): its ``number`` and the
    sender's elements per chunk, ``unit``."""
    return _READY.pack(STAGED, number, unit, 0, message.count, message.count, _NAMES.index(message.dtype_name), 0)


class Channels:
    """A group's device point-to-point on this rank: its senders and receivers by peer."""

    def __init__(self, transport: Any, group_id: int, transport_ranks: list[int], rank: int, device: Device,
                 slot_bytes: int, staged: OnStaged | None = None):
        self.transport = transport
        self.staged = staged  # takes the staged messages a receive matched (a group spanning hosts)
        self.group_id = group_id
        self.transport_ranks = transport_ranks
        self.rank = rank
        self.device = device
        self.slot_bytes = slot_bytes
        self.lock = threading.RLock()
        self.senders: dict[int, Sender] = {}
        self.receivers: dict[int, Receiver] = {}
        self._hellos: dict[int, list[Callable[[Receiver], None]]] = {}  # source -> waiting on its HELLO

    def key(self, seq: int, tag: int) -> MessageKey:
        return MessageKey(self.group_id, seq, tag)

    def send(self, message: Message, peer: int) -> None:
        """Start sending ``message`` to group rank ``peer``."""
        with self.lock:
            sender = self.senders.get(peer)
            if sender is None:
                sender = self.senders[peer] = Sender(self, peer)
        sender.post(message)

    def recv(self, message: Message, peer: int | None) -> None:
        """Start receiving ``message`` from group rank ``peer`` (None: any)."""
        Incoming(self, message, peer).start()

    def receiver(self, source: int, then: Callable[[Receiver], None]) -> None:
        """Call ``then`` with the receiver of ``source``'s channel (made at its HELLO)."""
        with self.lock:
            found = self.receivers.get(source)
            if found is None:
                waiting = self._hellos.setdefault(source, [])
                waiting.append(then)
                if len(waiting) > 1:
                    return
        if found is not None:
            then(found)
            return
        hello = bytearray(_HELLO_BYTES)
        request = self.transport.irecv(self.transport_ranks[source], memoryview(hello),
                                       self.key(HELLO_SEQ, 0))
        request.add_callback(lambda done: self._hello_came(source, hello, done))

    def _hello_came(self, source: int, hello: bytearray, request: Request) -> None:
        receiver = None if request.error is not None else Receiver(self, source, _offer(hello))
        with self.lock:
            if receiver is not None:
                self.receivers[source] = receiver
            waiting = self._hellos.pop(source, [])
        for then in waiting:
            if receiver is None:
                then(None)  # type: ignore[arg-type]  # the caller reports request.error
            else:
                then(receiver)

    def close(self, deadline: Deadline) -> None:
        """Close the peers' buffers, then free this rank's once they closed them (until
        ``deadline``; DeviceError past it or while in use)."""
        for receiver in self.receivers.values():
            self.device.close(receiver.mapping)
        self.receivers.clear()
        for sender in self.senders.values():
            sender.close()
            free_when_closed(self.device, sender.buffer, deadline)
        self.senders.clear()


class Sender:
    """This rank's channel to one peer (module docstring)."""

    def __init__(self, channels: Channels, peer: int):
        device = channels.device
        self.channels, self.peer, self.device = channels, peer, device
        self.buffer = device.allocate(2 * channels.slot_bytes)
        self.sent = [device.event(interprocess=True) for _ in range(2)]
        self.peer_done: list[Event] | None = None
        self.acked: set[int] = set()
        self.chunk = 0
        self.messages = 0
        self.queue: deque[Message] = deque()
        self.failure: BaseException | None = None
        self.where = channels.transport_ranks[peer]
        self.waiting: list[Request] = []  # its receives of the peer's DONE and next ACK
        offer = Offer(channels.rank, device.uuid, device.export(self.buffer), tuple(e.export() for e in self.sent))
        channels.transport.isend(self.where, memoryview(_hello(offer)), channels.key(HELLO_SEQ, 0))
        done = bytearray(_HELLO_BYTES)
        request = channels.transport.irecv(self.where, memoryview(done), channels.key(DONE_SEQ, 0))
        self.waiting.append(request)
        request.add_callback(lambda request: self._done_came(done, request))
        self._await_ack()

    def post(self, message: Message) -> None:
        with self.channels.lock:
            if self.failure is not None:
                message.on_enqueued(self.failure, None)
                return
            message.number = self.messages
            self.messages += 1
            self.queue.append(message)
        self.pump()

    def _await_ack(self) -> None:
        ack = bytearray(_ACK.size)
        request = self.channels.transport.irecv(self.where, memoryview(ack), self.channels.key(ACK_SEQ, 0))
        with self.channels.lock:
            self.waiting = [waiting for waiting in self.waiting if not waiting.done()] + [request]
        request.add_callback(lambda done: self._ack_came(ack, done))

    def _ack_came(self, ack: bytearray, request: Request) -> None:
        if request.error is not None:
            self._fail(request.error)
            return
        with self.channels.lock:
            self.acked.add(_ACK.unpack(ack)[1])
        self._await_ack()
        self.pump()

    def _done_came(self, done: bytearray, request: Request) -> None:
        if request.error is not None:
            self._fail(request.error)
            return
        events = [self.device.open_event(handle) for handle in _offer(done).events]
        with self.channels.lock:
            self.peer_done = events
        self.pump()

    def _fail(self, error: BaseException) -> None:
        with self.channels.lock:
            self.failure = self.failure or error
            waiting, self.queue = list(self.queue), deque()
        for message in waiting:
            message.on_enqueued(self.failure, None)

    def close(self) -> None:
        """Withdraw its receives (their callbacks hold it) and drop its events: the group is
        destroyed, so the events' files go now, not at the process's exit."""
        with self.channels.lock:
            waiting, self.waiting = self.waiting, []
            self.sent, self.peer_done = [], None
        for request in waiting:
            if not request.done():
                self.channels.transport.cancel(request)

    def pump(self) -> None:
        """Send what the slots allow now (module docstring)."""
        with self.channels.lock:
            while self.queue and self.failure is None:
                message = self.queue[0]
                chunk, slot = self.chunk, self.chunk % 2
                if chunk >= 2 and (chunk - 2 not in self.acked or self.peer_done is None):
                    return
                try:
                    self._send_chunk(message, chunk, slot)
                except Exception as error:  # noqa: BLE001 - the message fails with it, and the channel
                    self.failure = error
                    self.queue.popleft()
                    message.on_enqueued(error, None)
                    continue
                if message.offset >= message.count:
                    self.queue.popleft()
                    message.on_enqueued(None, None)
            if self.failure is not None:
                self._fail(self.failure)

    def _send_chunk(self, message: Message, chunk: int, slot: int) -> None:
        device, stream, channels = self.device, message.stream, self.channels
        if chunk >= 2:
            assert self.peer_done is not None
            stream.wait_event(self.peer_done[slot])
            self.acked.discard(chunk - 2)
        itemsize = dtype(message.dtype_name).itemsize
        count = min(channels.slot_bytes // itemsize, message.count - message.offset)
        if count:
            target = device.view(self.buffer, message.dtype_name, count, slot * channels.slot_bytes)
            device.copy(target, message.flat[message.offset:message.offset + count], stream)
        self.sent[slot].record(stream)
        header = _READY.pack(_CHANNEL, message.number, chunk, message.offset, count, message.count,
                             _NAMES.index(message.dtype_name), slot)
        key = channels.key(READY_SEQ, message.tag) if not message.started else channels.key(CHUNK_SEQ, message.number)
        channels.transport.isend(self.where, memoryview(header), key)
        message.started = True
        message.offset += count
        self.chunk += 1


class Receiver:
    """A peer's channel to this rank: its buffer and sent events, this rank's done events."""

    def __init__(self, channels: Channels, source: int, offer: Offer):
        device = channels.device
        self.mapping: Mapping = device.open(offer.buffer)
        self.sent = [device.open_event(handle) for handle in offer.events]
        self.done = [device.event(interprocess=True) for _ in range(2)]
        reply = Offer(channels.rank, device.uuid, b"", tuple(e.export() for e in self.done))
        channels.transport.isend(channels.transport_ranks[source], memoryview(_hello(reply)),
                                 channels.key(DONE_SEQ, 0))


class Incoming:
    """One receive's progress through its chunks (module docstring)."""

    def __init__(self, channels: Channels, message: Message, peer: int | None):
        self.channels, self.message, self.peer = channels, message, peer

    def start(self) -> None:
        self._expect(self.channels.key(READY_SEQ, self.message.tag))

    def _expect(self, key: MessageKey) -> None:
        header = bytearray(_READY.size)
        source = None if self.peer is None else self.channels.transport_ranks[self.peer]
        request = self.channels.transport.irecv(source, memoryview(header), key)
        request.add_callback(lambda done: self._header_came(header, done))

    def _header_came(self, header: bytearray, request: Request) -> None:
        if request.error is not None:
            self.message.on_enqueued(request.error, None)
            return
        assert request.source is not None
        self.peer = self.channels.transport_ranks.index(request.source)
        fields = _READY.unpack(header)
        total, name = fields[5], _NAMES[fields[6]] if fields[6] < len(_NAMES) else "?"
        if fields[0] not in (_CHANNEL, STAGED) or total != self.message.count or name != self.message.dtype_name:
            self.message.on_enqueued(DistBackendError(
                f"recv from group rank {self.peer}: it sent {total} elements of {name}, this receive expects "
                f"{self.message.count} of {self.message.dtype_name}"), self.peer)
            return
        if fields[0] == STAGED:
            if self.channels.staged is None:
                self.message.on_enqueued(DistBackendError(f"recv from group rank {self.peer}: a staged message "
                                                          "in a group on one host"), self.peer)
            else:
                self.channels.staged(self.message, self.peer, fields[1], fields[2])
            return
        self.channels.receiver(self.peer, lambda receiver: self._take(receiver, fields, request))

    def _take(self, receiver: Receiver | None, fields: tuple, request: Request) -> None:
        message, channels = self.message, self.channels
        if receiver is None:
            message.on_enqueued(DistBackendError(f"recv from group rank {self.peer}: its channel never opened"),
                                self.peer)
            return
        number, chunk, offset, count, _, _, slot = fields[1:]
        try:
            stream, device = message.stream, channels.device
            stream.wait_event(receiver.sent[slot])
            if count:
                source = device.view(receiver.mapping, message.dtype_name, count, slot * channels.slot_bytes)
                device.copy(message.flat[offset:offset + count], source, stream)
            receiver.done[slot].record(stream)
        except Exception as error:  # noqa: BLE001 - the receive fails with it
            message.on_enqueued(error, self.peer)
            return
        assert self.peer is not None
        channels.transport.isend(channels.transport_ranks[self.peer], memoryview(_ACK.pack(b"PDAK", chunk)),
                                 channels.key(ACK_SEQ, 0))
        if offset + count >= message.count:
            message.on_enqueued(None, self.peer)
        else:
            self._expect(channels.key(CHUNK_SEQ, number))
