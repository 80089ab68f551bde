"""The names of pydist's shared-memory segments in /dev/shm, and the clean-up of those
whose creator is gone.

A name is ``pydist-<world token, 12 chars>-<purpose>-<32 random hex>-<creator pid>``: the
random part (``secrets.token_hex``) makes it unguessable, so nobody can create it first;
the pid last, for :func:`remove_stale` (and the test suite's leak check).

/dev/shm is writable by every local user, so :func:`remove_stale` trusts nothing there: it
considers only regular files (not links, not directories) owned by this user whose name is
exactly that format with a pid in the kernel's range, and it never raises on an entry it
does not understand: a planted file stops no job.
"""
from __future__ import annotations

import os
import re
import secrets
import stat

PREFIX = "pydist-"
SHM_DIR = "/dev/shm"
#: hex digits of randomness in a name (128 bits)
UNIQUE_HEX = 32
#: ``pydist-<world>-<purpose>-<unique>-<pid>``; ``unique`` may be shorter in names made by
#: earlier versions (8 hex digits), which remove_stale still cleans up
NAME = re.compile(r"pydist-[0-9A-Za-z]{0,12}-[a-z]{1,16}-[0-9a-f]{8,32}-([1-9][0-9]{0,9})")
#: the largest pid when /proc/sys/kernel/pid_max cannot be read (the kernel's limit, 2**22)
PID_MAX_LIMIT = 1 << 22


def segment_name(token: str, purpose: str) -> str:
    """A new unguessable name for a segment of the world ``token`` made for ``purpose``."""
    return f"{PREFIX}{token[:12]}-{purpose}-{secrets.token_hex(UNIQUE_HEX // 2)}-{os.getpid()}"


def creator_pid(name: str) -> int | None:
    """The pid a well-formed segment name ends with; None for any other name."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    pid = int(match.group(1))
    return pid if pid <= _pid_max() else None


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as file:
            return int(file.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    return True


def _ours(path: str) -> bool:
    """A regular file (not a link) owned by this user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def remove_stale(directory: str | None = None) -> list[str]:
    """Unlink this user's pydist segments whose creating process is gone (in ``directory``,
    by default SHM_DIR); their names. Anything else there is left alone, and nothing there
    makes it raise (an unreadable directory: nothing removed)."""
    directory = SHM_DIR if directory is None else directory
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        pid = creator_pid(name)
        path = os.path.join(directory, name)
        # /dev/shm is sticky: a file that is ours now cannot be swapped by another user
        if pid is None or _pid_alive(pid) or not _ours(path):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(name)
    return removed
