"""Linear scatter: the root sends each rank its part directly.

Cost: one step; the root sends (n-1) parts, all posted at once; each rank receives one,
straight into its output tensor. The engine picks it for scatter when the group's ranks
do not all share one host's memory (then scatter_shm runs).
"""
from __future__ import annotations

import numpy as np

from .comm import Comm


def scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
    """``output`` on rank i = ``inputs[i]`` of ``root``."""
    if comm.rank != root:
        comm.recv(root, output)
        return
    assert inputs is not None  # the root passes them
    sends = [comm.isend(peer, inputs[peer]) for peer in range(comm.size) if peer != root]
    output[...] = inputs[root]
    comm.wait_all(sends)
