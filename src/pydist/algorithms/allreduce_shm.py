"""Same-host all_reduce through the group's shared-memory arena.

Per chunk of ``slot_bytes``: every rank copies its part into its slot, a barrier, then
- 2 ranks (or small chunks): each rank reduces every slot straight into its own buffer
  (one barrier per chunk; reads n chunks, writes one);
- more ranks: each reduces its 1/n slice of all slots into the shared slot, a barrier,
  then each copies the whole result out (two barriers; the reduction work is split).
Chunks alternate between two parities, so one rank can copy the next chunk in while
another still reduces or copies out the previous one. Results are bitwise identical on
every rank (same inputs, same order). The engine picks it for every all_reduce of a group
of several ranks that all share this host's memory.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.ops import ReduceOp, reduce_many, reduce_rows, ufunc_of
from ._partition import block_bounds, chunks
from .comm import Comm

#: chunks smaller than this are reduced whole by every rank (latency beats splitting).
#: Measured with pydist-bench, 4 ranks on 2 busy cores, this value set to 16/64/256 KiB: not
#: splitting was faster at 16-32 KiB (374-422 us vs 417-635 us), splitting at 256 KiB and up
#: (698-710 us vs 933-951 us); 64-128 KiB was within the noise. docs/algorithms.md.
SPLIT_MIN_BYTES = 64 * 1024


def all_reduce(comm: Comm, buf: np.ndarray, op: ReduceOp, segment_bytes: int = 0) -> None:
    """Reduce ``buf`` over the group, in place on every rank."""
    reduce_chunks(comm, buf, op, comm.call, deliver=True)


def latency_path(arena, dtype: np.dtype, count: int, op: ReduceOp) -> Callable[[Comm, np.ndarray], None] | None:
    """The all_reduce of ``count`` elements of ``dtype`` under ``op`` where it is one chunk
    that every rank reduces whole, bound to ``arena``: ``run(comm, buf, this_op=None)``
    copies ``buf`` into this rank's slot, syncs once and reduces every slot into ``buf`` (the
    steps and bits of ``all_reduce`` for such a call), with the slot views and the ufunc
    looked up here, once (the engine keeps it per call spec and calls it directly;
    ``this_op``, the call's ReduceOp, is not needed). None for calls that take several
    chunks or split the reduction."""
    nbytes = count * dtype.itemsize
    if nbytes > arena.slot_bytes or not _alone(arena.size, nbytes):
        return None
    return _bind(arena, dtype, count, op)


def _bind(arena, dtype: np.dtype, count: int, op: ReduceOp) -> Callable[[Comm, np.ndarray], None]:
    slots = [arena.slots(parity, dtype, count) for parity in (0, 1)]
    mine = arena.rank
    if arena.size == 2:  # one ufunc call on the two parts (reduce_many's order)
        ufunc = ufunc_of(op.op)

        def run(comm: Comm, buf: np.ndarray, this_op: ReduceOp | None = None) -> None:
            parts = slots[arena.next_parity()]
            parts[mine][...] = buf
            arena.sync(comm, comm.call)
            ufunc(parts[0], parts[1], out=buf)
        return run
    rows = [arena.rows(parity, dtype, count) for parity in (0, 1)]

    def run_rows(comm: Comm, buf: np.ndarray, this_op: ReduceOp | None = None) -> None:
        parity = arena.next_parity()
        slots[parity][mine][...] = buf
        arena.sync(comm, comm.call)
        reduce_rows(rows[parity], buf, op)
    return run_rows


def reduce_chunks(comm: Comm, buf: np.ndarray, op: ReduceOp, call: int, deliver: bool, sole: bool = False) -> None:
    """Reduce every member's ``buf`` chunk by chunk; the result replaces ``buf`` where
    ``deliver`` (every rank for all_reduce, the root for reduce). ``sole``: only this rank
    delivers (reduce's root); where it reduces a chunk alone and its part comes first or
    second in the order, that part is read in place instead of being copied to its slot."""
    arena = comm.arena
    for a, b in chunks(buf.size, arena.slot_bytes // buf.itemsize):
        parity = arena.next_parity()
        slots = arena.slots(parity, buf.dtype, b - a)
        in_place = sole and arena.rank < 2 and _alone(arena.size, (b - a) * buf.itemsize)
        if in_place:
            slots = slots[:arena.rank] + [buf[a:b]] + slots[arena.rank + 1:]  # (the arena caches its list)
            # reduce_many reads this part before it writes the result over it
        else:
            slots[arena.rank][...] = buf[a:b]
        arena.sync(comm, call)
        call = 0
        reduce_chunk(comm, parity, slots, buf[a:b], op, deliver, in_place)


def reduce_chunk(comm: Comm, parity: int, slots: list[np.ndarray], out: np.ndarray, op: ReduceOp,
                 deliver: bool, in_place: bool = False) -> None:
    """Reduce every member's ``slots`` (of ``parity``, after the sync that follows copying
    in); write the result into ``out`` when ``deliver``. ``in_place``: this rank's part in
    ``slots`` is its own buffer, not its slot."""
    arena = comm.arena
    n, length = arena.size, out.size
    if _alone(n, length * out.itemsize):
        if deliver:
            reduce_all(arena, parity, slots, out, op, in_place)
        return
    lo, hi = block_bounds(length, n)[arena.rank]
    result = arena.shared(parity, out.dtype)
    reduce_rows(arena.rows(parity, out.dtype, length)[:, lo:hi], result[lo:hi], op)
    arena.sync(comm)
    if deliver:
        out[...] = result[:length]


def reduce_all(arena, parity: int, slots: list[np.ndarray], out: np.ndarray, op: ReduceOp,
               in_place: bool = False) -> None:
    """``out`` = every member's part (``slots``, of ``parity``) reduced in member order: two
    by one ufunc call on them (cheaper than a ufunc's reduce), more as the rows of the
    arena's view (one call, not one per member), unless a part is not in its slot
    (``in_place``)."""
    if arena.size <= 2 or in_place:
        reduce_many(slots, out, op)
    else:
        reduce_rows(arena.rows(parity, out.dtype, out.size), out, op)


def _alone(ranks: int, nbytes: int) -> bool:
    """A chunk of ``nbytes`` over ``ranks`` is reduced whole by each rank that delivers it."""
    return ranks <= 2 or nbytes < SPLIT_MIN_BYTES
