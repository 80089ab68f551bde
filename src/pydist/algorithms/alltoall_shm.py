"""Same-host all_to_all through the group's shared-memory arena.

A first barrier exchanges every rank's send and receive sizes (parts may differ in size:
all_to_all_single with split sizes), so every rank checks every pair and runs the same
number of rounds. Each slot is cut into n sub-slots; per round every rank copies its part
for rank j into sub-slot j, a barrier, and every rank copies its sub-slot of every slot
out. The engine picks it for every all_to_all of a group of several ranks that all share
this host's memory.
"""
from __future__ import annotations

import numpy as np

from ._partition import chunks
from ._shm_sizes import exchange_sizes, mismatch
from .comm import Comm


def all_to_all(comm: Comm, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
    """``outputs[j]`` on rank i = ``inputs[i]`` of rank j."""
    arena = comm.arena
    n, me, dtype = arena.size, arena.rank, outputs[0].dtype
    tables = exchange_sizes(comm, [x.size for x in inputs] + [x.size for x in outputs])
    for sender in range(n):
        for receiver in range(n):
            sent, expected = tables[sender][receiver], tables[receiver][n + sender]
            if sent != expected:
                raise mismatch(comm, sender, receiver, sent, expected)
    sub = max(1, arena.slot_bytes // dtype.itemsize // n)
    for a, b in chunks(int(max(t.max() for t in tables)), sub):
        parity = arena.next_parity()
        mine = arena.slot(parity, me, dtype)
        for member, part in enumerate(inputs):
            piece = part[a:b]
            mine[member * sub:member * sub + piece.size] = piece
        arena.sync(comm)
        for member, out in enumerate(outputs):
            piece = out[a:b]
            piece[...] = arena.slot(parity, member, dtype)[me * sub:me * sub + piece.size]
