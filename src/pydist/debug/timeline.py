"""Timeline: every operation of a rank as Chrome trace events (PYDIST_TIMELINE=path).

One file per rank: ``path`` with ``{rank}`` replaced, or ``path.rank{R}.json``. It is a JSON
array of trace events, the format ui.perfetto.dev and chrome://tracing open:

- metadata: ``process_name`` "rank R (host, pid P)" (pid = the rank), ``thread_name``
  "group NAME" per group (tid = the group's number on this rank, 0 = the first group);
- per operation, written when it finishes or fails: a complete event (``"ph": "X"``) from
  start to finish named after the operation, ``args`` = group, seq, state, async_op,
  queued_us (queued -> started), count, bytes, and where they apply dtype, root, reduce_op,
  algorithm, error, call_site; and, when the operation waited at least 10 us before it
  started (behind others on its group), the wait as an async span (``"ph": "b"``/``"e"``,
  category "queue", named "OP queued"), since queued operations overlap the running one.

Timestamps are wall-clock microseconds, so files of ranks on several hosts line up as well
as their clocks do. Events are appended as operations end (buffered); the array is closed
("]") whenever the rank destroys its last group and at interpreter exit, and reopened for
appending if the rank initialises again, so the file is valid JSON after
destroy_process_group. Costs a few microseconds per operation, only when enabled.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from ._format import FAILED, STATE_NAMES, itemsize, wall

_TAIL = "\n]\n"
QUEUED_SPAN_SECONDS = 10e-6  # a shorter wait is the call's own overhead, not a queue
_SEALED: set[str] = set()  # files this process closed: a re-init appends to them


def timeline_path(path: str, rank: int) -> str:
    return path.replace("{rank}", str(rank)) if "{rank}" in path else f"{path}.rank{rank}.json"


def _us(monotonic: float) -> float:
    return wall(monotonic) * 1e6


_QUOTED: dict[str, str] = {}


def _quote(text: str) -> str:
    """``text`` as a JSON string; op, group, dtype and algorithm names are cached."""
    quoted = _QUOTED.get(text)
    if quoted is None:
        quoted = json.dumps(text)
        if len(_QUOTED) < 1024:
            _QUOTED[text] = quoted
    return quoted


class Timeline:
    """One rank's trace-event file, appended to as operations finish."""

    def __init__(self, path: str, rank: int, file: Any, empty: bool):
        self.path = path
        self.rank = rank
        self._file = file
        self._empty = empty
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str, rank: int) -> Timeline:
        path = os.path.abspath(timeline_path(path, rank))
        if path in _SEALED and os.path.exists(path):
            file = open(path, "r+")
            file.seek(0, os.SEEK_END)
            file.seek(file.tell() - len(_TAIL))
            _SEALED.discard(path)
            timeline = cls(path, rank, file, empty=False)
        else:
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            file = open(path, "w")
            file.write("[")
            timeline = cls(path, rank, file, empty=True)
        host = socket.gethostname()
        timeline._write({"name": "process_name", "ph": "M", "pid": rank,
                         "args": {"name": f"rank {rank} ({host}, pid {os.getpid()})"}})
        timeline._write({"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}})
        return timeline

    def _write(self, *events: dict) -> None:
        self._write_text(*(json.dumps(event, separators=(",", ":")) for event in events))

    def _write_text(self, *events: str) -> None:
        with self._lock:
            if self._file is None:
                return
            self._file.write(("\n" if self._empty else ",\n") + ",\n".join(events))
            self._empty = False

    def group(self, trace: Any) -> None:
        """Name the group's track."""
        desc = f" ({trace.desc})" if trace.desc and trace.desc != trace.name else ""
        self._write({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": trace.tid,
                     "args": {"name": f"group {trace.name}{desc} ranks {list(trace.ranks)}"}},
                    {"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": trace.tid,
                     "args": {"sort_index": trace.tid}})

    def operation(self, trace: Any, entry: Any) -> None:
        """The events of one finished (or failed) operation, formatted by hand (json.dumps
        costs ~15 us per operation); the queued span only when the operation waited."""
        spec = entry.spec
        dtype, count = spec.dtype, spec.count
        text = (f'"group":{_quote(trace.name)},"seq":{entry.seq},"state":"{STATE_NAMES[entry.state]}",'
                f'"async_op":{"true" if entry.async_op else "false"},'
                f'"queued_us":{(entry.started - entry.queued) * 1e6:.3f},"count":{count},'
                f'"bytes":{count * itemsize(dtype)}')
        if dtype is not None:
            text += f',"dtype":{_quote(dtype)}'
        if spec.root >= 0:
            text += f',"root":{spec.root}'
        if spec.reduce_op is not None:
            text += f',"reduce_op":"{spec.reduce_op.name}"'
        if entry.algorithm is not None:
            text += f',"algorithm":{_quote(entry.algorithm)}'
        if entry.state == FAILED:
            text += f',"error":{json.dumps(entry.error)}'
        if entry.call_site is not None:
            text += f',"call_site":{json.dumps(entry.call_site)}'
        where = f'"pid":{self.rank},"tid":{trace.tid}'
        started = _us(entry.started)
        events = [f'{{"name":{_quote(spec.name)},"cat":"op","ph":"X","ts":{started:.3f},'
                  f'"dur":{(entry.finished - entry.started) * 1e6:.3f},{where},"args":{{{text}}}}}']
        if entry.started - entry.queued >= QUEUED_SPAN_SECONDS:
            name, span = _quote(f"{spec.name} queued"), f'"cat":"queue","id":"{trace.group_id:x}.{entry.seq}",{where}'
            events += [f'{{"name":{name},"ph":"b","ts":{_us(entry.queued):.3f},{span}}}',
                       f'{{"name":{name},"ph":"e","ts":{started:.3f},{span}}}']
        self._write_text(*events)

    def close(self) -> None:
        """Close the array and the file (a later re-init of this rank appends)."""
        with self._lock:
            if self._file is None:
                return
            self._file.write(_TAIL)
            self._file.truncate()
            self._file.close()
            self._file = None
            _SEALED.add(self.path)
