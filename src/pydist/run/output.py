"""Forward workers' stdout/stderr to the launcher's, one prefixed line at a time.

One thread multiplexes every worker pipe (``selectors``). Bytes are forwarded as they are
(no decoding); each complete line is written as ``prefix + line`` (just ``line`` if it already starts
with the prefix, as torch's tracebacks do) under a process-wide lock
and flushed, so lines of different workers, and the launcher's own messages written with
:func:`write_bytes`, never interleave inside a line. A partial last line is written, with a
newline added, when its pipe reaches end of file or the pump is stopped. A line longer than
:data:`MAX_LINE` bytes is cut into several prefixed lines rather than buffered without bound.
Write errors on the launcher's side (closed stdout, EPIPE) are ignored: the pump keeps
draining the pipes so workers never block on a full pipe.
"""
from __future__ import annotations

import collections
import os
import selectors
import threading
from dataclasses import dataclass, field
from typing import BinaryIO

from ..core import deadline as _deadline

#: Longest line held back waiting for its newline.
MAX_LINE = 1 << 20
_WRITE_LOCK = threading.Lock()


def write_bytes(dest: BinaryIO, data: bytes) -> None:
    """Write and flush ``data`` to ``dest`` atomically with respect to other writers here."""
    with _WRITE_LOCK:
        try:
            dest.write(data)
            dest.flush()
        except (OSError, ValueError):
            pass


def _prefixed(prefix: bytes, line: bytes) -> bytes:
    """``prefix + line``, unless the worker already began ``line`` with that very prefix
    (torch's excepthook, installed by init_process_group, writes ``[rank0]: `` before each
    traceback line)."""
    return line if line.startswith(prefix) else prefix + line


@dataclass
class _Source:
    prefix: bytes
    dest: BinaryIO | None
    tail: collections.deque[bytes] | None
    files: tuple[BinaryIO, ...] = ()
    pending: bytearray = field(default_factory=bytearray)


class OutputPump:
    """Copies registered pipes to their destinations line by line until EOF or :meth:`stop`.

    Register pipes with :meth:`add`, before :meth:`start` or while it runs (a replacement
    worker's); the pump runs until every pipe reached its end of file and :meth:`no_more`
    was called. The pump owns the registered file descriptors and closes each at its end
    of file (or at stop).
    """

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._sources: dict[int, _Source] = {}
        self._stop = threading.Event()
        self._more = threading.Event()  # set by no_more(): no pipe will be added any more
        self._more.set()
        self._thread = threading.Thread(target=self._run, name="pydist-run-output", daemon=True)

    def add(self, fd: int, prefix: str, dest: BinaryIO | None, tail: collections.deque[bytes] | None = None,
            files: tuple[BinaryIO, ...] = ()) -> None:
        """Forward ``fd`` to ``dest`` (None: nowhere) with ``prefix`` and, unprefixed, to
        ``files``; keep its last lines in ``tail`` if given."""
        self._sources[fd] = _Source(prefix.encode(), dest, tail, files)
        self._selector.register(fd, selectors.EVENT_READ)

    def start(self, more_to_come: bool = False) -> None:
        """Start forwarding (a no-op when already started); ``more_to_come``: pipes may be
        added while it runs (until ``no_more``)."""
        if more_to_come:
            self._more.clear()
        if self._thread.ident is None:
            self._thread.start()

    def no_more(self) -> None:
        """No pipe will be added any more: the pump ends once the ones it has reach their end."""
        self._more.set()

    def wait(self, timeout: float | None) -> bool:
        """Wait until every pipe reached end of file; True if they all did within ``timeout``."""
        self.no_more()
        self.start()
        return _deadline.join(self._thread, timeout)

    def stop(self) -> None:
        """Stop now: flush partial lines, close the pipes still open (held by stray grandchildren)."""
        self._stop.set()
        self.start()
        self._thread.join()

    def _run(self) -> None:
        try:
            while (self._sources or not self._more.is_set()) and not self._stop.is_set():
                for key, _ in self._selector.select(timeout=0.1):  # real time: how often it looks at _stop
                    self._read(key.fd)
        finally:
            for fd in list(self._sources):
                self._close(fd)
            self._selector.close()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            self._close(fd)
            return
        source = self._sources[fd]
        source.pending += data
        end = source.pending.rfind(b"\n") + 1
        if len(source.pending) - end >= MAX_LINE:
            end = len(source.pending)
        if end:
            self._emit(source, bytes(source.pending[:end]))
            del source.pending[:end]

    def _close(self, fd: int) -> None:
        source = self._sources.pop(fd)
        if source.pending:
            self._emit(source, bytes(source.pending))
        self._selector.unregister(fd)
        os.close(fd)

    @staticmethod
    def _emit(source: _Source, chunk: bytes) -> None:
        parts = chunk.split(b"\n")
        if parts[-1] == b"":
            parts.pop()
        lines = [part + b"\n" for part in parts]
        if source.tail is not None:
            source.tail.extend(lines)
        if source.dest is not None:
            write_bytes(source.dest, b"".join(_prefixed(source.prefix, line) for line in lines))
        for file in source.files:
            write_bytes(file, b"".join(lines))
