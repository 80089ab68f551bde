"""send and recv of device tensors between ranks on different hosts, staged through pinned memory.

Behaviour
    The cross-host half of a group's device point-to-point; the same-host half is
    pydist.algorithms.device_p2p's channels, whose receives take both kinds. A send to a rank
    on another host posts a header under the user's tag in the receive's key (device_p2p's
    READY key, magic STAGED: the message's number, the sender's elements per chunk, count,
    dtype), so a receive from that rank, or from any, matches it by tag and in order as any
    message; then its chunks, staged by pydist.algorithms.device_staging (chunk k+1 coming
    down while chunk k crosses and chunk k-1 goes up), each a host message keyed by the
    message's number under STAGED_SEQ. The receive that takes the header stages the chunks
    up into its tensor (device_p2p hands it to ``receive``).

    Each message runs on the thread of its pair and direction (``pydist-device-staged``,
    started when a message is queued, ending when none is left), on that lane's two staging
    streams: messages to one rank go in post order, those from one rank in the order their
    headers came, and a send never waits for a receive of this rank nor for another pair.
    A receive's chunks start only once its header came, that is once the sender is staging
    them, and a send completes whatever the receiver does (the transport holds what was not
    asked for yet), so the group's one pool of pinned buffers (PYDIST_CUDA_PINNED_BYTES,
    made at the first message), shared by its lanes, cannot deadlock them.

    A message's ``on_enqueued(error, source)`` is called once its chunks are all staged (a
    send: handed to the transport; a receive: in its tensor, and the message's stream waits
    for the copies up) or it failed.

Cost
    Per message: a 48-byte header, then per chunk one host message and, on each side, one
    copy and one event; each byte crosses PCIe once on each side and the network once, the
    three overlapping. A thread per pair and direction while it has messages.

Failure modes
    A peer that dies: the message's PeerFailedError naming it, at once; one that does not
    come by the message's deadline (the group's timeout from its post): OpTimeoutError naming
    it. A sender whose chunks differ in size from the receiver's (PYDIST_CUDA_CHUNK_BYTES):
    DistBackendError naming both sizes. The staging's own failures: device_staging's.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.deadline import Deadline
from ..core.errors import DistBackendError, OpTimeoutError, timed_out_waiting
from ..device.dtypes import dtype
from ..device.events import Stream
from ..device.interface import Device
from ..device.pinned_pool import PinnedPool
from ..transport.base import MessageKey, Request
from . import device_staged_movement as moved
from .comm import as_bytes, with_context
from .device_p2p import READY_SEQ, STAGED_SEQ, Message, staged_header
from .device_staging import Staging, pinned_pool

#: The most seconds ``close`` waits for a lane still moving a message.
CLOSE_SECONDS = 10.0
_log = logging.getLogger("pydist")
Job = Callable[[Staging], int | None]  # runs one message; returns the source to report (receives)


class StagedP2P:
    """A group's staged sends and receives on this rank (module docstring); ranks are group
    ranks, ``transport_ranks`` maps them to the transport's."""

    def __init__(self, transport: Any, group_id: int, transport_ranks: list[int], rank: int, device: Device,
                 chunk_bytes: int, pinned_bytes: int):
        self.transport = transport
        self.group_id = group_id
        self.transport_ranks = transport_ranks
        self.rank = rank
        self.device = device
        self.chunk_bytes, self.pinned_bytes = chunk_bytes, pinned_bytes
        self.lock = threading.Lock()
        self.pool: PinnedPool[np.ndarray] | None = None
        self.lanes: dict[tuple[str, int], Lane] = {}
        self.numbers: dict[int, int] = {}  # by destination: the next message's number

    def send(self, message: Message, peer: int) -> None:
        """Queue ``message`` for group rank ``peer`` (on another host)."""
        with self.lock:
            number = self.numbers.get(peer, 0)
            self.numbers[peer] = number + 1
        self._lane("send", peer).put(message, lambda staging: self._send(staging, message, peer, number))

    def receive(self, message: Message, source: int, number: int, unit: int) -> None:
        """A receive took the header of ``source``'s message ``number`` (``unit``: its
        elements per chunk): queue its chunks (device_p2p.OnStaged)."""
        self._lane("recv", source).put(message, lambda staging: self._receive(staging, message, source, number,
                                                                             unit))

    def _lane(self, direction: str, peer: int) -> Lane:
        with self.lock:
            if self.pool is None:
                self.pool = pinned_pool(self.device, self.chunk_bytes, self.pinned_bytes)
            lane = self.lanes.get((direction, peer))
            if lane is None:
                lane = self.lanes[direction, peer] = Lane(self.device, self.pool)
            return lane

    def _send(self, staging: Staging, message: Message, peer: int, number: int) -> None:
        unit = staging.unit(1, dtype(message.dtype_name))
        chunks = _Chunks(self, message, peer, number)
        chunks.wait(self.transport.isend(self.transport_ranks[peer], memoryview(staged_header(number, unit, message)),
                                         MessageKey(self.group_id, READY_SEQ, message.tag)), peer)
        moved.send(staging, chunks, message.flat, peer)

    def _receive(self, staging: Staging, message: Message, source: int, number: int, unit: int) -> int:
        mine = staging.unit(1, dtype(message.dtype_name))
        if unit != mine:
            raise DistBackendError(
                f"{message.what}: group rank {source} stages {unit} elements of {message.dtype_name} per chunk, this "
                f"rank {mine} (PYDIST_CUDA_CHUNK_BYTES differs between them: set it alike on every rank)")
        moved.recv(staging, _Chunks(self, message, source, number), message.flat, source)
        return source

    def close(self) -> None:
        """Wait (bounded) for the lanes still moving messages, then free the pool (its buffers
        still out as they come back)."""
        with self.lock:
            lanes, pool = list(self.lanes.values()), self.pool
        deadline = Deadline.after(CLOSE_SECONDS)
        for lane in lanes:
            if not lane.idle.wait(deadline.remaining()):
                _log.warning("pydist: a staged device send or recv was still running at the group's destroy")
        if pool is not None:
            pool.close()


class Lane:
    """One pair and direction: its messages in order, on its thread and two staging streams."""

    def __init__(self, device: Device, pool: PinnedPool[np.ndarray]):
        self.device, self.pool = device, pool
        self.streams: tuple[Stream, Stream] = (device.new_stream(), device.new_stream())
        self.jobs: deque[tuple[Message, Job]] = deque()
        self.lock = threading.Lock()
        self.idle = threading.Event()
        self.idle.set()
        self.running = False

    def put(self, message: Message, job: Job) -> None:
        """Run ``job`` after the lane's earlier messages, then report to ``message``."""
        with self.lock:
            self.jobs.append((message, job))
            self.idle.clear()
            if self.running:
                return
            self.running = True
        threading.Thread(target=self._run, name="pydist-device-staged", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.jobs:
                    self.running = False
                    self.idle.set()
                    return
                message, job = self.jobs.popleft()
            deadline = message.deadline or Deadline.after(None)
            try:
                source = job(Staging(self.device, message.stream, *self.streams, self.pool, deadline))
            except BaseException as error:  # noqa: BLE001 - the message's failure
                message.on_enqueued(error, None)
            else:
                message.on_enqueued(None, source)


class _Chunks:
    """The host step of one staged message (device_staged_movement's send and recv): its
    chunks as host messages to or from the peer, keyed by the message's number."""

    def __init__(self, p2p: StagedP2P, message: Message, peer: int, number: int):
        self.p2p, self.message, self.peer = p2p, message, peer
        self.key = MessageKey(p2p.group_id, STAGED_SEQ, number)

    def send(self, array: np.ndarray, peer: int) -> None:
        self.wait(self.p2p.transport.isend(self.p2p.transport_ranks[peer], as_bytes(array), self.key), peer)

    def recv(self, array: np.ndarray, peer: int) -> None:
        request = self.p2p.transport.irecv(self.p2p.transport_ranks[peer], as_bytes(array), self.key)
        try:
            self.wait(request, peer)
        except BaseException:
            if not request.done():
                self.p2p.transport.cancel(request)
            raise

    def wait(self, request: Request, peer: int) -> None:
        """Wait for ``request`` within the message's deadline; raise naming ``peer`` if it fails."""
        p2p, message = self.p2p, self.message
        deadline = message.deadline or Deadline.after(None)
        world = p2p.transport_ranks[peer]
        if not deadline.wait(request.wait):
            raise OpTimeoutError(f"{message.what} on rank {p2p.transport_ranks[p2p.rank]}: "
                                 f"{timed_out_waiting(None)} for rank {world} ({p2p.transport.peer_host(world)}); "
                                 "that rank has not reached it or is stuck")
        if request.error is not None:
            raise with_context(request.error, message.what)

