"""Hierarchical all_reduce for groups spanning hosts.

1. On each host, reduce to the host's leader (its lowest group rank) through the host's
   shared-memory arena (reduce_shm).
2. The leaders all_reduce among themselves over the network (recursive doubling up to
   SMALL_BYTES, the pipelined ring above).
3. On each host, the leader broadcasts the result through the arena (broadcast_shm).
Network traffic is that of an all_reduce among hosts, not among ranks. The engine picks it
for groups with ranks on several hosts and more than one rank on some host.
"""
from __future__ import annotations

import numpy as np

from .._comm import Comm
from .._ops import ReduceOp
from . import allreduce_recursive_doubling, allreduce_ring
from .broadcast_shm import broadcast
from .reduce_shm import reduce

SMALL_BYTES = 64 * 1024


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    local, leaders = comm.hierarchy
    leader = local.arena.members[0] if local.arena is not None else None
    if local.arena is not None:
        reduce(local, buf, leader, op)
    if leaders is not None:
        inter = allreduce_recursive_doubling if buf.nbytes <= SMALL_BYTES else allreduce_ring
        inter.all_reduce(leaders, buf, op, segment_bytes)
    if local.arena is not None:
        broadcast(local, buf, leader)
