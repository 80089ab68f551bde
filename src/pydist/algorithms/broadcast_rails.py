"""Multi-rail broadcast for groups spanning hosts with the same number of ranks on each.

With M ranks per host, the buffer goes in spans of M segments; rank i of each host carries
segment i of every span across hosts:
1. On the root's host, the root broadcasts the span through the host's arena.
2. The ranks at place i on every host (rail i) pass segment i down a binomial tree over
   the hosts (broadcast_binomial's), each forwarding as soon as it has it.
3. On every other host, its ranks all_gather the span's segments through the arena.
Receives are posted up front and sends complete in the background, so the spans flow as
a pipeline. M connections carry the buffer between two hosts instead of one: a one-way
transfer, where several streams beat one (docs/algorithms.md).
"""
from __future__ import annotations

import numpy as np

from ._partition import blocks, chunks, tag
from .allgather_shm import all_gather as host_all_gather
from .broadcast_binomial import tree
from .broadcast_shm import broadcast as host_broadcast
from .comm import Comm


def broadcast(comm: Comm, buf: np.ndarray, root: int, segment_bytes: int) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank."""
    stages = comm.hierarchy
    assert stages is not None and stages.rail is not None  # set by the engine
    local, rail = stages.local, stages.rail
    assert local.arena is not None  # several ranks per host
    places, place = local.arena.size, local.arena.rank
    parent, children = tree(rail.rank, stages.led_by(root), rail.size)
    spans = [buf[a:b] for a, b in chunks(buf.size, places * max(1, segment_bytes // buf.itemsize))]
    mine = [blocks(span, places)[place] for span in spans]
    receives = [rail.irecv(parent, part, tag(0, j)) for j, part in enumerate(mine)] if parent is not None else []
    sends = []
    for j, span in enumerate(spans):
        if parent is None:
            host_broadcast(local, span, root)
        else:
            rail.wait(receives[j])
        sends += [rail.isend(child, mine[j], tag(0, j)) for child in children]
        if parent is not None:
            host_all_gather(local, blocks(span, places), mine[j])
    rail.wait_all(sends)
