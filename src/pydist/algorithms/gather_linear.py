"""Linear gather: every rank sends its input straight to the root.

Cost: one step; the root receives (n-1) inputs (it must, whatever the algorithm); all of
its receives are posted at once, straight into the output tensors. The engine picks it for
gather when the group's ranks do not all share one host's memory (then gather_shm runs).
"""
from __future__ import annotations

import numpy as np

from .comm import Comm


def gather(comm: Comm, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
    """``outputs[i]`` on ``root`` = rank i's ``input``."""
    if comm.rank != root:
        comm.send(root, input)
        return
    assert outputs is not None  # the root passes them
    receives = [comm.irecv(peer, outputs[peer]) for peer in range(comm.size) if peer != root]
    outputs[root][...] = input
    comm.wait_all(receives)
