"""Flight recorder: the last N operations of every process group, kept per rank.

Always on. ``ProcessGroup`` calls four hooks per collective: ``queued`` (in ``run``, before
the operation is queued or run inline), ``started`` (it has its sequence number and begins),
``completed`` and ``failed``. Each operation is one ``Entry`` stored in the group's ring
buffer of ``PYDIST_TRACE_BUFFER`` entries (default 2000; 0 turns the recorder off): op name,
dtype, count, root, reduce op, state, error text, and monotonic times. Entries are reused
once the ring has come round, so recording allocates nothing that outlives the operation;
an entry holds no reference to a tensor. With ``PYDIST_DEBUG=detail`` the entry also gets
the caller's file and line (a frame walk, so only then); with a timeline (PYDIST_TIMELINE) the algorithm the backend
chose, noted by wrapping the backend's ``choose``.

What an operation was called with is read from the closure of the body that the
collective hands to ``ProcessGroup.run`` (its ``root``, ``reduce_op`` and data variables,
located once per code object): the recorder needs no change to the collectives. ``count``
is the elements per rank that must agree across ranks (the buffer of broadcast/all_reduce/
reduce, the largest part of an all_gather, the output of scatter/reduce_scatter, the input
of gather, the total input of all_to_all).

A DistError raised by an operation (timeout, dead peer, aborted group, desync) makes the
rank write its traces to ``PYDIST_TRACE_DIR`` (see ``_registry``); so does destroying its
last group, and ``pydist.debug.dump_traces()`` on demand.
"""
from __future__ import annotations

import os
import sys
import time
import weakref
from types import FunctionType
from typing import Any, Callable, Protocol

from .._buffers import Buffer
from .._errors import DistError
from .._settings import settings
from . import _registry
from ._format import COMPLETED, FAILED, QUEUED, STARTED

_monotonic = time.monotonic
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DISTRIBUTED = os.path.join("torch", "distributed", "")


class Entry:
    """One operation of one group: what it was, how far it got, when (monotonic seconds).

    ``dtype`` is a name or a numpy dtype (named when written), ``root`` a group rank or -1,
    ``reduce_op`` a RedOpType or None. A group's entries are reused once their operation
    has ended and the ring has come round, so that recording allocates nothing that lives
    on (long-lived garbage-collected objects would make Python's full collections more
    frequent)."""

    __slots__ = ("seq", "op", "dtype", "count", "root", "reduce_op", "async_op", "state", "queued", "started",
                 "finished", "error", "algorithm", "call_site")
    seq: int
    op: str
    dtype: Any  # a dtype name, a numpy dtype, or None
    count: int
    root: int
    reduce_op: Any  # a RedOpType or None
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


# -- what a call was: read from its body's closure ---------------------------------------

#: per collective: the closure variable that holds the data describing the call, and
#: whether a list of parts counts as its sum (all_to_all) or its largest part (gathers,
#: whose object versions have uneven parts). Unknown names fall back to the outputs.
_DATA_VARIABLE = {
    "broadcast": ("buf", False), "all_reduce": ("buf", False), "reduce": ("buf", False),
    "all_gather": ("arrays", False), "all_gather_into_tensor": ("blocks", False),
    "gather": ("inp", False), "gather_object": ("mine", False),
    "scatter": ("out", False), "scatter_object_list": ("data", False),
    "reduce_scatter": ("out", False), "reduce_scatter_tensor": ("out", False),
    "all_to_all": ("in_arrays", True), "all_to_all_single": ("ins", True),
}
_LAYOUTS: dict[Any, tuple[int, bool, int, int]] = {}


def _layout(name: str, code: Any) -> tuple[int, bool, int, int]:
    """(data cell, sum parts, root cell, reduce-op cell) of a body's code; -1 when absent."""
    names = code.co_freevars
    variable, total = _DATA_VARIABLE.get(name, ("", False))
    layout = (names.index(variable) if variable in names else -1, total,
              names.index("root") if "root" in names else -1,
              names.index("reduce_op") if "reduce_op" in names else -1)
    _LAYOUTS[code] = layout
    return layout


def _data(value: Any, total: bool) -> tuple[Any, int]:
    """(dtype, count) of a Buffer, an array, or a list of arrays; (None, 0) otherwise."""
    if type(value) is Buffer:
        return value.dtype_name, value.array.size
    if isinstance(value, (list, tuple)):
        sizes = [part.size for part in value if part is not None]
        if not sizes:
            return None, 0
        return getattr(value[0], "dtype", None), (sum(sizes) if total else max(sizes))
    return getattr(value, "dtype", None), getattr(value, "size", 0)


def describe(entry: Entry, name: str, body: Callable, outputs: list) -> None:
    """Set ``entry``'s dtype, count, root and reduce op from the call whose body is ``body``."""
    code, cells = getattr(body, "__code__", None), getattr(body, "__closure__", None) or ()
    data, total, root, reduce_op = (_LAYOUTS.get(code) or _layout(name, code)) if cells else (-1, False, -1, -1)
    if data >= 0:
        entry.dtype, entry.count = _data(cells[data].cell_contents, total)
    else:
        entry.dtype, entry.count = _data(outputs[0], False) if outputs else (None, 0)
    entry.root = cells[root].cell_contents if root >= 0 else -1
    entry.reduce_op = getattr(cells[reduce_op].cell_contents, "op", None) if reduce_op >= 0 else None


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

    def __init__(self, group: Any, session: "_registry.RankTraces", capacity: int, detail: bool):
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
        if self.timeline is not None:
            self._capture_algorithm(group.backend)

    def _capture_algorithm(self, backend: Any) -> None:
        """Note the algorithm the backend chooses (``choose``, if it has one) in the running entry."""
        choose = getattr(type(backend), "choose", None)
        if choose is None:
            return
        backend_ref = weakref.ref(backend)  # no cycle: the backend holds this closure

        def recording_choose(*args: Any, **kwargs: Any) -> Any:
            algorithm = choose(backend_ref(), *args, **kwargs)
            entry = self.running
            if entry is not None:
                entry.algorithm = algorithm
            return algorithm

        backend.choose = recording_choose

    def queued(self, name: str, body: Callable, outputs: list, async_op: bool) -> Entry:
        index = self.recorded % self.capacity
        entry = self.ring[index]
        if entry is None or entry.state < COMPLETED:  # first round, or still running: a new one
            entry = self.ring[index] = Entry()
        self.recorded += 1
        # only what the state makes current is set: readers ignore seq and the times of a
        # queued entry, the error of one that did not fail (see _registry.entry_record)
        entry.op, entry.async_op, entry.state, entry.queued = name, async_op, QUEUED, _monotonic()
        layout = _LAYOUTS.get(body.__code__) if type(body) is FunctionType else None
        cells = body.__closure__ if layout is not None and layout[0] >= 0 else None
        value = cells[layout[0]].cell_contents if cells and layout is not None else None
        if type(value) is Buffer:  # the common case inline: a collective's Buffer
            assert cells is not None and layout is not None  # value came from them
            entry.dtype, entry.count = value.dtype_name, value.array.size
            entry.root = cells[layout[2]].cell_contents if layout[2] >= 0 else -1
            entry.reduce_op = getattr(cells[layout[3]].cell_contents, "op", None) if layout[3] >= 0 else None
        else:
            describe(entry, name, body, outputs)
        if self.detail:
            entry.call_site = call_site()
        if self.timeline is not None:
            entry.algorithm = None  # until the backend chooses
        return entry

    def started(self, entry: Entry, seq: int) -> None:
        entry.seq = seq
        entry.started = _monotonic()
        entry.state = STARTED
        self.running = entry

    def completed(self, entry: Entry) -> None:
        entry.finished = _monotonic()
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
    """The four hooks a ProcessGroup calls (and destroy): each gets back the entry ``queued``
    returned (an Entry from GroupTrace, None from NullTrace)."""

    def queued(self, name: str, body: Callable, outputs: list, async_op: bool) -> Entry | None: ...

    def started(self, entry: Any, seq: int) -> None: ...

    def completed(self, entry: Any) -> None: ...

    def failed(self, entry: Any, error: BaseException) -> None: ...

    def destroy(self) -> None: ...


class NullTrace:
    """The hooks when the recorder is off (PYDIST_TRACE_BUFFER=0, no timeline)."""

    def queued(self, name: str, body: Callable, outputs: list, async_op: bool) -> None:
        return None

    def started(self, entry: None, seq: int) -> None:
        pass

    def completed(self, entry: None) -> None:
        pass

    def failed(self, entry: None, error: BaseException) -> None:
        pass

    def destroy(self) -> None:
        pass


NULL_TRACE = NullTrace()


def attach(group: Any, rank: int, world_size: int) -> Trace:
    """The recorder of a new ProcessGroup of global rank ``rank`` in a world of ``world_size``
    (settings read now: env changes after fork count)."""
    found = settings()
    if found.trace_buffer == 0 and found.timeline is None:
        _registry.forget(rank)
        return NULL_TRACE
    session = _registry.session_for(rank, world_size, found.timeline)
    trace = GroupTrace(group, session, max(found.trace_buffer, 1), found.debug == "detail")
    session.add(trace)
    return trace
