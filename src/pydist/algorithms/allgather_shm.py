"""Same-host all_gather through the group's shared-memory arena.

Per chunk: every rank copies its part into its slot, a barrier, every rank copies every
slot out (n copies out per rank, one barrier per chunk). Parts may differ in size. The
engine picks it for every all_gather of a group of several ranks that all share this
host's memory.
"""
from __future__ import annotations

import numpy as np

from ..core.fingerprint import fingerprint
from ._partition import chunks
from .comm import Comm


def all_gather(comm: Comm, outputs: list[np.ndarray], input: np.ndarray, segment_bytes: int = 0) -> None:
    """``outputs[i]`` = rank i's ``input``, on every rank."""
    arena, dtype = comm.arena, input.dtype
    me = arena.rank
    longest = max(out.size for out in outputs)
    call = fingerprint("all_gather", dtype, longest)
    for a, b in chunks(longest, arena.slot_bytes // input.itemsize):
        parity = arena.next_parity()
        mine = input[a:b]
        arena.slot(parity, me, dtype)[:mine.size] = mine
        arena.sync(comm, call)
        call = 0
        for member, out in enumerate(outputs):
            part = out[a:b]
            part[...] = arena.slot(parity, member, dtype)[:part.size]
