"""Pairwise-exchange all_to_all.

Cost: n-1 steps; at step i rank r sends to r+i and receives from r-i, so every link
carries one message per step. Receives are all posted first, straight into the outputs;
parts may differ in size (all_to_all_single with split sizes). The engine picks it for
all_to_all when the group's ranks do not all share one host's memory (then alltoall_shm
runs).
"""
from __future__ import annotations

import numpy as np

from .comm import Comm


def all_to_all(comm: Comm, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
    """``outputs[j]`` on rank i = ``inputs[i]`` of rank j."""
    n, r = comm.size, comm.rank
    receives = [comm.irecv((r - step) % n, outputs[(r - step) % n]) for step in range(1, n)]
    sends = [comm.isend((r + step) % n, inputs[(r + step) % n]) for step in range(1, n)]
    outputs[r][...] = inputs[r]
    comm.wait_all(receives)
    comm.wait_all(sends)
