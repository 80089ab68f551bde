"""Hierarchical reduce for groups spanning hosts.

1. On each host, reduce to its leader through the host's arena (reduce_shm); the root leads
   its own host, other hosts are led by their lowest group rank.
2. The leaders reduce to the root over the network (reduce_binomial among hosts).
Each host sends the buffer at most once over the network. Non-root inputs are left
unchanged (a leader other than the root reduces into a copy). The engine picks it for
reduce when the group spans hosts and some host has several of its ranks.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from ._partition import PACKED_SCRATCH
from .comm import Comm
from .reduce_binomial import reduce as network_reduce
from .reduce_shm import reduce as host_reduce


def reduce(comm: Comm, buf: np.ndarray, root: int, op: ReduceOp, segment_bytes: int) -> None:
    """Reduce every rank's ``buf`` into ``buf`` of ``root``."""
    stages = comm.hierarchy
    assert stages is not None  # the engine sets it when it picks this algorithm (root leads its host)
    local, leaders, leader = stages.local, stages.leaders, stages.hosts[stages.host][0]
    acc = buf
    if comm.rank == leader and comm.rank != root:
        acc = comm.scratch(buf.size, buf.dtype, PACKED_SCRATCH)
        acc[...] = buf
    if local.arena is not None:
        host_reduce(local, acc, leader, op)
    if leaders is not None:
        network_reduce(leaders, acc, stages.led_by(root), op, segment_bytes)
