"""Flight recorder: the last N operations of every process group, kept per rank.

Always on. ``ProcessGroup`` calls four hooks per collective: ``queued`` (in ``run``, before
the operation is queued or run inline), ``started`` (it has its sequence number and begins),
``completed`` and ``failed``. Each operation is one ``Entry`` stored in the group's ring
buffer of ``PYDIST_TRACE_BUFFER`` entries (default 2000; 0 turns the recorder off): the
call's OpSpec (op name, dtype, count, root, reduce op: ``pydist.core.opspec``, as the public
function described it), state, the algorithm the engine ran, error text, and monotonic
times. Entries are reused once the ring has come round, so recording allocates nothing that
outlives the operation; an entry holds no reference to a tensor. With ``PYDIST_DEBUG=detail``
(or torch's DETAIL debug level, which ``pydist.set_debug_level`` passes on: ``set_call_sites``)
the entry also gets the caller's file and line (a frame walk, so only then).

A DistError raised by an operation (timeout, dead peer, aborted group, desync) makes the
rank write its traces to ``PYDIST_TRACE_DIR`` (see ``_registry``); so does destroying its
last group, and ``pydist.debug.dump_traces()`` on demand.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Protocol

from ..core.errors import DistError
from ..core.opspec import OpSpec
from ..core.settings import settings
from . import _registry
from ._format import COMPLETED, FAILED, QUEUED, STARTED

_monotonic = time.monotonic  # real time: the files' timestamps (wall() converts them), not deadlines
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DISTRIBUTED = os.path.join("torch", "distributed", "")


class Entry:
    """One operation of one group: what it was (``spec``), how far it got, when (monotonic
    seconds). A group's entries are reused once their operation has ended and the ring has
    come round, so that recording allocates nothing that lives on (long-lived
    garbage-collected objects would make Python's full collections more frequent)."""

    __slots__ = ("seq", "spec", "async_op", "state", "queued", "started", "finished", "error", "algorithm",
                 "call_site")
    seq: int
    spec: OpSpec
    async_op: bool
    state: int
    queued: float
    started: float
    finished: float
    error: str | None
    algorithm: str | None
    call_site: str | None

    def __init__(self) -> None:
        self.seq, self.state, self.started, self.finished = 0, QUEUED, 0.0, 0.0
        self.error = self.algorithm = self.call_site = None


def call_site() -> str:
    """The first frame outside pydist (and torch.distributed, for the plugin) that led here:
    ``file:line in function``."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                        or _TORCH_DISTRIBUTED in frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


# -- one group's recorder ----------------------------------------------------------------

class GroupTrace:
    """The ring buffer of one ProcessGroup and its four hooks."""

    def __init__(self, group: Any, session: _registry.RankTraces, capacity: int, detail: bool):
        self.name = group.group_name
        self.desc = group.group_desc
        self.group_id = group.group_id
        self.ranks = group.ranks
        self.group_rank = group.rank()
        self.session = session
        self.capacity = capacity
        self.ring: list[Entry | None] = [None] * capacity
        self.recorded = 0  # operations ever recorded; the ring keeps the last ``capacity``
        self.running: Entry | None = None  # the group's operation in progress (one at a time)
        self.detail = detail
        self.tid = session.next_tid()
        self.timeline = session.timeline
        self.destroyed = False

    def queued(self, spec: OpSpec, async_op: bool) -> Entry:
        return self._record(spec, async_op, QUEUED, _monotonic())

    def begin(self, spec: OpSpec, seq: int) -> Entry:
        """``queued`` and ``started`` at one time: a blocking call that runs at once."""
        now = _monotonic()
        entry = self._record(spec, False, STARTED, now)
        entry.seq, entry.started = seq, now
        self.running = entry
        return entry

    def _record(self, spec: OpSpec, async_op: bool, state: int, now: float) -> Entry:
        index = self.recorded % self.capacity
        entry = self.ring[index]
        if entry is None or entry.state < COMPLETED:  # first round, or still running: a new one
            entry = self.ring[index] = Entry()
        self.recorded += 1
        # only what the state makes current is set: readers ignore seq and the times of a
        # queued entry, the error of one that did not fail (see _registry.entry_record)
        entry.spec, entry.async_op, entry.state, entry.queued = spec, async_op, state, now
        entry.algorithm = None  # until the operation completes: the algorithm its engine ran
        if self.detail:
            entry.call_site = call_site()
        return entry

    def started(self, entry: Entry, seq: int) -> None:
        entry.seq = seq
        entry.started = _monotonic()
        entry.state = STARTED
        self.running = entry

    def completed(self, entry: Entry, algorithm: str | None = None) -> None:
        entry.finished = _monotonic()
        entry.algorithm = algorithm
        entry.state = COMPLETED
        self.running = None
        if self.timeline is not None:
            self.timeline.operation(self, entry)

    def failed(self, entry: Entry, error: BaseException) -> None:
        entry.finished = _monotonic()
        entry.error = f"{type(error).__name__}: {error}"
        entry.state = FAILED
        self.running = None
        if self.timeline is not None:
            self.timeline.operation(self, entry)
        if isinstance(error, DistError):
            _registry.failure(self, entry)

    def entries(self) -> list[Entry]:
        """The recorded entries, oldest first."""
        start = self.recorded % self.capacity if self.recorded > self.capacity else 0
        ring = list(self.ring)
        return [e for e in ring[start:] + ring[:start] if e is not None]

    def destroy(self) -> None:
        """The group is gone: keep its entries for dumps until the rank's next init."""
        _registry.retire(self)


class Trace(Protocol):
    """The hooks a ProcessGroup calls (and destroy): each gets back the entry ``queued`` or
    ``begin`` returned (an Entry from GroupTrace, None from NullTrace)."""

    def queued(self, spec: OpSpec, async_op: bool) -> Entry | None: ...

    def begin(self, spec: OpSpec, seq: int) -> Entry | None: ...

    def started(self, entry: Any, seq: int) -> None: ...

    def completed(self, entry: Any, algorithm: str | None = None) -> None: ...

    def failed(self, entry: Any, error: BaseException) -> None: ...

    def destroy(self) -> None: ...


class NullTrace:
    """The hooks when the recorder is off (PYDIST_TRACE_BUFFER=0, no timeline)."""

    def queued(self, spec: OpSpec, async_op: bool) -> None:
        return None

    def begin(self, spec: OpSpec, seq: int) -> None:
        return None

    def started(self, entry: None, seq: int) -> None:
        pass

    def completed(self, entry: None, algorithm: str | None = None) -> None:
        pass

    def failed(self, entry: None, error: BaseException) -> None:
        pass

    def destroy(self) -> None:
        pass


NULL_TRACE = NullTrace()

#: whether groups created from now on note each call's file and line although PYDIST_DEBUG
#: does not ask for it: set by the layer that owns torch's debug level (set_call_sites)
_call_sites = False


def set_call_sites(on: bool) -> None:
    """Make the recorders of groups created from now on note each call's file and line
    (torch's DETAIL debug level, ``pydist.set_debug_level``), or stop unless PYDIST_DEBUG=detail."""
    global _call_sites
    _call_sites = on


def attach(group: Any, rank: int, world_size: int) -> Trace:
    """The recorder of a new ProcessGroup of global rank ``rank`` in a world of ``world_size``
    (settings read now: env changes after fork count)."""
    found = settings()
    if found.trace_buffer == 0 and found.timeline is None:
        _registry.forget(rank)
        return NULL_TRACE
    session = _registry.session_for(rank, world_size, found.timeline)
    detail = found.debug == "detail" or _call_sites
    trace = GroupTrace(group, session, max(found.trace_buffer, 1), detail)
    session.add(trace)
    return trace
