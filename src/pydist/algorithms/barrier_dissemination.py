"""Dissemination barrier.

Cost: ceil(log2 n) rounds of one empty message per rank: in round k rank r signals
r + 2^k and waits for r - 2^k. No rank leaves before every rank has arrived. The engine
picks it for barrier when the group's ranks do not all share one host's memory (then
barrier_shm runs).
"""
from __future__ import annotations

import numpy as np

from .comm import Comm

_EMPTY = np.empty(0, np.uint8)


def barrier(comm: Comm) -> None:
    """Return once every rank of the group has called barrier."""
    n, r, distance, round_ = comm.size, comm.rank, 1, 0
    while distance < n:
        comm.sendrecv((r + distance) % n, _EMPTY, (r - distance) % n, np.empty(0, np.uint8), tag=round_)
        distance <<= 1
        round_ += 1
