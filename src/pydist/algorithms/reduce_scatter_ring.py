"""Ring reduce-scatter, segmented and pipelined.

Cost: n-1 steps; each rank sends and receives (n-1)/n of the buffer and reduces as much.
Every block travels the ring once, reduced at each hop; segments of a block are forwarded
as soon as they are reduced, so copy, network and reduction overlap. The engine picks it
for reduce_scatter when the group's ranks do not all share one host's memory (then
reduce_scatter_shm runs); it is also the first half of the ring all_reduce.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp, reduce_into
from ._partition import segments, tag
from .comm import Comm


def ring_reduce_scatter(comm: Comm, blocks: list[np.ndarray], op: ReduceOp,
                        segment_bytes: int, tag_base: int = 0) -> None:
    """Reduce in place over ``blocks`` (one view per rank); then ``blocks[rank]`` holds the result.

    The other blocks hold partial results afterwards.
    """
    n, r = comm.size, comm.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    itemsize = blocks[0].itemsize
    longest = max(b.size for b in blocks)
    # Every step's receives are posted before the first send, each into its own scratch
    # block: a left neighbour running ahead sends into place, never into a held copy. The
    # cost: n-1 blocks of scratch (about the buffer's size), reused by the thread's next calls.
    scratch = comm.scratch(longest * (n - 1), blocks[0].dtype)
    receives = []
    for step in range(n - 1):
        block, tmp = blocks[(r - step - 2) % n], scratch[step * longest:(step + 1) * longest]
        receives.append([comm.irecv(left, tmp[s], tag(tag_base + step, j))
                         for j, s in enumerate(segments(block.size, itemsize, segment_bytes))])
    first = blocks[(r - 1) % n]
    sends = [comm.isend(right, first[s], tag(tag_base, j))
             for j, s in enumerate(segments(first.size, itemsize, segment_bytes))]
    for step in range(n - 1):
        block, tmp = blocks[(r - step - 2) % n], scratch[step * longest:(step + 1) * longest]
        for j, s in enumerate(segments(block.size, itemsize, segment_bytes)):
            comm.wait(receives[step][j])
            reduce_into(block[s], tmp[s], op)
            if step + 2 < n:
                sends.append(comm.isend(right, block[s], tag(tag_base + step + 1, j)))
    comm.wait_all(sends)


def reduce_scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp,
                   segment_bytes: int) -> None:
    """``output`` = reduction over ranks of every rank's ``inputs[rank]``; inputs unchanged."""
    work = [block.copy() for block in inputs]
    ring_reduce_scatter(comm, work, op, segment_bytes)
    output[...] = work[comm.rank]
