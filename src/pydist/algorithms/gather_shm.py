"""Same-host gather through the group's shared-memory arena.

A first barrier exchanges sizes (the root's expected size per rank, every rank's input
size; parts may differ, as in gather_object), so every rank checks them alike. Then per
chunk: every rank copies its part into its slot, a barrier, the root copies every slot
out. The engine picks it for every gather of a group of several ranks that all share this
host's memory.
"""
from __future__ import annotations

import numpy as np

from ._partition import chunks
from ._shm_sizes import check_rooted, exchange_sizes
from .comm import Comm


def gather(comm: Comm, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
    """``outputs[i]`` on ``root`` = rank i's ``input``."""
    arena, dtype = comm.arena, input.dtype
    n, me, owner = arena.size, arena.rank, arena.group_ranks.index(root)
    expected = [out.size for out in outputs] if outputs is not None else [0] * n
    tables = exchange_sizes(comm, expected + [input.size])
    check_rooted(comm, tables, owner, owner_sends=False)
    longest = int(max(t[n] for t in tables))
    for a, b in chunks(longest, arena.slot_bytes // input.itemsize):
        parity = arena.next_parity()
        mine = input[a:b]
        arena.slot(parity, me, dtype)[:mine.size] = mine
        arena.sync(comm)
        if outputs is not None:
            for member, out in enumerate(outputs):
                part = out[a:b]
                part[...] = arena.slot(parity, member, dtype)[:part.size]
