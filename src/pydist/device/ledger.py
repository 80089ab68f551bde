"""Who has a shared device buffer open: one small /dev/shm file per exported buffer.

Behaviour
    CUDA leaves freeing exported memory before every importer closed it undefined, and says
    nothing to either side. So the exporter of a buffer makes a ledger (``Ledger.create``),
    puts its name in the buffer's handle, and each importer ``register``s (pid, rank) in it
    when it opens the handle and ``unregister``s when it closes. ``retire()`` (the exporter's
    free) refuses while a live process other than the exporter is registered, then marks the
    ledger freed and removes the file; an entry of a dead process does not count. Every change
    holds an exclusive ``flock`` on the file, so a registration racing a retire either lands
    before it (and the free is refused) or finds the ledger freed (and the open is refused).

Cost
    One file of a page per exported buffer; a flock and a few struct reads per open, close or
    free (a few µs). At most ``SLOTS`` openers at once.

Failure modes
    DeviceError from the caller's wrappers; here ValueError: a ledger that is not one (magic),
    freed, full, or already holding this pid (a second open of one handle in one process).
    FileNotFoundError: the exporter already freed the buffer (its ledger is gone).
"""
from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.shm_files import pid_alive
from . import shm_files

SIZE = 4096
SLOTS = 64
_MAGIC = b"PDLEDGR1"
_HEAD = struct.Struct("=8sI")
_SLOT = struct.Struct("=ii")
_FIRST = 64
_LIVE, _FREED = 1, 2


class Ledger:
    """The openers of one exported buffer (see the module docstring)."""

    def __init__(self, name: str, fd: int, memory):
        self.name = name
        self._fd = fd
        self._map = memory

    @classmethod
    def create(cls) -> Ledger:
        """A new, empty ledger made by this process (the exporter)."""
        name = shm_files.new_name("l")
        fd, memory = shm_files.create(name, SIZE)
        _HEAD.pack_into(memory, 0, _MAGIC, _LIVE)
        return cls(name, fd, memory)

    @classmethod
    def attach(cls, name: str) -> Ledger:
        """The exporter's ledger ``name`` (FileNotFoundError once it freed the buffer)."""
        fd, memory = shm_files.attach(name, SIZE)
        return cls(name, fd, memory)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            magic, state = _HEAD.unpack_from(self._map, 0)
            if magic != _MAGIC:
                raise ValueError(f"/dev/shm/{self.name} is not a buffer ledger")
            if state != _LIVE:
                raise ValueError("its exporter freed the buffer")
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _slots(self) -> Iterator[tuple[int, int, int]]:
        for slot in range(SLOTS):
            at = _FIRST + slot * _SLOT.size
            pid, rank = _SLOT.unpack_from(self._map, at)
            yield at, pid, rank

    def register(self, rank: int | None) -> None:
        """Note this process (as ``rank``) among the openers."""
        me = os.getpid()
        with self._locked():
            free = None
            for at, pid, _ in self._slots():
                if pid == me:
                    raise ValueError("this process has it open already: reuse that mapping")
                if free is None and (pid == 0 or not pid_alive(pid)):
                    free = at
            if free is None:
                raise ValueError(f"{SLOTS} processes have it open already")
            _SLOT.pack_into(self._map, free, me, -1 if rank is None else rank)

    def unregister(self) -> None:
        """Remove this process from the openers (a freed ledger: nothing to do)."""
        try:
            with self._locked():
                for at, pid, _ in self._slots():
                    if pid == os.getpid():
                        _SLOT.pack_into(self._map, at, 0, 0)
        except ValueError:
            pass

    def openers(self) -> list[tuple[int, int | None]]:
        """(pid, rank) of each live process other than this one that has it open."""
        with self._locked():
            return self._others()

    def _others(self) -> list[tuple[int, int | None]]:
        return [(pid, None if rank < 0 else rank) for _, pid, rank in self._slots()
                if pid not in (0, os.getpid()) and pid_alive(pid)]

    def retire(self) -> None:
        """Mark the buffer freed and remove the file; ValueError naming the live openers
        (``rank r (pid p)``) while any remain."""
        with self._locked():
            others = self._others()
            if others:
                named = ", ".join(f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
                                  for pid, rank in others)
                raise ValueError(f"{named} still {'has' if len(others) == 1 else 'have'} it open: "
                                 "freeing it now is undefined behaviour for them (close the mappings first)")
            _HEAD.pack_into(self._map, 0, _MAGIC, _FREED)
            shm_files.unlink(self.name)

    def close(self) -> None:
        """Let go of the file (the ledger itself stays for the others)."""
        self._map.close()
        os.close(self._fd)
