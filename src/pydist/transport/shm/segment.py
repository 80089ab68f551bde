"""Named shared-memory segments in /dev/shm: created by one rank, mapped by the others,
unlinked as soon as every one of them has mapped it.

Once unlinked, a segment lives only as long as some process maps it, so nothing is left
behind even if every rank is killed with SIGKILL. The only window is between creation and
the last attach; names carry the creator's pid so that ``remove_stale`` (run before each
creation) unlinks segments whose creator no longer exists (see names).

Creation is exclusive (``O_CREAT | O_EXCL``, an unguessable name, a new one on a
collision), mode 0600, and reserves the whole segment (``posix_fallocate``): a /dev/shm
too small fails there with :class:`SharedMemoryFull`, never later with SIGBUS on a write.
The creator seals the segment (see seal) before publishing its name. A member maps a name
only if it is a pydist segment name, opens without following links, and finds a regular
file owned by this user, no group/other permission, the expected size and the seal of its
group; anything else is refused (:class:`SegmentRefused`) before any slot is touched.
"""
from __future__ import annotations

import errno
import mmap
import os
from typing import Protocol

import numpy as np

from ...core import shm_files
from ...core.errors import DistStoreError
from ...core.shm_files import SharedMemoryFull
from .names import NAME, PREFIX, creator_pid, remove_stale, segment_name
from .seal import SEAL_BYTES, Binding

__all__ = ["PREFIX", "Keepalive", "Segment", "SegmentRefused", "SharedMemoryFull", "anonymous", "creator_pid",
           "remove_stale", "segment_name"]

#: fresh names tried when creating a segment before giving up (a collision means someone
#: made that name first: with 128 random bits, only by reading it somewhere)
CREATE_TRIES = 8


class Keepalive(Protocol):
    """What a user of a segment's memory releases when it closes (a :class:`Segment`)."""

    def unlink(self) -> None: ...

    def close(self) -> None: ...


class SegmentRefused(DistStoreError):
    """A segment a member was told to map is not its group's (see the module); the message
    names it and why."""


class Segment:
    """A mapped segment: ``array`` (uint8, the payload after the seal's page) and ``base``
    (its address). Made by :meth:`create` or :meth:`attach`."""

    def __init__(self, name: str, fd: int, payload: int):
        self.name = name
        self._path = shm_files.path(name)
        self._map = mmap.mmap(fd, SEAL_BYTES + payload)
        self.array = np.frombuffer(self._map, dtype=np.uint8, count=payload, offset=SEAL_BYTES)
        self.base = self.array.ctypes.data
        self.unlinked = False

    @classmethod
    def create(cls, token: str, purpose: str, binding: Binding) -> Segment:
        """A new segment for ``binding`` (named for the world ``token`` and ``purpose``), its
        space reserved and sealed; SharedMemoryFull if /dev/shm has no room for it."""
        for _ in range(CREATE_TRIES):
            name = segment_name(token, purpose)
            try:
                fd = shm_files.create(name, SEAL_BYTES + binding.payload, f"segment ({purpose})")
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"{CREATE_TRIES} fresh names for a shared-memory segment in {shm_files.SHM_DIR} "
                                  "were all taken")
        try:
            segment = cls(name, fd, binding.payload)
            binding.seal(segment._map, name)
        except BaseException:
            os.unlink(shm_files.path(name))
            raise
        finally:
            os.close(fd)
        return segment

    @classmethod
    def attach(cls, name: str, binding: Binding) -> Segment:
        """Map the segment ``name`` made for ``binding``; SegmentRefused if it is not that
        (see the module), FileNotFoundError if it is gone."""
        if NAME.fullmatch(name) is None:
            raise SegmentRefused(f"{name[:80]!r} is not a pydist segment name")
        try:
            fd = shm_files.open_existing(name)
        except FileNotFoundError:
            raise
        except OSError as error:
            why = "it is a symbolic link" if error.errno == errno.ELOOP else f"it cannot be opened ({error.strerror})"
            raise SegmentRefused(f"{name}: {why}") from None
        try:
            unfit = shm_files.unfit(os.fstat(fd), SEAL_BYTES + binding.payload)
            if unfit is not None:
                raise SegmentRefused(f"{name}: {unfit}")
            segment = cls(name, fd, binding.payload)
        finally:
            os.close(fd)
        unsealed = binding.check(segment._map, name)
        if unsealed is not None:
            segment.close()
            raise SegmentRefused(f"{name}: {unsealed}")
        return segment

    def unlink(self) -> None:
        """Remove the name; the memory stays mapped for whoever has it."""
        if not self.unlinked:
            self.unlinked = True
            try:
                os.unlink(self._path)
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
