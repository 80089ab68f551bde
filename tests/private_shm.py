"""A /dev/shm of one's own for a pytest-xdist worker: ``make test`` runs two workers side by
side, and pydist (like MPICH) cleans up and counts what it finds in /dev/shm, so one worker's
job must not see another's segments (a job's start removes segments whose creator is gone,
and the suite's leak check counts new ones).

``enter()`` moves the calling thread, and every process and thread it starts afterwards, into
a mount namespace of its own (``unshare(CLONE_NEWNS)``, every mount made private) with a fresh
tmpfs on /dev/shm the size of the machine's. It needs CAP_SYS_ADMIN (root); without it it
raises OSError saying so, and the suite must run with ``-n 0``. Network namespaces are not
touched: ``ip netns`` and the ranks' sockets work as before.
"""
from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
SHM = b"/dev/shm"


def enter() -> None:
    """Give this thread (and what it starts from now on) a private, empty /dev/shm."""
    libc = ctypes.CDLL(None, use_errno=True)
    stats = os.statvfs(SHM)
    size = stats.f_blocks * stats.f_frsize
    if libc.unshare(CLONE_NEWNS) != 0:
        _fail("unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _fail("making every mount private")
    if libc.mount(b"tmpfs", SHM, b"tmpfs", 0, f"size={size},mode=1777".encode()) != 0:
        _fail("mounting a tmpfs on /dev/shm")


def _fail(step: str) -> None:
    error = ctypes.get_errno()
    raise OSError(error, f"a private /dev/shm for this pytest-xdist worker: {step} failed "
                         f"({os.strerror(error)}); it needs CAP_SYS_ADMIN (root). Run the suite with -n 0 instead")


if __name__ == "__main__":  # the Makefile's probe: exits 0 where a worker's enter() would work
    enter()
