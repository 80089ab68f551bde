"""Bruck (dissemination) all_gather, for small messages among many ranks.

Cost: ceil(log2 n) rounds. In round k each rank sends the blocks it holds, the 2^k from its
own on (fewer in the last round), to rank r - 2^k and receives as many from rank r + 2^k,
each block straight into its final place: blocks are addressed by their owner, so Bruck's
final rotation is not needed. Each rank sends (n-1)/n of the output, as the ring does, but
in log2(n) rounds instead of n-1, to log2(n) peers instead of one: the engine picks it while
the output is small (latency-bound: SMALL_ALL_GATHER_BYTES, engines/choice.py), among the
network ranks and among the hosts' leaders of the hierarchical all_gather. Blocks may differ
in size.
"""
from __future__ import annotations

import numpy as np

from ._partition import segments, tag
from .comm import Comm


def bruck_allgather(comm: Comm, blocks: list[np.ndarray], segment_bytes: int, tag_base: int = 0) -> None:
    """``blocks[rank]`` is filled by its owner; afterwards every block is, on every rank."""
    n, r = comm.size, comm.rank
    held, step = 1, 0
    while held < n:
        count = min(held, n - held)
        source, target = (r + held) % n, (r - held) % n
        receives = [comm.irecv(source, blocks[b][s], tag(tag_base + step, k))
                    for k, (b, s) in enumerate(_pieces(blocks, source, count, segment_bytes))]
        sends = [comm.isend(target, blocks[b][s], tag(tag_base + step, k))
                 for k, (b, s) in enumerate(_pieces(blocks, r, count, segment_bytes))]
        comm.wait_all(receives)
        comm.wait_all(sends)
        held += count
        step += 1


def _pieces(blocks: list[np.ndarray], first: int, count: int, segment_bytes: int) -> list[tuple[int, slice]]:
    """The (block, segment) messages of ``count`` blocks from ``first`` on (mod n), in the
    order both ends number them."""
    n = len(blocks)
    chosen = [(first + i) % n for i in range(count)]
    return [(b, s) for b in chosen for s in segments(blocks[b].size, blocks[b].itemsize, segment_bytes)]


def all_gather(comm: Comm, outputs: list[np.ndarray], input: np.ndarray, segment_bytes: int) -> None:
    """``outputs[i]`` = rank i's ``input``, on every rank."""
    outputs[comm.rank][...] = input
    bruck_allgather(comm, outputs, segment_bytes)
