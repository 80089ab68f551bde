"""The stand-in's lazy streams: work is enqueued, captured or deferred, and run when waited for.

Behaviour
    Each stream keeps its operations in order, numbered by position, with a *clock*: for every
    stream, the last position that happens before it (its own stream's earlier work, and
    through ``wait_event`` the work before the awaited record, transitively), as in a vector
    clock. Nothing runs when enqueued. Work runs when something waits for it: a host
    ``synchronize`` or ``query`` of an event or stream, or a peer process waiting on an
    exported event (its executor thread). Running an operation first runs everything its
    clock says happens before it, on every stream.

    So that a read that misses a wait fails deterministically, an operation's outputs read as
    *poison* (pydist.device.dtypes) from its enqueue until it runs, wherever that is
    possible: an operation is *captured* at enqueue when nothing before it is still
    undetermined (no earlier deferred work, no unmet wait on a peer's event): its inputs are
    read then, with the captured but not yet applied writes that happen before it laid over
    them (writes not ordered before it are not: a racing read sees their poison), its result
    is computed and kept, its outputs are poisoned, and the result lands when it runs. Any
    other operation is *deferred*: it reads and writes when it runs. A peer reading memory
    this process wrote without waiting on its event therefore reads poison, and so does the
    host reading a host array a copy has not filled yet. When work runs and writes, what
    captured writes still pending will overwrite there is poisoned again: they could run any
    moment, so a reader not ordered against them (a slot rewritten without waiting for its
    reader) sees poison, not the older value by luck.

    A wait on a peer's event takes the peer's most recent record at the call
    (``cudaStreamWaitEvent``'s rule; a never-recorded event is complete) and blocks the
    stream's later work until the peer's counters say it ran; the waiter asks the exporter to
    run it (pydist.device.standin.nudges) at each poll.

Cost
    A Python lock and a few list operations per enqueue; a captured operation copies its
    inputs (with an overlay, a copy of the allocation and the pending writes before it laid
    over it). A stream with more than BACKLOG (64) operations waiting runs its oldest, as a
    GPU would have, so that this stays bounded (a missing wait is caught among the last 64
    operations of a stream). For tests, not for speed.

Failure modes
    Work that touches an array freed before it ran raises DeviceError from the wait that ran
    it (and again from each later wait). A wait that cannot finish by its deadline raises
    OpTimeoutError naming what it waits for; on a dead peer's event, PeerFailedError naming
    the peer (pydist.device.events.wait_for).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ...core import deadline as _deadline
from ..errors import DeviceError
from ..event_counters import Counters
from ..events import Blocker
from ..handles import Handle
from . import nudges
from .memory import Allocation, Ref

WORK, RECORD, REMOTE, DELAY = "work", "record", "wait on a peer's event", "delay"
#: Operations a stream keeps waiting before it runs its oldest (what can run without blocking).
BACKLOG = 64


class Epochs:
    """An event's records not yet run, and (interprocess) its shared counters."""

    def __init__(self, counters: Counters | None):
        self.counters = counters
        self.pending: dict[int, Op] = {}
        self.latest = 0  # the epoch of the most recent record
        self.done = 0
        self._ran: set[int] = set()

    def ran(self, epoch: int) -> None:
        """Record ``epoch`` ran: ``done`` moves past every epoch that has run in sequence."""
        self.pending.pop(epoch, None)
        self._ran.add(epoch)
        while self.done + 1 in self._ran:
            self.done += 1
            self._ran.discard(self.done)
        if self.counters is not None:
            self.counters.done = self.done


class Op:
    """One operation on a stream: work (reads, writes, compute), a record, a wait, a delay."""

    def __init__(self, kind: str, label: str, reads: tuple[Ref, ...] = (), writes: tuple[Ref, ...] = (),
                 compute: Callable[..., list[np.ndarray]] | None = None):
        self.kind = kind
        self.label = label
        self.reads = reads
        self.writes = writes
        self.compute = compute
        self.stream: Any = None
        self.pos = -1
        self.clock: dict[Any, int] = {}
        self.captured = False
        self.results: list[tuple[Ref, np.ndarray]] = []
        self.epochs: Epochs | None = None  # RECORD
        self.epoch = 0  # RECORD: its epoch; REMOTE: the peer's epoch waited for
        self.counters: Counters | None = None  # REMOTE
        self.source: Handle | None = None  # REMOTE
        self.seconds = 0.0  # DELAY
        self.until: float | None = None

    def precedes(self, other: Op) -> bool:
        """Whether this operation happens before ``other``."""
        return self.pos <= other.clock.get(self.stream, -1)

    def blocker(self) -> Blocker:
        """What a wait held up by this operation waits for."""
        if self.kind == REMOTE:
            return self.source, f"record {self.epoch} of a peer's event"
        return None, f"{self.label} on a stream of {self.stream.device.where}"


class Scheduler:
    """The process's stand-in streams' state and lock (one per process)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A fresh state (a forked child does not own its parent's streams)."""
        self.lock = threading.RLock()
        self.hosts: dict[int, Allocation] = {}  # host arrays that queued work uses

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue(self, stream: Any, op: Op) -> None:
        """Put ``op`` at the end of ``stream``; capture it when possible (module docstring)."""
        with self.lock:
            op.stream, op.pos = stream, stream.next_pos
            stream.next_pos += 1
            stream.clock[stream] = op.pos
            op.clock = dict(stream.clock)
            for ref in op.reads + op.writes:
                ref.allocation.users += 1
            if op.kind == WORK and self._capturable(op):
                self._capture(op)
            elif op.kind in (WORK, REMOTE):
                stream.undetermined.append(op.pos)
            stream.pending.append(op)
            if len(stream.pending) > BACKLOG:  # a GPU would have run the oldest by now
                self.advance(stream, stream.pending[-BACKLOG].pos)

    @staticmethod
    def _capturable(op: Op) -> bool:
        """Whether no deferred work or unmet peer wait happens before ``op``."""
        return not any(stream.undetermined and stream.undetermined[0] <= upto for stream, upto in op.clock.items())

    def _capture(self, op: Op) -> None:
        assert op.compute is not None
        inputs = [self._read(ref, op) for ref in op.reads]
        op.results = list(zip(op.writes, op.compute(*inputs)))
        for ref in op.writes:
            ref.poison()
            ref.allocation.pending_writes.append(op)
        op.captured = True

    @staticmethod
    def _read(ref: Ref, op: Op) -> np.ndarray:
        """``ref``'s values as ``op`` sees them: memory, with the captured writes that happen
        before ``op`` laid over it."""
        allocation = ref.allocation
        earlier = [w for w in allocation.pending_writes if w.precedes(op)]
        if not earlier or not allocation.overlay:
            return ref.bits.copy()
        assert allocation.bits is not None
        scratch = allocation.bits.copy()
        for write in earlier:
            for target, values in write.results:
                if target.allocation is allocation:
                    target.placed(scratch)[...] = values
        return ref.placed(scratch).copy()

    # -- run --------------------------------------------------------------------------------

    def advance(self, stream: Any, upto: int) -> Blocker | None:
        """Run ``stream``'s operations up to position ``upto`` (and what they need), without
        blocking: None when done, else what holds it up. Lock held by the caller."""
        while stream.pending and stream.pending[0].pos <= upto:
            op = stream.pending[0]
            for other, position in op.clock.items():
                if other is not stream:
                    blocked = self.advance(other, position)
                    if blocked is not None:
                        return blocked
            if not self._run(op):
                return op.blocker()
            stream.pending.popleft()
            self._finished(op)
        return None

    def _run(self, op: Op) -> bool:
        if op.kind == WORK:
            for ref in op.reads + op.writes:
                if ref.allocation.freed and op.pos > ref.allocation.freed_clock.get(op.stream, -1):
                    raise DeviceError(op.label, op.stream.device.where, (
                        f"{ref.allocation!r} was dropped before this work ran, on a stream neither ordered "
                        "before its own stream's work at the drop nor kept with keep_alive (torch: "
                        "Tensor.record_stream): its memory may already hold another tensor"))
            if op.captured:
                for ref, values in op.results:
                    ref.bits[...] = values
                    ref.allocation.pending_writes.remove(op)
            else:
                assert op.compute is not None
                outputs = op.compute(*[ref.bits.copy() for ref in op.reads])
                for ref, values in zip(op.writes, outputs):
                    ref.bits[...] = values
            self._repoison(op)
        elif op.kind == RECORD:
            assert op.epochs is not None
            op.epochs.ran(op.epoch)
        elif op.kind == REMOTE:
            assert op.counters is not None and op.source is not None
            if op.counters.done < op.epoch:
                nudges.send(op.source.pid, op.counters.name, op.epoch)
                return False
        elif op.kind == DELAY:
            if op.until is None:
                op.until = _deadline.now() + op.seconds
            return _deadline.now() >= op.until
        return True

    @staticmethod
    def _repoison(op: Op) -> None:
        """Poison again what captured writes still pending will write where ``op`` just wrote:
        they may run any moment now, so a reader not ordered against them must not see
        ``op``'s values by luck (a correct reader is ordered, and then they are deferred)."""
        for allocation in {id(ref.allocation): ref.allocation for ref in op.writes}.values():
            for pending in allocation.pending_writes:
                for ref in pending.writes:
                    if ref.allocation is allocation:
                        ref.poison()

    def _finished(self, op: Op) -> None:
        op.stream.done_pos = op.pos
        if op.stream.undetermined and op.stream.undetermined[0] == op.pos:
            op.stream.undetermined.popleft()
        op.results = []
        for ref in op.reads + op.writes:
            allocation = ref.allocation
            allocation.users -= 1
            if allocation.root is not None and allocation.users == 0:
                self.hosts.pop(id(allocation.root), None)

    def serve(self, epochs: Epochs, epoch: int) -> None:
        """Run this process's work up to every pending record of ``epochs`` up to ``epoch``
        (a peer waits for it), as far as it can without blocking."""
        with self.lock:
            for number in sorted(epochs.pending):
                if number > epoch:
                    break
                record = epochs.pending[number]
                if self.advance(record.stream, record.pos) is not None:
                    break

    def locked(self, step: Callable[[], Blocker | None]) -> Callable[[], Blocker | None]:
        """``step`` run under the lock (for pydist.device.events.wait_for)."""
        def run() -> Blocker | None:
            with self.lock:
                return step()
        return run

    # -- arrays dropped -----------------------------------------------------------------------

    def dropped(self, allocation: Allocation) -> None:
        """One array over ``allocation`` is gone. With the last array of an ``empty`` one, its
        memory goes back to the allocator, as torch's caching allocator reuses a block: for
        later work of the stream it was made on (and, with keep_alive, of the streams named
        there), after the work already enqueued there. Work on any other stream not ordered
        before that point may run on reused memory: it raises DeviceError when it runs."""
        with self.lock:
            allocation.arrays -= 1
            if not allocation.private or allocation.arrays or allocation.freed:
                return
            allocation.freed = True
            clock = dict(allocation.stream.clock) if allocation.stream is not None else {}
            for stream in allocation.kept:
                clock[stream] = max(clock.get(stream, -1), stream.next_pos - 1)
            allocation.freed_clock = clock


SCHEDULER = Scheduler()
os.register_at_fork(after_in_child=SCHEDULER.reset)
