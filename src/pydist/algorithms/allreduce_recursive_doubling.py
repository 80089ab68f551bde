"""Recursive-doubling all_reduce, for small buffers.

Cost: ceil(log2 n) steps of the whole buffer (plus 2 steps when n is not a power of two:
the first 2r ranks, r = n - 2^floor(log2 n), fold pairwise into r ranks and unfold at the
end). Latency optimal; sends log2(n) times the buffer, so the engine picks it only for
small buffers: up to SMALL_ALL_REDUCE_BYTES (engines/choice.py), or fewer elements than
ranks, when the group is neither on one host with shared memory (allreduce_shm) nor
spread over hosts with several ranks on one (allreduce_hierarchical, whose leaders use it
for small buffers too). Every rank ends with bitwise-identical results (each step
combines the same two values on both partners).
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp, reduce_into
from .comm import Comm


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int = 0) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    n, r = comm.size, comm.rank
    if n == 1:
        return
    power = 1 << (n.bit_length() - 1)
    extra = n - power
    tmp = np.empty_like(buf)
    if r < 2 * extra:  # fold: even ranks hand their data to the odd rank above
        if r % 2 == 0:
            comm.send(r + 1, buf, tag=0)
            comm.recv(r + 1, buf, tag=2)
            return
        comm.recv(r - 1, tmp, tag=0)
        reduce_into(buf, tmp, op)
        virtual = r // 2
    else:
        virtual = r - extra
    mask = 1
    while mask < power:
        partner = virtual ^ mask
        peer = partner * 2 + 1 if partner < extra else partner + extra
        comm.sendrecv(peer, buf, peer, tmp, tag=1)
        reduce_into(buf, tmp, op)
        mask <<= 1
    if r < 2 * extra:
        comm.send(r - 1, buf, tag=2)
