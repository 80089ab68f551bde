"""Named shared-memory segments in /dev/shm: created by one rank, mapped by the others,
unlinked as soon as every one of them has mapped it.

Once unlinked, a segment lives only as long as some process maps it, so nothing is left
behind even if every rank is killed with SIGKILL. The only window is between creation and
the last attach; names carry the creator's pid so that ``remove_stale`` (run before each
creation) unlinks segments whose creator no longer exists.
"""
from __future__ import annotations

import mmap
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

import numpy as np

from ...core import deadline as _deadline
from ...core.deadline import Deadline
from ...core.errors import DistStoreError, OpTimeoutError


class Keepalive(Protocol):
    """What a user of a segment's memory releases when it closes (a :class:`Segment`)."""

    def unlink(self) -> None: ...

    def close(self) -> None: ...

PREFIX = "pydist-"
SHM_DIR = "/dev/shm"


def segment_name(token: str, purpose: str) -> str:
    """pydist-<job>-<purpose>-<unique>-<creator pid> (the pid last, for remove_stale)."""
    return f"{PREFIX}{token[:12]}-{purpose}-{uuid.uuid4().hex[:8]}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Unlink pydist segments whose creating process is gone; returns their names."""
    removed = []
    for name in os.listdir(SHM_DIR):
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            continue
        if not _pid_alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


class Segment:
    """A mapped shared-memory region: ``array`` (uint8), ``base`` (its address)."""

    def __init__(self, name: str, size: int, create: bool):
        self.name = name
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"shared-memory segment {name} has {os.fstat(fd).st_size} bytes, expected {size}")
            self._map = mmap.mmap(fd, size)
        except BaseException:
            if create:
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.base = self.array.ctypes.data
        self.unlinked = False

    def unlink(self) -> None:
        """Remove the name; the memory stays mapped for whoever has it."""
        if not self.unlinked:
            self.unlinked = True
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unmap (once no view into it is alive; otherwise when the last view goes)."""
        self.array = None  # type: ignore[assignment]  # closed: dropped so the map can go, never read again
        try:
            self._map.close()
        except BufferError:
            pass


def anonymous(size: int) -> tuple[np.ndarray, int]:
    """Memory shared by the threads of this process (thread-ranks in tests): (array, base)."""
    array = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
    return array, array.ctypes.data


#: Seconds between two looks at the store and the members' liveness while waiting for a
#: segment's name, at most: the pauses double from FIRST_POLL_SECONDS up to this, so a name
#: that comes t seconds into the wait is seen by about t + min(t, ALIVE_POLL_SECONDS).
ALIVE_POLL_SECONDS = 0.1
FIRST_POLL_SECONDS = 0.001


def share(store, key: str, members: list[int], rank: int, size: int, token: str, purpose: str,
          deadline: Deadline, alive: Callable[[], None] | None = None) -> Segment:
    """Create (lowest rank of ``members``) or attach the segment named under ``key`` in the
    store; the last rank to attach unlinks it; DistStoreError if the named one is gone.
    Waiting for the creator ends with OpTimeoutError naming it at ``deadline``, or with
    whatever ``alive()`` raises (a member is dead, the group was aborted), checked at least
    every ALIVE_POLL_SECONDS."""
    creator = min(members)
    if rank == creator:
        remove_stale()
        segment = Segment(segment_name(token, purpose), size, create=True)
        store.set(f"{key}/name", segment.name)
    else:
        _wait_for_name(store, f"{key}/name", creator, deadline, alive)
        segment = _attach(f"{key}/name", store.get(f"{key}/name").decode(), size, creator)
    if store.add(f"{key}/attached", 1) == len(members):
        segment.unlink()
    return segment


def _attach(key: str, name: str, size: int, creator: int) -> Segment:
    """Map the segment rank ``creator`` named under ``key``; DistStoreError if it is gone."""
    try:
        return Segment(name, size, create=False)
    except FileNotFoundError:
        raise DistStoreError(f"the shared memory named under store key {key!r} ({name}) is gone: rank {creator} "
                             "exited before every member attached, or the key was left in this store by an "
                             "earlier run (a restarted job that reuses its store needs a key prefix per "
                             "attempt, e.g. TORCHELASTIC_RESTART_COUNT's)") from None


def _wait_for_name(store, key: str, creator: int, deadline: Deadline, alive: Callable[[], None] | None) -> None:
    """Until ``key`` is in the store. Without ``alive``: one wait to the deadline. With it: a
    look (``check``) then ``alive()`` then a pause, over again, never a short ``wait``: torch's
    TCPStore client logs two warnings each time one of its waits expires, so polling with
    waits of 0.1 s printed 20 lines a second on a rank waiting for a late creator."""
    pause = FIRST_POLL_SECONDS
    while True:
        left = deadline.remaining()  # None: no deadline
        if alive is None:
            try:
                store.wait([key], timedelta(days=365) if left is None else timedelta(seconds=max(left, 0.001)))
                return
            except DistStoreError:  # the wait timed out (the torch plugin's store raises pydist's errors too)
                pass
        elif store.check([key]):
            return
        else:
            alive()
        if deadline.expired():
            raise OpTimeoutError(f"Timed out waiting for rank {creator} to create the shared memory (it has not "
                                 "reached this operation or is stuck)") from None
        if alive is not None:
            _deadline.pause(pause if left is None else min(pause, left))  # on pydist's clock, as the deadline
            pause = min(2 * pause, ALIVE_POLL_SECONDS)
