"""Hierarchical reduce_scatter for groups spanning hosts.

1. On each host, every rank's whole input (its blocks for every rank, host after host) is
   reduced at the host's leader (lowest group rank) through the host's arena (reduce_shm).
2. The leaders reduce-scatter over the network by host (the reduce-scatter among hosts the
   engine picks by input size and host count, recursive doubling or the ring:
   ``stages.inter``; blocks of different sizes allowed): host h's leader ends with host h's
   blocks.
3. On each host, the leader scatters them to its ranks through the arena (scatter_shm).
Inputs are left unchanged: the leader reduces into a copy; other ranks read their inputs in
place when they lie end to end in that order (reduce_scatter_tensor with each host's ranks
consecutive), else from a copy. Network traffic is that of a reduce-scatter among hosts.
The engine picks it for reduce_scatter when the group spans hosts and some host has
several of its ranks.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from ._partition import PACKED_SCRATCH, end_to_end, packed_by_host
from .comm import Comm
from .reduce_shm import reduce as host_reduce
from .scatter_shm import scatter as host_scatter


def reduce_scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp,
                   segment_bytes: int) -> None:
    """``output`` = reduction over ranks of every rank's ``inputs[rank]``; inputs unchanged."""
    stages = comm.hierarchy
    assert stages is not None  # the engine sets it when it picks this algorithm
    local, leaders, mine = stages.local, stages.leaders, stages.hosts[stages.host]
    order = [g for ranks in stages.hosts for g in ranks]
    sizes = [block.size for block in inputs]
    packed = None if comm.rank == mine[0] else end_to_end([inputs[g] for g in order])
    copied = packed is None
    if packed is None:
        packed = comm.scratch(sum(sizes), output.dtype, PACKED_SCRATCH)
    parts, host_blocks = packed_by_host(stages.hosts, sizes, packed)
    if copied:
        for g in order:
            parts[g][...] = inputs[g]
    if local.arena is not None:
        host_reduce(local, packed, mine[0], op)
    if leaders is not None:
        assert stages.inter is not None  # the engine sets the host stage's algorithm
        stages.inter(leaders, host_blocks, op, segment_bytes)
    if local.arena is not None:
        host_scatter(local, output, [parts[g] for g in mine] if comm.rank == mine[0] else None, mine[0])
    else:
        output[...] = parts[comm.rank]
