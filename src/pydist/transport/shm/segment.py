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
import stat
from typing import Protocol

import numpy as np

from ...core.errors import DistError, DistStoreError
from . import names
from .names import NAME, PREFIX, creator_pid, remove_stale, segment_name
from .seal import SEAL_BYTES, Binding

__all__ = ["PREFIX", "Keepalive", "Segment", "SegmentRefused", "SharedMemoryFull", "anonymous", "creator_pid",
           "remove_stale", "segment_name"]

#: fresh names tried when creating a segment before giving up (a collision means someone
#: made that name first: with 128 random bits, only by reading it somewhere)
CREATE_TRIES = 8
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a planted FIFO does not block
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Keepalive(Protocol):
    """What a user of a segment's memory releases when it closes (a :class:`Segment`)."""

    def unlink(self) -> None: ...

    def close(self) -> None: ...


class SharedMemoryFull(DistError):
    """/dev/shm has no room for a segment: raised at its creation (see the module)."""


class SegmentRefused(DistStoreError):
    """A segment a member was told to map is not its group's (see the module); the message
    names it and why."""


class Segment:
    """A mapped segment: ``array`` (uint8, the payload after the seal's page) and ``base``
    (its address). Made by :meth:`create` or :meth:`attach`."""

    def __init__(self, name: str, fd: int, payload: int):
        self.name = name
        self._path = _path(name)
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
                fd = os.open(_path(name), _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"{CREATE_TRIES} fresh names for a shared-memory segment in {names.SHM_DIR} "
                                  "were all taken")
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            _reserve(fd, SEAL_BYTES + binding.payload, purpose)
            segment = cls(name, fd, binding.payload)
            binding.seal(segment._map, name)
        except BaseException:
            os.unlink(_path(name))
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
            fd = os.open(_path(name), _OPEN)
        except FileNotFoundError:
            raise
        except OSError as error:
            why = "it is a symbolic link" if error.errno == errno.ELOOP else f"it cannot be opened ({error.strerror})"
            raise SegmentRefused(f"{name}: {why}") from None
        try:
            unfit = _unfit(os.fstat(fd), SEAL_BYTES + binding.payload)
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


def _path(name: str) -> str:
    return os.path.join(names.SHM_DIR, name)  # read at each call: tests point it at a small tmpfs


def _unfit(info: os.stat_result, size: int) -> str | None:
    """Why a file with ``info`` is not a segment of ``size`` bytes this user made (None: it may be)."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.geteuid():
        return f"it is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        return f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in (pydist makes 0600)"
    if info.st_size != size:
        return f"it has {info.st_size} bytes, expected {size}"
    return None


def _reserve(fd: int, size: int, purpose: str) -> None:
    """Give the file ``size`` bytes of real memory now; SharedMemoryFull when there is no room."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in _FULL:
            raise
        raise SharedMemoryFull(f"{names.SHM_DIR} has no room for a shared-memory segment ({purpose}) of {size} bytes: "
                               f"{_free_bytes()} bytes are free. Give it more (docker run --shm-size=1g, or a "
                               "larger tmpfs on /dev/shm), lower PYDIST_SHM_SLOT_BYTES / PYDIST_SHM_RING_BYTES, "
                               "or turn shared memory off with PYDIST_SHM=0") from error


def _free_bytes() -> int | str:
    try:
        info = os.statvfs(names.SHM_DIR)
    except OSError:
        return "unknown"
    return info.f_bavail * info.f_frsize


def anonymous(size: int) -> tuple[np.ndarray, int]:
    """Memory shared by the threads of this process (thread-ranks in tests): (array, base)."""
    array = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
    return array, array.ctypes.data
