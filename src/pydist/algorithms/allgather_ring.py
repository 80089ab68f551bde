"""Ring all_gather, segmented and pipelined.

Cost: n-1 steps; each rank sends and receives (n-1)/n of the output. Blocks may differ in
size (all_gather with uneven tensors). Every receive is posted up front straight into its
final place, and a received segment is forwarded at once. The engine picks it for
all_gather when the group's ranks do not all share one host's memory (then allgather_shm
runs); it is also the second half of the ring all_reduce.
"""
from __future__ import annotations

import numpy as np

from ..transport.base import Request
from ._partition import segments, tag
from .comm import Comm


def post_allgather_receives(comm: Comm, blocks: list[np.ndarray], segment_bytes: int,
                            tag_base: int = 0) -> list[list[Request]]:
    """Post every receive of ``ring_allgather`` straight into its final place, per step."""
    n, r = comm.size, comm.rank
    left, itemsize = (r - 1) % n, blocks[0].itemsize
    receives = []
    for step in range(n - 1):
        block = blocks[(r - step - 1) % n]
        receives.append([comm.irecv(left, block[s], tag(tag_base + step, j))
                         for j, s in enumerate(segments(block.size, itemsize, segment_bytes))])
    return receives


def ring_allgather(comm: Comm, blocks: list[np.ndarray], segment_bytes: int, tag_base: int = 0,
                   receives: list[list[Request]] | None = None) -> None:
    """``blocks[rank]`` is filled by its owner; afterwards every block is, on every rank.
    ``receives``: those post_allgather_receives posted earlier (else they are posted now)."""
    n, r = comm.size, comm.rank
    if n == 1:
        return
    if receives is None:
        receives = post_allgather_receives(comm, blocks, segment_bytes, tag_base)
    right, itemsize = (r + 1) % n, blocks[0].itemsize
    own = blocks[r]
    sends = [comm.isend(right, own[s], tag(tag_base, j))
             for j, s in enumerate(segments(own.size, itemsize, segment_bytes))]
    for step in range(n - 1):
        block = blocks[(r - step - 1) % n]
        for j, s in enumerate(segments(block.size, itemsize, segment_bytes)):
            comm.wait(receives[step][j])
            if step + 2 < n:
                sends.append(comm.isend(right, block[s], tag(tag_base + step + 1, j)))
    comm.wait_all(sends)


def all_gather(comm: Comm, outputs: list[np.ndarray], input: np.ndarray, segment_bytes: int) -> None:
    """``outputs[i]`` = rank i's ``input``, on every rank."""
    outputs[comm.rank][...] = input
    ring_allgather(comm, outputs, segment_bytes)
