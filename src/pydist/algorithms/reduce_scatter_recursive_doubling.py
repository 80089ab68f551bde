"""Reduce-scatter as a recursive-doubling all_reduce of the whole input, for small inputs.

Cost: ceil(log2 n) rounds (+2 when n is not a power of two), each of the whole input: log2 n
times the bytes of the ring's (n-1)/n, but log2 n rounds instead of n-1. The engine picks it
while the input is small (SMALL_ALL_REDUCE_BYTES, engines/choice.py: the all_reduce's own
threshold, since that is what runs) among more than two network ranks, and among the hosts'
leaders of the hierarchical reduce_scatter. Blocks may differ in size.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from ._partition import end_to_end
from .allreduce_recursive_doubling import all_reduce
from .comm import Comm


def doubling_reduce_scatter(comm: Comm, blocks: list[np.ndarray], op: ReduceOp, segment_bytes: int,
                            tag_base: int = 0) -> None:
    """Reduce over ``blocks`` (one view per rank, end to end in memory, as the hierarchical
    reduce_scatter packs them): then every block holds the result, ``blocks[rank]`` included."""
    whole = end_to_end(blocks)
    assert whole is not None, "the blocks must lie end to end"
    all_reduce(comm, whole, op)


def reduce_scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp,
                   segment_bytes: int) -> None:
    """``output`` = reduction over ranks of every rank's ``inputs[rank]``; inputs unchanged."""
    whole = np.concatenate([block.reshape(-1) for block in inputs])
    all_reduce(comm, whole, op)
    start = sum(block.size for block in inputs[:comm.rank])
    output[...] = whole[start:start + inputs[comm.rank].size].reshape(output.shape)
