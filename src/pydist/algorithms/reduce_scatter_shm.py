"""Same-host reduce_scatter through the group's shared-memory arena.

Each slot is cut into n sub-slots. Per chunk: every rank copies chunk j of its input for
rank j into its sub-slot j, a barrier, then every rank reduces its own sub-slot of every
slot into its output (reads n sub-chunks, one barrier per chunk). Inputs are never
modified; blocks may differ in size. The engine picks it for every reduce_scatter of a group of several ranks that
all share this host's memory.
"""
from __future__ import annotations

import numpy as np

from ..core.fingerprint import fingerprint
from ..core.ops import ReduceOp, reduce_rows
from ._partition import chunks
from .comm import Comm


def reduce_scatter(comm: Comm, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp,
                   segment_bytes: int = 0) -> None:
    """``output`` = reduction over ranks of every rank's ``inputs[rank]``."""
    arena, dtype = comm.arena, output.dtype
    n, me = arena.size, arena.rank
    sub = max(1, arena.slot_bytes // output.itemsize // n)
    longest = max(block.size for block in inputs)  # blocks may differ (allreduce_rails' slices)
    call = fingerprint("reduce_scatter", dtype, longest, reduce_op=op.op)
    for a, b in chunks(longest, sub):
        parity = arena.next_parity()
        mine = arena.slot(parity, me, dtype)
        for member, block in enumerate(inputs):
            piece = block[a:b]
            mine[member * sub:member * sub + piece.size] = piece
        arena.sync(comm, call)
        call = 0
        out = output[a:b]
        reduce_rows(arena.rows(parity, dtype, n * sub)[:, me * sub:me * sub + out.size], out, op)
