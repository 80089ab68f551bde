"""Shared-memory channels between the ranks of one host: one ring per ordered pair.

A host segment (created by the host's lowest rank, unlinked once every local rank mapped
it) holds, per local rank, a Signal (doorbell + sleepers) and, per ordered pair, a
single-producer single-consumer byte ring carrying the same frames as tcp. A send writes
what fits at once from the caller's thread and rings the receiver's doorbell; the rest is
pushed by the sender's progress thread as the receiver frees space (it rings the sender
when the sender said it waits for space). Each process has one progress thread: it drains
its incoming rings into posted receives (or holds messages as unexpected, see ..matching)
and pushes pending sends; when idle it sleeps on its doorbell futex. A thread blocked on a
receive does that work itself for a while (``drive``), and peers then leave the progress
thread asleep: handing each message to another thread of the process costs a GIL
hand-off. Frame decoding is the sans-IO FrameReceiver shared with tcp. A peer's death is
learnt from the network transport (``peer_gone``): what it wrote before is delivered first,
then its receives fail and ``on_peer_gone`` reports it. A peer whose ring holds what this
rank cannot take (a malformed frame, a length beyond its bound: see receiver) is refused:
its ring is read no more, and it is reported as gone, with the cause. A progress thread that
raises fails every waiter with the cause (logged once) instead of dying silently.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ...core import deadline as _deadline
from ...core.deadline import Deadline
from ...core.errors import DistBackendError, PeerFailedError
from ..base import HostLocalTransport, MessageKey, Request
from ..framing import HEADER_SIZE, FramingError, Kind, encode_header, pack_header_into
from ..matching import Matcher
from ..receiver import FrameReceiver
from . import atomics
from .segment import Keepalive
from .signal import Signal

log = logging.getLogger("pydist.transport")

LINE = 64
#: Messages up to this size are written whole by the sending thread when the ring has room.
INLINE_BYTES = 64 << 10
#: close(): how long pending sends may take to drain into the rings
CLOSE_SECONDS = 10.0
#: The progress thread's idle sleep: whatever gives it work rings its doorbell (a peer's
#: write, its own frames left pending, a peer leaving, close), so this only backs that up.
#: Each wake takes the GIL, and a thread waiting for the GIL wakes at each of the caller's
#: releases of it (torch's bindings release it at most tensor methods): 50 ms naps made
#: such waits 20 a second, each waking the thread up to thousands of times on the core
#: another rank runs on (issue 49).
IDLE_NAP_SECONDS = 1.0


def ring_bytes_for(local_ranks: int, requested: int) -> int:
    """Ring capacity: the request (PYDIST_SHM_RING_BYTES), shrunk so all rings of a host stay under 256 MiB."""
    pairs = max(local_ranks * (local_ranks - 1), 1)
    size = min(requested, (256 << 20) // pairs)
    return max(64 << 10, size // 4096 * 4096)


def host_segment_bytes(local_ranks: int, ring_bytes: int) -> int:
    """The host segment: the header, then one ring per ordered pair of distinct ranks (all
    of it is reserved at creation, see segment)."""
    return _rings_offset(local_ranks) + local_ranks * (local_ranks - 1) * ring_bytes


def _rings_offset(local_ranks: int) -> int:
    header = LINE * (1 + local_ranks + 2 * local_ranks * local_ranks)
    return (header + 4095) // 4096 * 4096


class _Ring:
    """One ordered pair's ring: positions are byte counts since the start (never wrap)."""

    def __init__(self, memory: np.ndarray, base: int, local_ranks: int, source: int, target: int, capacity: int):
        index = source * local_ranks + target
        self.tail_word = (LINE * (1 + local_ranks + 2 * index)) // 8
        self.head_word = self.tail_word + LINE // 8
        self.want_word = self.head_word + 1
        self.base = base
        pair = source * (local_ranks - 1) + target - (target > source)  # no ring from a rank to itself
        start = _rings_offset(local_ranks) + pair * capacity
        self.data = memory[start:start + capacity].data  # a memoryview (the stubs lack ndarray.__buffer__ on 3.11)
        self.capacity = capacity


class _Writer:
    """The sending end of a ring: frames not yet written, in order."""

    def __init__(self, ring: _Ring):
        self.ring = ring
        self.lock = threading.Lock()
        self.pending: deque[tuple[list[memoryview], Request | None]] = deque()
        self.error: BaseException | None = None


class ShmTransport(HostLocalTransport):
    """Shared-memory channels of one rank to the other ranks of its host."""

    def __init__(self, rank: int, local_ranks: list[int], memory: np.ndarray, base: int, ring_bytes: int,
                 matcher: Matcher, oversubscribed: bool, on_peer_gone: Callable[[int, BaseException], None],
                 keepalive: Keepalive | None = None):
        """``local_ranks``: the ranks of this host, this one included; ``on_peer_gone``: told
        once a departed peer's messages are delivered (see peer_gone)."""
        self.rank = rank
        self.local = local_ranks
        self.matcher = matcher
        self._on_peer_gone = on_peer_gone
        self._keepalive = keepalive
        self._leaving: dict[int, BaseException] = {}  # departed peers whose last messages are being delivered
        self._refused: set[int] = set()  # peers that wrote what this rank cannot take: their rings are not read
        count, me = len(local_ranks), local_ranks.index(rank)
        self._words = memory.data.cast("Q")
        self._base = base
        self._signals = [Signal(memory.data, base, LINE * (1 + i), oversubscribed) for i in range(count)]
        self._index = {peer: i for i, peer in enumerate(local_ranks)}
        self._writers = {peer: _Writer(_Ring(memory, base, count, me, i, ring_bytes))
                         for peer, i in self._index.items() if peer != rank}
        self._readers = {peer: (_Ring(memory, base, count, i, me, ring_bytes),
                                FrameReceiver(peer, matcher, lambda header, payload: None))
                         for peer, i in self._index.items() if peer != rank}
        self._me = me
        self._drain_lock = threading.Lock()
        self.spin_seconds = 0.00002 if oversubscribed else 0.0002
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"pydist-shm-progress-{rank}", daemon=True)
        self._thread.start()

    # -- positions ------------------------------------------------------------------------
    def _load(self, word: int) -> int:
        if atomics.PLAIN_ORDERING:
            return self._words[word]
        return atomics.load_u64_acquire(self._base + 8 * word)

    def _store(self, ring: _Ring, word: int, value: int) -> None:
        """Store ``value``, then a full barrier (later loads see it ordered)."""
        atomics.store_seq_cst(self._words, ring.base, word, value)

    # -- sending --------------------------------------------------------------------------
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        writer = self._writers[peer]
        if data.nbytes <= INLINE_BYTES and self._write_whole(peer, writer, data, key, call):
            return Request.finished(peer, data)
        request = Request(peer, data)
        header = memoryview(encode_header(Kind.DATA, key.group, key.seq, key.tag, data.nbytes, call))
        self._send(peer, [header, data], request)
        return request

    def _write_whole(self, peer: int, writer: _Writer, data: memoryview, key: MessageKey, call: int) -> bool:
        """The small-message path: when nothing is queued before it and the frame fits the
        ring's free space without wrapping, write header and payload in place; True if done."""
        ring, size = writer.ring, HEADER_SIZE + data.nbytes
        with writer.lock:
            if writer.pending or writer.error is not None:
                return False
            tail = self._words[ring.tail_word]
            offset = tail % ring.capacity
            if offset + size > ring.capacity or ring.capacity - (tail - self._load(ring.head_word)) < size:
                return False
            pack_header_into(ring.data, offset, Kind.DATA, key.group, key.seq, key.tag, data.nbytes, call)
            ring.data[offset + HEADER_SIZE:offset + size] = data
            self._publish_tail(peer, ring, tail + size)
        return True

    def _send(self, peer: int, parts: list[memoryview], request: Request | None) -> None:
        writer = self._writers[peer]
        with writer.lock:
            if writer.error is not None:
                if request is not None:
                    request.complete(writer.error)
                return
            writer.pending.append((parts, request))
            if len(writer.pending) == 1:
                self._push(peer, writer)
        if writer.pending:
            self._signals[self._me].ring()  # our progress thread finishes it

    def _push(self, peer: int, writer: _Writer) -> bool:
        """Write pending frames while there is space (writer.lock held); True if any byte moved."""
        ring, moved = writer.ring, False
        tail = self._words[ring.tail_word]
        while writer.pending:
            parts, request = writer.pending[0]
            head = self._load(ring.head_word)
            space = ring.capacity - (tail - head)
            if space == 0:
                self._store(ring, ring.want_word, 1)
                if ring.capacity - (tail - self._load(ring.head_word)) == 0:
                    break
                continue
            while parts and space:
                part = parts[0]
                take = min(part.nbytes, space)
                tail = self._copy_in(ring, tail, part[:take])
                space -= take
                moved = True
                if take == part.nbytes:
                    parts.pop(0)
                else:
                    parts[0] = part[take:]
            if parts:
                continue
            writer.pending.popleft()
            if request is not None:
                request.complete()
        if moved:
            self._publish_tail(peer, ring, tail)
        if not writer.pending:
            self._words[ring.want_word] = 0
        return moved

    @staticmethod
    def _copy_in(ring: _Ring, tail: int, data: memoryview) -> int:
        offset = tail % ring.capacity
        first = min(data.nbytes, ring.capacity - offset)
        ring.data[offset:offset + first] = data[:first]
        if first < data.nbytes:
            ring.data[:data.nbytes - first] = data[first:]
        return tail + data.nbytes

    def _publish_tail(self, peer: int, ring: _Ring, tail: int) -> None:
        if atomics.PLAIN_ORDERING:
            self._words[ring.tail_word] = tail
        else:
            atomics.store_u64_release(ring.base + 8 * ring.tail_word, tail)
        self._signals[self._index[peer]].ring()

    # -- receiving ------------------------------------------------------------------------
    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """Post a receive; its waiter drains the rings itself first (``drive``)."""
        request = Request(peer, data, call)
        request.drive = self.drive
        self.matcher.post(request, peer, key)
        return request

    def cancel(self, request: Request) -> None:
        self.matcher.cancel(request, DistBackendError("receive cancelled"))

    def _drain(self, peer: int) -> bool:
        """Consume what ``peer`` wrote to us; True if anything was read."""
        ring, receiver = self._readers[peer]
        head, tail = self._words[ring.head_word], self._load(ring.tail_word)
        if head == tail or peer in self._refused:
            return False
        offset, available = head % ring.capacity, tail - head
        first = min(available, ring.capacity - offset)
        try:
            receiver.feed(ring.data[offset:offset + first])
            if first < available:
                receiver.feed(ring.data[:available - first])
        except (FramingError, MemoryError) as error:
            self._refuse(peer, error)
            return True
        self._store(ring, ring.head_word, tail)
        if self._words[ring.want_word]:
            self._signals[self._index[peer]].ring()
        return True

    def _refuse(self, peer: int, error: FramingError | MemoryError) -> None:
        """``peer`` wrote a frame this rank cannot take: read its ring no more, and report it
        gone (after this drain, as a departed peer) with the cause."""
        reason = (f"rank {peer} sent rank {self.rank} a malformed frame through shared memory "
                  f"({type(error).__name__}: {error}); rank {self.rank} reads nothing more from it")
        log.warning("pydist rank %d: %s", self.rank, reason)
        failure = PeerFailedError(reason, rank=peer)
        failure.__cause__ = error
        self._refused.add(peer)
        self._leaving[peer] = failure

    # -- progress thread ------------------------------------------------------------------
    def poll(self) -> bool:
        """Drain incoming rings now (from any thread; one at a time); True if anything came."""
        if not self._drain_lock.acquire(blocking=False):
            return False
        try:
            busy = False
            for peer in self._readers:
                busy |= self._drain(peer)
            # after the drain: what a peer wrote before leaving counts
            for peer in list(self._leaving) if self._leaving else ():
                error = self._leaving.pop(peer)
                self.fail_peer(peer, error)
                self._readers[peer][1].abandon(error)  # a message it left half-written
                self._on_peer_gone(peer, error)
            return busy
        finally:
            self._drain_lock.release()

    def drive(self, request: Request, timeout: float | None) -> bool:
        """Wait for ``request``: drain and push from this thread for up to ``spin_seconds``
        (announced as polling, so peers do not wake the progress thread), then sleep while
        the progress thread does. True once complete, False when ``timeout`` passed."""
        signal, start = self._signals[self._me], time.perf_counter()  # real time: it bounds a CPU spin
        spin = self.spin_seconds if timeout is None else min(self.spin_seconds, timeout)
        signal.polling(1)
        try:
            while not request.done() and time.perf_counter() - start < spin:
                self._poll()
        finally:
            if signal.polling(-1) == 0 and self._has_work():  # what arrived since the last drain
                signal.ring()
        if request.done():
            return True
        return request.sleep(None if timeout is None else max(timeout - (time.perf_counter() - start), 0.0))

    def _poll(self) -> bool:
        busy = self.poll()
        for peer, writer in self._writers.items():
            if writer.pending and writer.lock.acquire(blocking=False):
                try:
                    busy |= self._push(peer, writer)
                finally:
                    writer.lock.release()
        return busy

    def _run(self) -> None:
        try:
            self._progress()
        except BaseException as error:  # noqa: BLE001 - never die silently: fail every waiter with it
            self._died(error)

    def _died(self, cause: BaseException) -> None:
        """The progress thread raised ``cause``: logged once; sends to every local peer and
        every posted receive fail, and the local peers are reported gone, with the cause."""
        log.error("pydist rank %d: the shared-memory progress thread died; every operation of this rank fails",
                  self.rank, exc_info=cause)
        error = DistBackendError(f"rank {self.rank}'s shared-memory progress thread died ({type(cause).__name__}: "
                                 f"{cause}): this rank can no longer exchange messages with the ranks of its host")
        error.__cause__ = cause
        for peer in self._writers:
            self._refused.add(peer)
            self.fail_peer(peer, error)
            self._on_peer_gone(peer, error)
        self.matcher.fail_all(error)

    def _progress(self) -> None:
        """The progress thread's loop: drain and push, else sleep on the doorbell."""
        signal = self._signals[self._me]
        while not self._stopping:
            if self._poll():
                continue
            signal.sleep(lambda: self._stopping or self._has_work(), IDLE_NAP_SECONDS)  # no deadline

    def _has_work(self) -> bool:
        if self._leaving:
            return True
        for peer, (ring, _) in self._readers.items():
            if self._words[ring.head_word] != self._load(ring.tail_word) and peer not in self._refused:
                return True
        return any(w.pending and w.ring.capacity > self._words[w.ring.tail_word] - self._load(w.ring.head_word)
                   for w in self._writers.values())

    def peer_gone(self, peer: int, error: BaseException) -> None:
        """``peer`` left (its tcp connection closed): deliver what it already wrote to us,
        then fail our sends to it and report it (done by the progress thread)."""
        signals = self._signals
        if signals is None:  # closed: nothing left to deliver, nobody waits
            return
        self._leaving[peer] = error
        signals[self._me].ring()

    def fail_peer(self, peer: int, error: BaseException) -> None:
        """``peer`` died: fail sends still waiting for ring space."""
        writer = self._writers.get(peer)
        if writer is None:
            return
        with writer.lock:
            writer.error = error
            pending, writer.pending = list(writer.pending), deque()
        for _, request in pending:
            if request is not None:
                request.complete(error)

    def idle(self) -> bool:
        return all(not w.pending or w.error is not None for w in self._writers.values())

    def close(self, deadline: Deadline | None = None) -> None:
        """Let pending sends drain (until ``deadline``, default CLOSE_SECONDS from now), then
        stop the progress thread (once)."""
        if self._stopping:
            return
        deadline = deadline or Deadline.after(CLOSE_SECONDS)
        while not self.idle() and not deadline.expired():
            self._signals[self._me].wake()
            _deadline.sleep(0.001)
        self._stopping = True
        self._signals[self._me].wake()
        self._thread.join(timeout=5)  # real time: a bound on a thread told to stop, not a timeout
        gone = PeerFailedError(f"rank {self.rank} closed its shared-memory channels", rank=self.rank)
        for peer in self._writers:
            self.fail_peer(peer, gone)
        if not self._thread.is_alive():  # drop the views into the segment, so that it unmaps now
            # closed: dropped so that the segment unmaps, never read again
            self._words = self._signals = None  # type: ignore[assignment]
            self._readers, self._writers = {}, {}
        if self._keepalive is not None:
            self._keepalive.unlink()  # in case a local rank never attached
            self._keepalive.close()
