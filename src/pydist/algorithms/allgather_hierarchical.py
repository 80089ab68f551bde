"""Hierarchical all_gather for groups spanning hosts.

1. On each host, its ranks' parts are gathered at its leader (lowest group rank) through
   the host's arena (gather_shm), into one block per host.
2. The leaders exchange the hosts' blocks over the network (the all_gather among hosts the
   engine picks by output size and host count, Bruck or the ring: ``stages.inter``; blocks
   of different sizes allowed: hosts with different rank counts).
3. On each host, the leader broadcasts every block through the arena (broadcast_shm).
The blocks live end to end, host after host: when the outputs are views of one tensor in
that order (all_gather_into_tensor with each host's ranks consecutive, as launchers number
them), the work happens in the output itself; otherwise in scratch, copied out at the end.
Network traffic is that of an all_gather among hosts. The engine picks it for all_gather
when the group spans hosts and some host has several of its ranks.
"""
from __future__ import annotations

import numpy as np

from ._partition import PACKED_SCRATCH, end_to_end, packed_by_host
from .broadcast_shm import broadcast as host_broadcast
from .comm import Comm
from .gather_shm import gather as host_gather


def all_gather(comm: Comm, outputs: list[np.ndarray], input: np.ndarray, segment_bytes: int) -> None:
    """``outputs[i]`` = rank i's ``input``, on every rank."""
    stages = comm.hierarchy
    assert stages is not None  # the engine sets it when it picks this algorithm
    local, leaders, mine = stages.local, stages.leaders, stages.hosts[stages.host]
    order = [g for ranks in stages.hosts for g in ranks]
    sizes = [out.size for out in outputs]
    packed = end_to_end([outputs[g] for g in order])
    in_place = packed is not None
    if packed is None:
        packed = comm.scratch(sum(sizes), input.dtype, PACKED_SCRATCH)
    parts, host_blocks = packed_by_host(stages.hosts, sizes, packed)
    if local.arena is not None:
        host_gather(local, input, [parts[g] for g in mine] if comm.rank == mine[0] else None, mine[0])
    else:
        parts[comm.rank][...] = input
    if leaders is not None:
        assert stages.inter is not None  # the engine sets the host stage's algorithm
        stages.inter(leaders, host_blocks, segment_bytes)
    if local.arena is not None:
        host_broadcast(local, packed, mine[0])
    if not in_place:
        for g in order:
            outputs[g][...] = parts[g]
