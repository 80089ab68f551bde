"""Binomial-tree reduce, segmented and pipelined.

Cost: ceil(log2 n) steps; every non-root rank sends the buffer once; a rank with k
children receives and reduces k buffers. Segments go up the tree as soon as they are
reduced. Non-root inputs are left unchanged (ranks with children reduce into a copy). The
engine picks it for reduce when the group's ranks do not all share one host's memory (then
reduce_shm runs).
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp, reduce_into
from ._partition import segments, tag
from .broadcast_binomial import tree
from .comm import Comm


def reduce(comm: Comm, buf: np.ndarray, root: int, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce every rank's ``buf`` into ``buf`` of ``root``."""
    if comm.size == 1:
        return
    parent, children = tree(comm.rank, root, comm.size)
    children = children[::-1]  # nearest first: a fixed reduction order
    acc = buf if parent is None or not children else buf.copy()
    pieces = segments(buf.size, buf.itemsize, segment_bytes)
    scratch = {child: comm.scratch(buf.size, buf.dtype, i) for i, child in enumerate(children)}
    receives = {child: [comm.irecv(child, scratch[child][s], tag(0, j)) for j, s in enumerate(pieces)]
                for child in children}
    sends = []
    for j, s in enumerate(pieces):
        for child in children:
            comm.wait(receives[child][j])
            reduce_into(acc[s], scratch[child][s], op)
        if parent is not None:
            sends.append(comm.isend(parent, acc[s], tag(0, j)))
    comm.wait_all(sends)
