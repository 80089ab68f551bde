"""Ring all_reduce: ring reduce-scatter, then ring all_gather (segmented, pipelined).

Cost: 2(n-1) steps; each rank sends and receives 2(n-1)/n of the buffer (bandwidth
optimal) and reduces (n-1)/n of it. The engine picks it above SMALL_ALL_REDUCE_BYTES
(engines/choice.py) when the buffer has at least one element per rank and the group is
neither on one host with shared memory (allreduce_shm) nor spread over hosts with several
ranks on one (allreduce_hierarchical, whose leaders use it for large buffers too).
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from ._partition import blocks
from .allgather_ring import post_allgather_receives, ring_allgather
from .comm import Comm
from .reduce_scatter_ring import ring_reduce_scatter


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    if comm.size == 1:
        return
    parts = blocks(buf, comm.size)
    # The all_gather half's receives go first: a neighbour that finishes its reduce-scatter
    # early sends into place instead of into a held copy. Safe: the final value of a block
    # arrives only after this rank's reduce-scatter send of it was received downstream.
    gathered = post_allgather_receives(comm, parts, segment_bytes, tag_base=comm.size)
    ring_reduce_scatter(comm, parts, op, segment_bytes)
    ring_allgather(comm, parts, segment_bytes, tag_base=comm.size, receives=gathered)
