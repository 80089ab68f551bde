"""The native engine: picks an algorithm per call and runs it over the world's transport.

Choice (overridable with ``PYDIST_ALGO_<COLLECTIVE>=<name>``, e.g.
``PYDIST_ALGO_ALL_REDUCE=ring``; see docs/algorithms.md):

- all_reduce: recursive doubling up to ``SMALL_ALL_REDUCE_BYTES`` (or fewer elements than
  ranks), the segmented ring above.
- broadcast, reduce: binomial trees; all_gather, reduce_scatter: rings; all_to_all:
  pairwise exchange; gather, scatter: linear; barrier: dissemination.

AVG and PREMUL_SUM run as sums with a step before or after (see _ops).
"""
from __future__ import annotations

import os

import numpy as np

from .._comm import Comm, as_bytes
from .._errors import DistError, GroupAbortedError
from .._ops import ReduceOp, RedOpType, finish, prescale
from ..algorithms import (allgather_ring, allreduce_recursive_doubling, allreduce_ring, alltoall_pairwise,
                          barrier_dissemination, broadcast_binomial, gather_linear, reduce_binomial,
                          reduce_scatter_ring, scatter_linear)
from ..algorithms._segments import DEFAULT_SEGMENT_BYTES
from ..transport._base import MessageKey, Request, Transport
from ._base import Backend, OpContext

SMALL_ALL_REDUCE_BYTES = 64 * 1024

ALGORITHMS = {
    "all_reduce": {"recursive_doubling": allreduce_recursive_doubling.all_reduce,
                   "ring": allreduce_ring.all_reduce},
    "broadcast": {"binomial": broadcast_binomial.broadcast},
    "reduce": {"binomial": reduce_binomial.reduce},
    "all_gather": {"ring": allgather_ring.all_gather},
    "reduce_scatter": {"ring": reduce_scatter_ring.reduce_scatter},
    "all_to_all": {"pairwise": alltoall_pairwise.all_to_all},
    "gather": {"linear": gather_linear.gather},
    "scatter": {"linear": scatter_linear.scatter},
    "barrier": {"dissemination": barrier_dissemination.barrier},
}


def segment_bytes_setting() -> int:
    """Pipeline segment size: PYDIST_SEGMENT_BYTES (a test knob that exercises multi-segment
    paths on small inputs) or the default."""
    text = os.environ.get("PYDIST_SEGMENT_BYTES")
    if not text:
        return DEFAULT_SEGMENT_BYTES
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"PYDIST_SEGMENT_BYTES={text!r}: expected a positive number of bytes")
    return int(text)


def forced_algorithm(collective: str) -> str | None:
    """The algorithm named by PYDIST_ALGO_<COLLECTIVE>, validated; None when unset."""
    name = os.environ.get(f"PYDIST_ALGO_{collective.upper()}")
    if not name:
        return None
    if name not in ALGORITHMS[collective]:
        raise ValueError(f"PYDIST_ALGO_{collective.upper()}={name!r}: expected one of "
                         f"{sorted(ALGORITHMS[collective])}")
    return name


def choose(collective: str, nbytes: int = 0, count: int = 0, size: int = 1) -> str:
    """The algorithm the engine runs for this call."""
    forced = forced_algorithm(collective)
    if forced:
        return forced
    if collective == "all_reduce":
        return "recursive_doubling" if nbytes <= SMALL_ALL_REDUCE_BYTES or count < size else "ring"
    return next(iter(ALGORITHMS[collective]))


class NativeBackend(Backend):
    """pydist's own engine for one group: its ranks, over the world's transport."""

    name = "pydist"

    def __init__(self, transport: Transport, group_id: int, ranks: list[int], rank: int,
                 segment_bytes: int | None = None):
        self.transport = transport
        self.group_id = group_id
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self.segment_bytes = segment_bytes or segment_bytes_setting()

    def _comm(self, ctx: OpContext) -> Comm:
        return Comm(self.transport, self.group_id, self.ranks, self.rank, ctx.seq, ctx.deadline,
                    ctx.name, ctx.timeout_text)

    def _run(self, ctx: OpContext, collective: str, algorithm: str, *args) -> None:
        comm = self._comm(ctx)
        try:
            ALGORITHMS[collective][algorithm](comm, *args)
        except BaseException as error:
            comm.abandon()
            if isinstance(error, DistError) and not isinstance(error, GroupAbortedError):
                self.transport.abort(self.ranks, self.group_id, str(error))
            raise

    def broadcast(self, ctx: OpContext, buf: np.ndarray, root: int) -> None:
        self._run(ctx, "broadcast", choose("broadcast"), buf, root, self.segment_bytes)

    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> None:
        prescale(buf, op)
        algorithm = choose("all_reduce", buf.nbytes, buf.size, self.size)
        self._run(ctx, "all_reduce", algorithm, buf, op, self.segment_bytes)
        finish(buf, op, self.size)

    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> None:
        is_root = self.rank == root
        work = buf if is_root or op.op != RedOpType.PREMUL_SUM else buf.copy()
        prescale(work, op)
        self._run(ctx, "reduce", choose("reduce"), work, root, op, self.segment_bytes)
        if is_root:
            finish(buf, op, self.size)

    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> None:
        self._run(ctx, "all_gather", choose("all_gather"), outputs, input, self.segment_bytes)

    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        self._run(ctx, "gather", choose("gather"), input, outputs, root)

    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
        self._run(ctx, "scatter", choose("scatter"), output, inputs, root)

    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None:
        if op.op == RedOpType.PREMUL_SUM:
            inputs = [block.copy() for block in inputs]
            for block in inputs:
                prescale(block, op)
        self._run(ctx, "reduce_scatter", choose("reduce_scatter"), output, inputs, op, self.segment_bytes)
        finish(output, op, self.size)

    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
        self._run(ctx, "all_to_all", choose("all_to_all"), outputs, inputs)

    def barrier(self, ctx: OpContext) -> None:
        self._run(ctx, "barrier", choose("barrier"))

    def _p2p_key(self, tag: int) -> MessageKey:
        return MessageKey(self.group_id, 0, tag)

    def isend(self, buf: np.ndarray, dst: int, tag: int) -> Request:
        return self.transport.isend(self.ranks[dst], as_bytes(buf), self._p2p_key(tag))

    def irecv(self, buf: np.ndarray, src: int | None, tag: int) -> Request:
        peer = None if src is None else self.ranks[src]
        return self.transport.irecv(peer, as_bytes(buf), self._p2p_key(tag))

    def cancel(self, request: Request) -> None:
        self.transport.cancel(request)

    def peer_host(self, rank: int) -> str:
        return self.transport.peer_host(self.ranks[rank])
