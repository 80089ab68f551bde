"""Same-host broadcast through the group's shared-memory arena.

Per chunk: the root copies it into the shared slot, a barrier, every other rank copies it
out (one copy in, n-1 copies out, one barrier per chunk; parities alternate so the root
fills the next chunk while others copy the last). The engine picks it for every broadcast
of a group of several ranks that all share this host's memory; the hierarchical all_reduce
uses it inside each host.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._partition import chunks
from .comm import Comm


def broadcast(comm: Comm, buf: np.ndarray, root: int, segment_bytes: int = 0) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank."""
    arena, dtype = comm.arena, buf.dtype
    is_root = arena.rank == arena.group_ranks.index(root)
    call = comm.call
    for a, b in chunks(buf.size, arena.slot_bytes // buf.itemsize):
        area = arena.shared(arena.next_parity(), dtype)
        if is_root:
            area[:b - a] = buf[a:b]
        arena.sync(comm, call)
        call = 0
        if not is_root:
            buf[a:b] = area[:b - a]


def latency_path(arena, dtype: np.dtype, count: int, root: int) -> Callable[[Comm, np.ndarray], None] | None:
    """The broadcast of ``count`` elements of ``dtype`` from group rank ``root`` where it is
    one chunk: ``run(comm, buf)`` (the root copies in, one sync, the others copy out) with the
    shared slot's view and this rank's part looked up once, for calls that repeat (the engine
    keeps it per call spec); None for calls that take several chunks."""
    if count * dtype.itemsize > arena.slot_bytes:
        return None
    areas = [arena.shared(parity, dtype)[:count] for parity in (0, 1)]
    if arena.rank == arena.group_ranks.index(root):
        def run_root(comm: Comm, buf: np.ndarray) -> None:
            areas[arena.next_parity()][...] = buf
            arena.sync(comm, comm.call)
        return run_root

    def run(comm: Comm, buf: np.ndarray) -> None:
        area = areas[arena.next_parity()]
        arena.sync(comm, comm.call)
        buf[...] = area
    return run
