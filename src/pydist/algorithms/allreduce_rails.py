"""Multi-rail all_reduce for groups spanning hosts with the same number of ranks on each.

With M ranks per host, the buffer is cut into M slices; rank i of each host carries slice i:
1. On each host, reduce-scatter through the host's arena (reduce_scatter_shm): rank i holds
   its host's sum of slice i.
2. The ranks at place i on every host (rail i) all_reduce slice i over the network, with
   the algorithm the engine chose for that many hosts and bytes (``Hierarchy.inter``).
3. On each host, all_gather the slices through the arena (allgather_shm).
Every rank moves 1/M of the buffer over the network, on its own connection, and the
reductions are spread over all ranks (NCCL's rings per NIC/channel, on one NIC here): M
streams instead of the leader's one. Chosen only when forced (PYDIST_ALGO_ALL_REDUCE=rails,
hosts with equal rank counts): on a machine with fewer cores than ranks its extra streams
cost more CPU than they save (docs/algorithms.md has the measurements).
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from ._partition import blocks
from .allgather_shm import all_gather as host_all_gather
from .comm import Comm
from .reduce_scatter_shm import reduce_scatter as host_reduce_scatter


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    stages = comm.hierarchy
    assert stages is not None and stages.rail is not None and stages.inter is not None  # set by the engine
    local = stages.local
    assert local.arena is not None  # several ranks per host
    slices = blocks(buf, local.arena.size)
    mine = slices[local.arena.rank]
    host_reduce_scatter(local, mine, slices, op)
    stages.inter(stages.rail, mine, op, segment_bytes)
    host_all_gather(local, slices, mine)
