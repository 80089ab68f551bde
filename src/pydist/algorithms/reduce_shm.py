"""Same-host reduce through the group's shared-memory arena.

Per chunk: every rank copies its part into its slot, a barrier; then with 2 ranks (or
small chunks) the root reduces every slot into its buffer, otherwise each rank reduces its
1/n slice into the shared slot, a barrier, and the root copies the result out. Non-root
inputs are never modified. The engine picks it for every reduce of a group of several
ranks that all share this host's memory; the hierarchical all_reduce uses it inside each
host.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from .allreduce_shm import reduce_chunks
from .comm import Comm


def reduce(comm: Comm, buf: np.ndarray, root: int, op: ReduceOp, segment_bytes: int = 0) -> None:
    """Reduce every rank's ``buf`` into ``buf`` of ``root``."""
    is_root = comm.arena.rank == comm.arena.group_ranks.index(root)
    reduce_chunks(comm, buf, op, comm.call, is_root, sole=is_root)
