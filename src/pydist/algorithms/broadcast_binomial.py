"""Binomial-tree broadcast, segmented and pipelined.

Cost: ceil(log2 n) steps; the root sends the buffer log2(n) times, every other rank
receives it once. Segments are forwarded to children as soon as they arrive, so for large
buffers the tree works as a pipeline. The engine picks it for broadcast when the group's
ranks do not all share one host's memory (then broadcast_shm runs).
"""
from __future__ import annotations

import numpy as np

from ._partition import segments, tag
from .comm import Comm


def tree(rank: int, root: int, size: int) -> tuple[int | None, list[int]]:
    """(parent, children) of ``rank`` in the binomial tree rooted at ``root``; children
    farthest first."""
    virtual = (rank - root) % size
    parent, children, mask = None, [], 1
    while mask < size:
        if virtual & mask:
            parent = (virtual - mask + root) % size
            break
        if virtual + mask < size:
            children.append((virtual + mask + root) % size)
        mask <<= 1
    return parent, children[::-1]


def broadcast(comm: Comm, buf: np.ndarray, root: int, segment_bytes: int) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank."""
    if comm.size == 1:
        return
    parent, children = tree(comm.rank, root, comm.size)
    pieces = segments(buf.size, buf.itemsize, segment_bytes)
    receives = [comm.irecv(parent, buf[s], tag(0, j)) for j, s in enumerate(pieces)] if parent is not None else []
    sends = []
    for j, s in enumerate(pieces):
        if receives:
            comm.wait(receives[j])
        sends += [comm.isend(child, buf[s], tag(0, j)) for child in children]
    comm.wait_all(sends)
