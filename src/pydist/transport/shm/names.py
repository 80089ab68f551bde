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

from ...core import shm_files

PREFIX = "pydist-"
#: hex digits of randomness in a name (128 bits)
UNIQUE_HEX = 32
#: ``pydist-<world>-<purpose>-<unique>-<pid>``; ``unique`` may be shorter in names made by
#: earlier versions (8 hex digits), which remove_stale still cleans up
NAME = re.compile(r"pydist-[0-9A-Za-z]{0,12}-[a-z]{1,16}-[0-9a-f]{8,32}-([1-9][0-9]{0,9})")


def segment_name(token: str, purpose: str) -> str:
    """A new unguessable name for a segment of the world ``token`` made for ``purpose``."""
    return f"{PREFIX}{token[:12]}-{purpose}-{secrets.token_hex(UNIQUE_HEX // 2)}-{os.getpid()}"


def creator_pid(name: str) -> int | None:
    """The pid a well-formed segment name ends with; None for any other name."""
    return shm_files.creator_pid(NAME, name)


def remove_stale() -> list[str]:
    """Unlink this user's pydist segments whose creating process is gone; their names.
    Anything else in /dev/shm is left alone, and nothing there makes it raise
    (pydist.core.shm_files.remove_stale)."""
    return shm_files.remove_stale(creator_pid)
