"""Hierarchical broadcast for groups spanning hosts, pipelined by segment.

The root and one leader per other host (its lowest group rank) form a binomial tree over
the network (broadcast_binomial's tree among hosts). Each leader passes every segment on to
its children in that tree as soon as it has it, then broadcasts the segment to its host's
other ranks through the host's arena (broadcast_shm) while the next segments arrive, so the
network and shared-memory stages overlap. Each host receives the buffer once over the
network. The engine picks it for broadcast when the group spans hosts and some host has
several of its ranks.
"""
from __future__ import annotations

import numpy as np

from ..transport.base import Request
from ._partition import segments, tag
from .broadcast_binomial import tree
from .broadcast_shm import broadcast as host_broadcast
from .comm import Comm


def broadcast(comm: Comm, buf: np.ndarray, root: int, segment_bytes: int) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank."""
    stages = comm.hierarchy
    assert stages is not None  # the engine sets it when it picks this algorithm (root leads its host)
    local, leaders, leader = stages.local, stages.leaders, stages.hosts[stages.host][0]
    pieces = segments(buf.size, buf.itemsize, segment_bytes)
    receives: list[Request] = []
    children: list[int] = []
    sends: list[Request] = []
    if leaders is not None:
        parent, children = tree(leaders.rank, stages.led_by(root), leaders.size)
        if parent is not None:
            receives = [leaders.irecv(parent, buf[s], tag(0, j)) for j, s in enumerate(pieces)]
    for j, s in enumerate(pieces):
        if leaders is not None:
            if receives:
                leaders.wait(receives[j])
            sends += [leaders.isend(child, buf[s], tag(0, j)) for child in children]
        if local.arena is not None:
            host_broadcast(local, buf[s], leader)
    if leaders is not None:
        leaders.wait_all(sends)
