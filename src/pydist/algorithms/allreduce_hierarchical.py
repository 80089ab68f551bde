"""Hierarchical all_reduce for groups spanning hosts.

1. On each host, reduce to the host's leader (its lowest group rank) through the host's
   shared-memory arena (reduce_shm).
2. The leaders all_reduce among themselves over the network, with the algorithm the engine
   chose for that many hosts and bytes (``comm.hierarchy``'s third part: recursive doubling
   for small buffers, the pipelined ring for large ones).
3. On each host, the leader broadcasts the result through the arena (broadcast_shm).
Network traffic is that of an all_reduce among hosts, not among ranks. The engine picks it
for groups with ranks on several hosts and more than one rank on some host.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from .broadcast_shm import broadcast
from .comm import Comm
from .reduce_shm import reduce


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    stages = comm.hierarchy
    assert stages is not None and stages.inter is not None  # the engine sets them when it picks this algorithm
    local, leader = stages.local, stages.hosts[stages.host][0]
    if local.arena is not None:
        reduce(local, buf, leader, op)
    if stages.leaders is not None:
        stages.inter(stages.leaders, buf, op, segment_bytes)
    if local.arena is not None:
        broadcast(local, buf, leader)
