"""Same-host scatter through the group's shared-memory arena.

A first barrier exchanges sizes (the root's part size per rank, every rank's output size;
parts may differ, as in scatter_object_list), so every rank checks them alike. Then per
chunk: the root copies part j into slot j, a barrier, every rank copies its slot out. The
engine picks it for every scatter of a group of several ranks that all share this host's
memory.
"""
from __future__ import annotations

import numpy as np

from ._partition import chunks
from ._shm_sizes import check_rooted, exchange_sizes
from .comm import Comm


def scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
    """``output`` on rank i = ``inputs[i]`` of ``root``."""
    arena, dtype = comm.arena, output.dtype
    n, me, owner = arena.size, arena.rank, arena.group_ranks.index(root)
    parts = [part.size for part in inputs] if inputs is not None else [0] * n
    tables = exchange_sizes(comm, parts + [output.size])
    check_rooted(comm, tables, owner, owner_sends=True)
    longest = int(max(tables[owner][:n]))
    for a, b in chunks(longest, arena.slot_bytes // output.itemsize):
        parity = arena.next_parity()
        if inputs is not None:
            for member, part in enumerate(inputs):
                piece = part[a:b]
                arena.slot(parity, member, dtype)[:piece.size] = piece
        arena.sync(comm)
        mine = output[a:b]
        mine[...] = arena.slot(parity, me, dtype)[:mine.size]
