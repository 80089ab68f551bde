"""Every rank's group recorders, and writing them to ``PYDIST_TRACE_DIR``.

A process usually holds one rank; thread-ranks (``pydist.testing.run_threads``) hold one
each, so traces are kept per global rank (a ``RankTraces``: one init's groups, live and
destroyed). A rank's file is ``pydist_trace_rank{R}.json``, replaced atomically, written:

- when an operation raises a DistError (timeout, dead peer, aborted group, desync) — at
  most once a second per rank, the first failure is kept in every later file;
- when the rank destroys its last group (destroy_process_group, also at interpreter exit),
  so a rank that finished early, the usual cause of a hang, leaves its trace too;
- on demand: ``dump_traces()`` (to ``PYDIST_TRACE_DIR`` or a given directory).

Without PYDIST_TRACE_DIR nothing is written unless ``dump_traces(directory)`` is called.
The file format is in ``snapshot``.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

from ..core.settings import settings
from ._format import COMPLETED, FAILED, STARTED, STATE_NAMES, itemsize, wall
from .timeline import Timeline

FORMAT_VERSION = 1
RETIRED_GROUPS = 16  # destroyed groups kept per rank until its next init
FAILURE_DUMP_INTERVAL = 1.0  # seconds: a burst of failing operations writes once
_LOCK = threading.RLock()
_RANKS: dict[int, RankTraces] = {}
_ENDPOINTS: dict[int, str] = {}  # rank -> the address and interface its peers dial
class RankTraces:
    """The recorders of one rank since its last init: live groups, then destroyed ones."""

    def __init__(self, rank: int, world_size: int, timeline_path: str | None):
        self.rank = rank
        self.world_size = world_size
        self.live: list[Any] = []
        self.retired: deque = deque(maxlen=RETIRED_GROUPS)
        self.first_failure: str | None = None
        self.last_failure_dump = float("-inf")
        self._tids = 0
        self.timeline = None
        if timeline_path:
            self.timeline = Timeline.open(timeline_path, rank)

    def next_tid(self) -> int:
        self._tids += 1
        return self._tids - 1

    def add(self, trace: Any) -> None:
        with _LOCK:
            self.live.append(trace)
        if self.timeline is not None:
            self.timeline.group(trace)

    def groups(self) -> list[Any]:
        with _LOCK:
            return sorted(list(self.live) + list(self.retired), key=lambda trace: trace.tid)


def note_endpoint(rank: int, endpoint: str) -> None:
    """Where ``rank``'s peers reach it (``10.1.0.7, eth1``), for its trace file."""
    with _LOCK:
        _ENDPOINTS[rank] = endpoint


def session_for(rank: int, world_size: int, timeline_path: str | None) -> RankTraces:
    """The RankTraces a new group of ``rank`` joins: a fresh one when the rank has no live
    group (a new init forgets the previous one's groups, whose names repeat)."""
    with _LOCK:
        traces = _RANKS.get(rank)
        if traces is None or not traces.live:
            if traces is not None and traces.timeline is not None:
                traces.timeline.close()
            traces = _RANKS[rank] = RankTraces(rank, world_size, timeline_path)
        return traces


def forget(rank: int) -> None:
    """Drop the traces of ``rank``'s previous init (it starts one without a recorder)."""
    with _LOCK:
        traces = _RANKS.get(rank)
        if traces is not None and not traces.live:
            del _RANKS[rank]


def retire(trace: Any) -> None:
    """``trace``'s group was destroyed; after a rank's last group, write its files."""
    session = trace.session
    with _LOCK:
        if trace.destroyed:
            return
        trace.destroyed = True
        if trace in session.live:
            session.live.remove(trace)
        session.retired.append(trace)
        last = not session.live
    if last:
        _finish(session, "destroy_process_group")


def _finish(session: RankTraces, reason: str) -> None:
    if session.timeline is not None:
        session.timeline.close()
    directory = settings().trace_dir
    if directory:
        _dump_quietly(session, directory, reason)


def failure(trace: Any, entry: Any) -> None:
    """An operation of ``trace``'s group raised a DistError: write the rank's traces."""
    session = trace.session
    reason = f"{entry.error} [{entry.spec.name} seq {entry.seq} on group {trace.name}]"
    now = time.monotonic()  # real time: a rate limit on writing files, on the files' clock
    with _LOCK:
        if session.first_failure is None:
            session.first_failure = reason
        due = now - session.last_failure_dump >= FAILURE_DUMP_INTERVAL
        if due:
            session.last_failure_dump = now
    directory = settings().trace_dir
    if due and directory:
        _dump_quietly(session, directory, reason)


def _dump_quietly(session: RankTraces, directory: str, reason: str) -> None:
    """Write, never raise: the failure being reported matters more than its trace."""
    try:
        write(session, directory, reason)
    except (OSError, ValueError, TypeError) as error:
        print(f"pydist: could not write the flight recorder of rank {session.rank} to {directory}: {error}",
              file=sys.stderr)


# -- the file ----------------------------------------------------------------------------

def call_fields(entry: Any) -> dict:
    """An entry's call (dtype, count, bytes, root, reduce_op) and its optional fields
    (algorithm, error, call_site); None where there is none."""
    spec = entry.spec
    return {"dtype": spec.dtype, "count": spec.count, "bytes": spec.count * itemsize(spec.dtype),
            "root": None if spec.root < 0 else spec.root,
            "reduce_op": None if spec.reduce_op is None else spec.reduce_op.name,
            "algorithm": entry.algorithm, "error": entry.error if entry.state == FAILED else None,
            "call_site": entry.call_site}


def entry_record(entry: Any) -> dict:
    """One entry as written: its call, state and times (wall: epoch seconds; mono: this
    process's time.monotonic(); None when not reached)."""
    state = entry.state  # a reused entry's older fields are stale until its state reaches them
    started = entry.started if state >= STARTED else None
    finished = entry.finished if state >= COMPLETED else None
    return {"seq": entry.seq if state >= STARTED else None, "op": entry.spec.name, **call_fields(entry),
            "async_op": entry.async_op,
            "state": STATE_NAMES[entry.state],
            "time_queued": wall(entry.queued), "time_started": started and wall(started),
            "time_finished": finished and wall(finished),
            "mono_queued": entry.queued, "mono_started": started, "mono_finished": finished}


def snapshot(session: RankTraces, reason: str = "on demand") -> dict:
    """A rank's traces as written to its file:

    ``{"version", "host", "endpoint" (address and interface peers dial, or None), "pid",
    "rank", "world_size", "reason", "first_failure",
    "time_dumped", "mono_dumped", "groups": [{"name", "desc", "number" (creation order on
    this rank, from 0), "id", "ranks", "group_rank",
    "capacity", "recorded", "destroyed", "entries": [entry_record, ... oldest first]}]}``
    """
    groups = [{"name": t.name, "desc": t.desc, "number": t.tid, "id": f"{t.group_id:x}", "ranks": list(t.ranks),
               "group_rank": t.group_rank, "capacity": t.capacity, "recorded": t.recorded,
               "destroyed": t.destroyed, "entries": [entry_record(e) for e in t.entries()]}
              for t in session.groups()]
    now = time.monotonic()
    return {"version": FORMAT_VERSION, "host": socket.gethostname(), "endpoint": _ENDPOINTS.get(session.rank),
            "pid": os.getpid(), "rank": session.rank,
            "world_size": session.world_size, "reason": reason, "first_failure": session.first_failure,
            "time_dumped": wall(now), "mono_dumped": now, "groups": groups}


def trace_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"pydist_trace_rank{rank}.json")


def write(session: RankTraces, directory: str, reason: str) -> str:
    """Write ``session``'s file in ``directory`` (made if missing), atomically; its path."""
    os.makedirs(directory, exist_ok=True)
    path = trace_path(directory, session.rank)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temporary, "w") as file:
        json.dump(snapshot(session, reason), file, indent=1)
    os.replace(temporary, path)
    return path


def sessions(rank: int | None = None) -> list[RankTraces]:
    with _LOCK:
        if rank is not None:
            return [_RANKS[rank]] if rank in _RANKS else []
        return [_RANKS[r] for r in sorted(_RANKS)]


@atexit.register
def _at_exit() -> None:
    """Ranks whose groups were never destroyed: close timelines, write traces if asked."""
    for session in sessions():
        if session.live:
            reason = "exit" if session.first_failure is None else "exit after a failure"
            _finish(session, reason)
