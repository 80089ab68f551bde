"""Agreeing on part sizes through the arena before moving parts of uneven size.

Every member writes a table of int64 sizes into its slot and passes a barrier that also
carries the call's fingerprint; every member then reads every table. Because all members
read the same tables, a size mismatch is detected by all of them alike (nobody is left
waiting), and all agree on the number of rounds the data needs.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import DistBackendError
from ..transport.shm.arena import Arena


def exchange_sizes(comm, table: list[int]) -> list[np.ndarray]:
    """Every member's ``table`` (same length everywhere), after a barrier that checks the
    call's fingerprint."""
    arena: Arena = comm.arena
    parity = arena.next_parity()
    arena.slot(parity, arena.rank, np.dtype(np.int64))[:len(table)] = table
    arena.sync(comm, comm.call)
    return [arena.slot(parity, m, np.dtype(np.int64))[:len(table)].copy() for m in range(arena.size)]


def check_rooted(comm, tables: list[np.ndarray], owner: int, owner_sends: bool) -> None:
    """Tables of a rooted call ([root's size per member]..., member's own size at index n):
    raise when a member's size differs from the root's entry for it."""
    n = comm.arena.size
    for member in range(n):
        theirs, roots = tables[member][n], tables[owner][member]
        if theirs != roots:
            raise (mismatch(comm, owner, member, roots, theirs) if owner_sends
                   else mismatch(comm, member, owner, theirs, roots))


def mismatch(comm, sender: int, receiver: int, sent: int, expected: int) -> DistBackendError:
    ranks = comm.arena.group_ranks
    return DistBackendError(f"{comm.describe()}: group rank {ranks[sender]} sends {sent} elements to group rank "
                            f"{ranks[receiver]}, which expects {expected}; the ranks disagree on tensor sizes")
