"""The device layer's files in /dev/shm: private to this user, opened only when proven ours.

Behaviour
    ``new_name(letter)`` names a file ``pydist-d<letter>-<16 hex>-<creator pid>``;
    ``create(name, size)`` makes it (mode 0600, never following a link, never an existing
    file, its bytes reserved) and maps it; ``attach(name, size)`` maps an existing one after
    checking that it is a regular file of this user, mode 0600 and exactly ``size`` bytes. A
    name from a peer is checked against the pattern before it touches the file system.
    ``remove_stale()`` (run before each creation) unlinks this user's files whose creator is
    dead, so a killed process leaks nothing past the next creation, and leaves alone (never
    raising on) whatever else is there; a process that exits removes the files it made and
    did not remove (a buffer a peer never closed, a failed group's: their users are gone with
    it). The file rules are pydist.core.shm_files', shared with the transport's segments.

Failure modes
    A name that is not ours, a file of another user, with other permissions, of another size
    or a link: ValueError saying which. A file that is gone: FileNotFoundError. No room in
    /dev/shm: SharedMemoryFull at creation.
"""
from __future__ import annotations

import atexit
import functools
import mmap
import os
import re
import secrets

from ..core import shm_files

PREFIX = "pydist-d"
_NAME = re.compile(r"pydist-d[a-z]-[0-9a-f]{16}-([0-9]{1,10})")
_MADE: set[str] = set()  # the files this process made and has not removed


def new_name(letter: str) -> str:
    """A fresh name for a file of kind ``letter`` (one lowercase letter) made by this process."""
    return check_name(f"{PREFIX}{letter}-{secrets.token_hex(8)}-{os.getpid()}")


def check_name(name: str) -> str:
    """``name`` if it is one of the device layer's names, else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a pydist device file name")
    return name


def creator(name: str) -> int:
    """The pid that created the file ``name``."""
    return int(check_name(name).rsplit("-", 1)[1])


def create(name: str, size: int) -> tuple[int, mmap.mmap]:
    """Make and map the file ``name`` of ``size`` bytes (zeros): (its descriptor, the map)."""
    remove_stale()
    fd = shm_files.create(check_name(name), size, "device file", "PYDIST_DEVICE_SLOT_BYTES")
    try:
        mapped = mmap.mmap(fd, size)
        _MADE.add(name)
        return fd, mapped
    except BaseException:
        os.close(fd)
        unlink(name)
        raise


def attach(name: str, size: int) -> tuple[int, mmap.mmap]:
    """Map the existing file ``name`` once proven ours and ``size`` bytes: (descriptor, map)."""
    fd = shm_files.open_existing(check_name(name))
    try:
        unfit = shm_files.unfit(os.fstat(fd), size)
        if unfit is not None:
            raise ValueError(f"{shm_files.path(name)} refused: {unfit}")
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def unlink(name: str) -> None:
    """Remove the file ``name`` (already gone: nothing)."""
    _MADE.discard(name)
    try:
        os.unlink(shm_files.path(check_name(name)))
    except FileNotFoundError:
        pass


def remove_stale() -> list[str]:
    """Unlink this user's device files whose creating process is gone; their names."""
    return shm_files.remove_stale(functools.partial(shm_files.creator_pid, _NAME))


def _remove_made() -> None:
    """At exit: remove the files this process made and left (not a forked child's parent's)."""
    for name in list(_MADE):
        if creator(name) == os.getpid():
            unlink(name)


atexit.register(_remove_made)
os.register_at_fork(after_in_child=_MADE.clear)
