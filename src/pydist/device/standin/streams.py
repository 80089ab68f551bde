"""The stand-in's streams and events over the lazy scheduler (pydist.device.standin.scheduler).

``StandinStream.wait_event`` on this process's event joins the record's clock (no operation
is enqueued); on a peer's event it enqueues a wait for the peer's most recent record at the
call, or nothing when that has run already. ``StandinEvent.record`` enqueues a record; an
interprocess event's counters (pydist.device.event_counters) say the epoch at the call and,
once it ran, as done. ``query`` and ``synchronize`` run the work they wait for.
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from ...core.deadline import Deadline
from ..event_counters import Counters, PeerEvent
from ..events import Event, Stream, wait_for
from . import nudges
from .executor import EXECUTOR
from .scheduler import RECORD, REMOTE, SCHEDULER, Epochs, Op


class StandinStream(Stream):
    """A lazy stream of the stand-in device."""

    def __init__(self, device: Any):
        super().__init__(device)
        self.pending: deque[Op] = deque()
        self.undetermined: deque[int] = deque()  # positions of deferred work, unmet peer waits
        self.next_pos = 0
        self.done_pos = -1
        self.clock: dict[Any, int] = {}

    def _wait_event(self, event: Event) -> None:
        if isinstance(event, ImportedEvent):
            with SCHEDULER.lock:
                target = event.counters.recorded
                if event.counters.done < target:
                    op = Op(REMOTE, "wait on a peer's event")
                    op.counters, op.source, op.epoch = event.counters, event.source, target
                    SCHEDULER.enqueue(self, op)
        elif isinstance(event, StandinEvent):
            with SCHEDULER.lock:
                record = event.last_record
                if record is not None:
                    for stream, position in record.clock.items():
                        if self.clock.get(stream, -1) < position:
                            self.clock[stream] = position
        else:
            raise TypeError(f"wait_event: expected an event of the stand-in device, got {type(event).__name__}")

    def query(self) -> bool:
        """Whether the work enqueued so far has run (running what can run now)."""
        with SCHEDULER.lock:
            return SCHEDULER.advance(self, self.next_pos - 1) is None

    def synchronize(self, deadline: Deadline, what: str = "stream work") -> None:
        upto = self.next_pos - 1
        wait_for(SCHEDULER.locked(lambda: SCHEDULER.advance(self, upto)), deadline, self.device.where, what)

    def __repr__(self) -> str:
        return f"StandinStream({self.device.where}, {len(self.pending)} pending)"


class StandinEvent(Event):
    """An event of this process (``interprocess``: with counters peers read)."""

    def __init__(self, device: Any, interprocess: bool):
        super().__init__(device, interprocess)
        self.last_record: Op | None = None
        self.epochs = Epochs(Counters.create() if interprocess else None)
        if interprocess:
            EXECUTOR.export(self.epochs)
            weakref.finalize(self, EXECUTOR.withdraw, self.epochs)

    def _record(self, stream: Stream) -> None:
        with SCHEDULER.lock:
            op = Op(RECORD, "record")
            self.epochs.latest += 1
            op.epochs, op.epoch = self.epochs, self.epochs.latest
            self.epochs.pending[op.epoch] = op
            SCHEDULER.enqueue(stream, op)
            self.last_record = op
            if self.epochs.counters is not None:
                self.epochs.counters.recorded = op.epoch

    def query(self) -> bool:
        with SCHEDULER.lock:
            op = self.last_record
            return op is None or SCHEDULER.advance(op.stream, op.pos) is None

    def ran(self) -> bool:
        with SCHEDULER.lock:
            op = self.last_record
            return op is None or op.stream.done_pos >= op.pos

    def synchronize(self, deadline: Deadline, what: str = "an event") -> None:
        op = self.last_record
        if op is not None:
            wait_for(SCHEDULER.locked(lambda: SCHEDULER.advance(op.stream, op.pos)), deadline, self.device.where, what)

    def _payload(self) -> bytes:
        assert self.epochs.counters is not None
        return self.epochs.counters.name.encode()


class ImportedEvent(PeerEvent):
    """A peer's event, opened here: waited on, never recorded; a query asks the peer to run
    the work before its most recent record."""

    def query(self) -> bool:
        recorded = self.counters.recorded
        if self.counters.done >= recorded:
            return True
        assert self.source is not None
        nudges.send(self.source.pid, self.counters.name, recorded)
        return False
