"""FileStore: a store in a file shared by processes (on one host or on a shared filesystem).

The file is an append-only log of change records (format: ``_protocol.CHANGES`` after a
``PDSF`` hello). Every operation takes ``fcntl.flock`` on it (shared to read, exclusive to
write), replays the records other processes appended since its last look, runs the
operation on the rebuilt state and appends the resulting changes. Blocking operations
poll with a sleeping backoff (1 ms doubling to 50 ms), so many waiters stay cheap.

A reference count lives in the file itself; with ``world_size`` given, the last of the
``world_size`` instances to close deletes the file (torch's behaviour). A file that is
not such a log raises DistStoreError naming it.
"""
from __future__ import annotations

import fcntl
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.errors import DistStoreError
from ._base import Backoff, Store, retry_until
from ._protocol import FILE_MAGIC, ChangeParser, Message, ProtocolError, encode_changes, hello
from ._state import INTERNAL_PREFIX, KVState

_REFCOUNT = INTERNAL_PREFIX + "refcount"
_FINISHED = INTERNAL_PREFIX + "finished"
_READ_ONLY = frozenset({"check", "num_keys", "list_keys", "queue_len", "multi_get", "wait"})


class FileDeletedError(DistStoreError):
    """The store's file was deleted under this instance."""


class _RecordLog:
    """The open log file and the state replayed from it; one per FileStore instance."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DistStoreError(f"FileStore: cannot open {path}: {e}") from e
        self._lock = threading.Lock()
        self._parser = ChangeParser()
        self._offset = 0
        self._state = KVState()

    @contextmanager
    def locked(self, exclusive: bool) -> Iterator[KVState]:
        """The up-to-date state, under the file lock; changes made to it are appended."""
        with self._lock:
            if self._fd < 0:
                raise DistStoreError(f"FileStore {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._refresh()
                try:
                    yield self._state
                finally:
                    self._save(self._state.take_changes())
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        stat = os.fstat(self._fd)
        if stat.st_nlink == 0:
            raise FileDeletedError(f"FileStore {self.path} was deleted (every instance of its world_size closed)")
        size = stat.st_size
        if size < self._offset:
            raise DistStoreError(f"FileStore {self.path}: the file shrank from {self._offset} to {size} bytes")
        if size > self._offset:
            data = os.pread(self._fd, size - self._offset, self._offset)
            self._offset += len(data)
            self._parser.feed(data)
            try:
                while (change := self._parser.next()) is not None:
                    self._state.apply(change)
            except ProtocolError as e:
                raise DistStoreError(f"FileStore {self.path} is not a pydist store file or is corrupt: {e}") from e

    def _save(self, changes: list[Message]) -> None:
        """Append ``changes``; if they cannot be encoded, forget the state (it is replayed
        from the file on the next look) so it never disagrees with the file."""
        if not changes:
            return
        try:
            data = encode_changes(changes)
        except ValueError:
            self._parser, self._offset, self._state = ChangeParser(), 0, KVState()
            raise
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._parser.pending:
            raise DistStoreError(f"FileStore {self.path} ends in an incomplete record (a writer crashed?)")
        if self._offset == 0:
            data = hello(FILE_MAGIC) + data
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        # Our own records are applied already: let the parser pass over them.
        self._parser.feed(data)
        while self._parser.next() is not None:
            pass
        self._offset += len(data)

    def release(self, world_size: int) -> None:
        """Drop this instance's reference; the last of ``world_size`` deletes the file."""
        if self._fd < 0:
            return
        try:
            with self.locked(exclusive=True) as state:
                finished = state.add(_FINISHED, 1)
                if state.add(_REFCOUNT, -1) <= 0 and 0 <= world_size <= finished:
                    os.unlink(self.path)
        except (FileDeletedError, FileNotFoundError):
            pass  # deleted already: nothing left to count
        finally:
            self.close()

    def close(self) -> None:
        """Close the file without touching the reference count."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class FileStore(Store):
    """A store kept in ``file_name`` (created if missing), shared by every process that
    opens the same file. ``world_size`` (-1: unknown) decides when the file is deleted."""

    def __init__(self, file_name: str | os.PathLike[str], world_size: int = -1):
        super().__init__()
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"file_name: expected str or os.PathLike, got {type(file_name).__name__}")
        if not isinstance(world_size, int):
            raise TypeError(f"world_size: expected int, got {type(world_size).__name__}")
        self._path = os.fspath(file_name)
        self._log = log = self._open_log()
        self._finalizer = weakref.finalize(self, log.release, world_size)

    def _open_log(self) -> _RecordLog:
        """Open the file and count this instance in; reopen if the last closer of a
        previous job deleted it meanwhile."""
        while True:
            log = _RecordLog(self._path)
            try:
                with log.locked(exclusive=True) as state:
                    state.add(_REFCOUNT, 1)
                return log
            except FileDeletedError:
                log.close()
            except BaseException:
                log.close()
                raise

    def _where(self) -> str:
        return f"FileStore {self._path}"

    def _call(self, op: str, *args: Any) -> Any:
        with self._log.locked(exclusive=op not in _READ_ONLY) as state:
            return getattr(state, op)(*args)

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        return retry_until(lambda: self._call(op, *args), Backoff(), timeout_s, self._where())

    def close(self) -> None:
        """Drop this instance's reference to the file (see the class docstring)."""
        self._finalizer()
