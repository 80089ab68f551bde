"""Files in /dev/shm that only this user's processes may share: made, opened and cleaned up
without trusting anything another local user can put there.

Behaviour
    ``create(name, size, what)`` makes ``name`` exclusively (``O_CREAT | O_EXCL``, never
    through a link, mode 0600 whatever the umask) and reserves its ``size`` bytes
    (``posix_fallocate``), so a /dev/shm without room fails here with
    :class:`SharedMemoryFull`, never later with SIGBUS on a write. ``open_existing(name)``
    opens without following a link (nor blocking on a planted FIFO); ``unfit(info, size)``
    says why an opened file is not one this user made of ``size`` bytes (another owner,
    group/other permissions, not a regular file, another size). ``remove_stale(creator_of)``
    unlinks the files whose creator (``creator_of(name)``: a pid, or None for a name that is
    not the caller's; ``creator_pid`` reads one) is gone; it considers only regular files owned by this user, and never
    raises on an entry it does not understand. ``pid_alive`` answers for any integer.

    ``SHM_DIR`` is read at each call, so tests can point it at a small tmpfs.

Failure modes
    ``create``: FileExistsError if the name is taken (the caller picks a fresh unguessable
    one), SharedMemoryFull naming the directory, the bytes asked and free and what to do;
    the half-made file is removed. ``open_existing``: FileNotFoundError, or OSError (ELOOP
    for a link).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable

from .errors import DistError

SHM_DIR = "/dev/shm"
#: the largest pid when /proc/sys/kernel/pid_max cannot be read (the kernel's limit, 2**22)
PID_MAX_LIMIT = 1 << 22
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class SharedMemoryFull(DistError):
    """/dev/shm has no room for a file: raised at its creation (see the module)."""


def path(name: str) -> str:
    """Where the file ``name`` lives (under SHM_DIR as it is now)."""
    return os.path.join(SHM_DIR, name)


#: the settings that make pydist's own segments smaller, named when /dev/shm is full
SEGMENT_SIZES = "PYDIST_SHM_SLOT_BYTES / PYDIST_SHM_RING_BYTES"


def create(name: str, size: int, what: str, sizes: str = SEGMENT_SIZES) -> int:
    """Make ``name`` of ``size`` reserved bytes: its fd. ``what`` it is for and the ``sizes``
    settings that shrink it are named if /dev/shm has no room."""
    fd = os.open(path(name), _OPEN | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        _reserve(fd, size, what, sizes)
    except BaseException:
        os.close(fd)
        os.unlink(path(name))
        raise
    return fd


def open_existing(name: str) -> int:
    """Open ``name`` read-write, never through a link: its fd (check it with :func:`unfit`)."""
    return os.open(path(name), _OPEN)


def unfit(info: os.stat_result, size: int) -> str | None:
    """Why a file with ``info`` is not one of ``size`` bytes this user made (None: it may be)."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.geteuid():
        return f"it is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        return f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in (pydist makes 0600)"
    if info.st_size != size:
        return f"it has {info.st_size} bytes, expected {size}"
    return None


def creator_pid(pattern: re.Pattern[str], name: str) -> int | None:
    """The pid that ``name`` ends with, if ``name`` matches ``pattern`` (whose first group is
    that pid) and the pid is one the kernel can give; None for any other name."""
    match = pattern.fullmatch(name)
    if match is None:
        return None
    pid = int(match.group(1))
    return pid if 0 < pid <= _pid_max() else None


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as file:
            return int(file.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie counts as gone); False for
    a number no process can have."""
    if pid <= 0:  # kill(0 or -1, 0) would probe a group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, OSError):  # beyond pid_t: no process has it
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return stat_file.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def remove_stale(creator_of: Callable[[str], int | None]) -> list[str]:
    """Unlink this user's files whose creator is gone (module docstring); their names."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        pid = creator_of(name)
        # /dev/shm is sticky: a file that is ours now cannot be swapped by another user
        if pid is None or pid_alive(pid) or not _ours(path(name)):
            continue
        try:
            os.unlink(path(name))
        except OSError:
            continue
        removed.append(name)
    return removed


def _ours(file: str) -> bool:
    """A regular file (not a link) owned by this user."""
    try:
        info = os.lstat(file)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _reserve(fd: int, size: int, what: str, sizes: str) -> None:
    """Give the file ``size`` bytes of real memory now; SharedMemoryFull when there is no room."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in _FULL:
            raise
        raise SharedMemoryFull(f"{SHM_DIR} has no room for a shared-memory {what} of {size} bytes: "
                               f"{_free_bytes()} bytes are free. Give it more (docker run --shm-size=1g, or a "
                               f"larger tmpfs on /dev/shm), lower {sizes}, or turn shared memory off with "
                               "PYDIST_SHM=0") from error


def _free_bytes() -> int | str:
    try:
        info = os.statvfs(SHM_DIR)
    except OSError:
        return "unknown"
    return info.f_bavail * info.f_frsize
