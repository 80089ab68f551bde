"""The MPI engine: every operation of a group mapped onto MPI through mpi4py.

``init_process_group("mpi")`` under mpiexec/srun takes rank and world size from
MPI.COMM_WORLD and needs no store (an ``init_method`` or ``store`` is ignored, as by torch's
MPI backend: the MPI launcher already did the rendezvous). Each group has a communicator of
its own (MPI_Comm_create_group over its members, see _mpi_world); operations run in issue
order on it (the group's OpQueue), so every rank issues them in the same order, as MPI needs.

- Collectives are MPI's non-blocking ones (Ibcast, Iallreduce with MPI_IN_PLACE, Ireduce,
  Iallgather(v), Igatherv, Iscatterv, Ireduce_scatter_block, Ialltoall(v), Ibarrier) on the
  user's memory: no copy for contiguous buffers, nor for lists of tensors that lie back to
  back (``all_gather_into_tensor``, ``all_to_all_single``); other lists go through one
  staging buffer. Reductions: see _mpi_buffers (AVG = SUM then divide, integers truncated
  toward zero; PREMUL_SUM = scale, then SUM; bfloat16 in float32 by pydist's buffer layer).
- Point-to-point: Isend/Irecv of bytes with the user's tag (0..MPI_TAG_UB-256; negative
  tags, such as monitored_barrier's, use the 256 top tags); ``src=None`` is MPI_ANY_SOURCE
  and reports the sender.
- Timeouts: MPI's blocking calls cannot time out, so the engine polls the non-blocking
  request with the operation's deadline (see _mpi_requests). An expired collective raises
  DistBackendError naming the operation, its sequence number and this rank; MPI can tell
  neither which rank is missing nor cancel a collective, so the group is broken afterwards
  (later calls fail at once). Creating a communicator cannot time out.
- MPI errors (e.g. a receive buffer too small: MPI_ERR_TRUNCATE) raise DistBackendError
  naming this rank, with MPI's message. There is no desync check (the native engine's call
  fingerprints): ranks calling different operations get MPI's behaviour (an error or a hang
  until the timeout).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import errors as _errors
from ..core.ops import RedOpType, ReduceOp, postscale, prescale
from ._mpi_buffers import address, as_bytes, byte_spec, counts_and_displacements, mpi_op, span, typed_spec
from ._mpi_requests import ABANDONED, POLLER, MpiRequest, mpi_error, poll_until, spin_seconds
from ._mpi_world import load_mpi, mpi_world, rank_and_size
from .base import Engine, OpContext

__all__ = ["MPIEngine", "check_group_rank", "group_engine", "rank_and_size"]

#: the error of an expired operation (OpTimeoutError where pydist has it: the group appends
#: the ranks behind when it knows them)
_TIMEOUT_ERROR = getattr(_errors, "OpTimeoutError", _errors.DistBackendError)
RESERVED_TAGS = 256  # MPI's top tags, for negative pydist tags


def _native(buf: np.ndarray) -> np.ndarray:
    """``buf``, or a native-byte-order copy of it (MPI reduces native numbers only)."""
    return buf if buf.dtype.isnative else buf.astype(buf.dtype.newbyteorder("="))


def _flat_or_staged(arrays: list[np.ndarray]) -> tuple[np.ndarray, bool]:
    """The bytes of ``arrays`` back to back: a view when they already are, else a new
    buffer (True: staged; inputs are copied in by the caller)."""
    flat = span(arrays)
    if flat is not None:
        return as_bytes(flat), False
    return np.empty(sum(a.nbytes for a in arrays), np.uint8), True


def _copy_out(staging: np.ndarray, arrays: list[np.ndarray]) -> None:
    offset = 0
    for array in arrays:
        as_bytes(array)[:] = staging[offset:offset + array.nbytes]
        offset += array.nbytes


def _pack(arrays: list[np.ndarray]) -> np.ndarray:
    flat, staged = _flat_or_staged(arrays)
    if staged:
        offset = 0
        for array in arrays:
            flat[offset:offset + array.nbytes] = as_bytes(array)
            offset += array.nbytes
    return flat


class MPIEngine(Engine):
    """One group's MPI communicator; ``labels[g]`` is how group rank g is reported (its
    global rank) in errors and as the source of a receive."""

    name = "mpi"

    def __init__(self, comm, labels: list[int], hosts: list[str]):
        self.mpi = load_mpi()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.labels = labels
        self.hosts = hosts
        self.tag_ub = mpi_world().tag_ub
        POLLER.acquire()

    # -- running --------------------------------------------------------------------------
    def _describe(self, ctx: OpContext) -> str:
        return f"{ctx.name} (seq {ctx.seq}) on rank {self.labels[self.rank]}"

    def _error(self, ctx: OpContext, error: BaseException) -> _errors.DistBackendError:
        return mpi_error(f"{ctx.name} (seq {ctx.seq})", self.labels[self.rank], error)

    def _run(self, ctx: OpContext, start: Callable[[], Any], nbytes: int, *keep: object) -> None:
        """Start one non-blocking MPI operation and poll it until done or the deadline."""
        mpi = self.mpi
        try:
            request = start()
            done = poll_until(request.Test, ctx.deadline.at, spin_seconds(nbytes))
        except mpi.Exception as error:
            raise self._error(ctx, error) from error
        if not done:
            ABANDONED.append((request, keep))
            raise _TIMEOUT_ERROR(
                f"{self._describe(ctx)}: {ctx.timeout_text}: a rank of the group (ranks {self.labels}) "
                "has not reached this operation or is stuck (MPI cannot tell which, nor cancel a collective: "
                "the group is unusable from now on)")

    # -- collectives ----------------------------------------------------------------------
    def broadcast(self, ctx: OpContext, buf: np.ndarray, root: int) -> None:
        self._run(ctx, lambda: self.comm.Ibcast(byte_spec(buf), root), buf.nbytes, buf)

    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> None:
        work = _native(buf)
        prescale(work, op)
        in_place = self.mpi.IN_PLACE
        self._run(ctx, lambda: self.comm.Iallreduce(in_place, typed_spec(work), mpi_op(op, work.dtype)),
                  work.nbytes, work)
        postscale(work, op, self.size)
        if work is not buf:
            buf[...] = work

    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> None:
        is_root = self.rank == root
        work = _native(buf)
        if not is_root and work is buf and op.op == RedOpType.PREMUL_SUM:
            work = buf.copy()  # a non-root's tensor stays as it was
        prescale(work, op)
        spec, mop = typed_spec(work), mpi_op(op, work.dtype)
        if is_root:
            self._run(ctx, lambda: self.comm.Ireduce(self.mpi.IN_PLACE, spec, mop, root), work.nbytes, work)
            postscale(work, op, self.size)
            if work is not buf:
                buf[...] = work
        else:
            self._run(ctx, lambda: self.comm.Ireduce(spec, None, mop, root), work.nbytes, work)

    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> None:
        target, staged = _flat_or_staged(outputs)
        mine = outputs[self.rank]
        aliased = mine.size and address(mine) == address(input) and mine.nbytes == input.nbytes and not staged
        send = self.mpi.IN_PLACE if aliased else byte_spec(input)
        counts, displacements = counts_and_displacements(outputs)
        if len(set(counts)) == 1:
            start = lambda: self.comm.Iallgather(send, [target, self.mpi.BYTE])  # noqa: E731
        else:
            start = lambda: self.comm.Iallgatherv(send, [target, counts, displacements, self.mpi.BYTE])  # noqa: E731
        self._run(ctx, start, target.nbytes, target, input)
        if staged:
            _copy_out(target, outputs)

    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        if outputs is None:
            self._run(ctx, lambda: self.comm.Igatherv(byte_spec(input), None, root), input.nbytes, input)
            return
        target, staged = _flat_or_staged(outputs)
        counts, displacements = counts_and_displacements(outputs)
        self._run(ctx, lambda: self.comm.Igatherv(byte_spec(input), [target, counts, displacements, self.mpi.BYTE],
                                                  root), target.nbytes, target, input)
        if staged:
            _copy_out(target, outputs)

    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
        if inputs is None:
            self._run(ctx, lambda: self.comm.Iscatterv(None, byte_spec(output), root), output.nbytes, output)
            return
        source = _pack(inputs)
        counts, displacements = counts_and_displacements(inputs)
        self._run(ctx, lambda: self.comm.Iscatterv([source, counts, displacements, self.mpi.BYTE], byte_spec(output),
                                                   root), source.nbytes, source, output)

    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None:
        flat = span(inputs)
        if flat is None or op.op == RedOpType.PREMUL_SUM or not flat.dtype.isnative:
            flat = np.concatenate([_native(block) for block in inputs])  # a copy: inputs stay unchanged
        prescale(flat, op)
        work = _native(output)
        mop = mpi_op(op, work.dtype)
        self._run(ctx, lambda: self.comm.Ireduce_scatter_block(typed_spec(flat), typed_spec(work), mop),
                  flat.nbytes, flat, work)
        postscale(work, op, self.size)
        if work is not output:
            output[...] = work

    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
        source = _pack(inputs)
        target, staged = _flat_or_staged(outputs)
        send_counts, send_displacements = counts_and_displacements(inputs)
        recv_counts, recv_displacements = counts_and_displacements(outputs)
        byte = self.mpi.BYTE
        if len(set(send_counts + recv_counts)) == 1:
            start = lambda: self.comm.Ialltoall([source, byte], [target, byte])  # noqa: E731
        else:
            start = lambda: self.comm.Ialltoallv([source, send_counts, send_displacements, byte],  # noqa: E731
                                                 [target, recv_counts, recv_displacements, byte])
        self._run(ctx, start, source.nbytes + target.nbytes, source, target)
        if staged:
            _copy_out(target, outputs)

    def barrier(self, ctx: OpContext) -> None:
        self._run(ctx, self.comm.Ibarrier, 0)

    # -- point-to-point -------------------------------------------------------------------
    def _tag(self, tag: int) -> int:
        """The MPI tag of a pydist tag: 0..MPI_TAG_UB-RESERVED_TAGS as is; negative ones (pydist's
        own, e.g. monitored_barrier's) into the RESERVED_TAGS top tags; ValueError otherwise."""
        if tag < 0:
            return self.tag_ub - (-tag) % RESERVED_TAGS
        if tag > self.tag_ub - RESERVED_TAGS:
            raise ValueError(f"tag: {tag} is beyond MPI's tag range [0, {self.tag_ub - RESERVED_TAGS}] "
                             f"(MPI_TAG_UB, less {RESERVED_TAGS} tags kept for negative tags)")
        return tag

    def _post(self, start: Callable[[], object], buf: np.ndarray, peer: int | None, receive: bool) -> MpiRequest:
        me = self.labels[self.rank]
        try:
            request = start()
        except self.mpi.Exception as error:
            raise mpi_error("", me, error) from error
        label = None if peer is None else self.labels[peer]
        return MpiRequest(label, as_bytes(buf).data, request, self.labels, me, receive, keep=buf)

    def isend(self, buf: np.ndarray, dst: int, tag: int) -> MpiRequest:
        tag = self._tag(tag)
        return self._post(lambda: self.comm.Isend(byte_spec(buf), dst, tag), buf, dst, receive=False)

    def irecv(self, buf: np.ndarray, src: int | None, tag: int) -> MpiRequest:
        tag = self._tag(tag)
        source = self.mpi.ANY_SOURCE if src is None else src
        return self._post(lambda: self.comm.Irecv(byte_spec(buf), source, tag), buf, src, receive=True)

    def cancel(self, request) -> None:
        request.cancel()

    def peer_host(self, rank: int) -> str:
        return self.hosts[rank]

    def close(self) -> None:
        """Free the communicator (operations still pending complete normally) and stop using
        the poller."""
        if self.comm is None:
            return
        comm, self.comm = self.comm, None
        try:
            comm.Free()
        except self.mpi.Exception:
            pass
        POLLER.release()


def group_engine(ranks: list[int], labels: list[int] | None = None) -> MPIEngine:
    """The engine of a group of MPI world ranks ``ranks`` (called by its members only);
    ``labels`` name its ranks in messages (default: their world ranks)."""
    world = mpi_world()
    comm = world.communicator(ranks)
    return MPIEngine(comm, list(ranks) if labels is None else labels, [world.hosts[r] for r in ranks])


def check_group_rank(global_ranks: list[int] | None, rank: int, size: int) -> list[int]:
    """The MPI world ranks of a group outside pydist's global state (the torch plugin's, one
    per torch group) whose group rank here is ``rank`` of ``size``: ``global_ranks`` (None or
    empty: the MPI world, whose rank and size must then be ``rank`` and ``size``); ValueError
    naming both when this process is not that rank."""
    if not global_ranks:
        rank_and_size(rank, size)
        global_ranks = list(range(size))
    me = mpi_world().rank
    if len(global_ranks) != size or not 0 <= rank < size or global_ranks[rank] != me:
        raise ValueError(f"rank: group rank {rank} of the ranks {global_ranks} is not this process, MPI rank {me} "
                         "(the MPI backend needs torch's ranks to be MPI's: launch with mpiexec, init_method='mpi://')")
    return list(global_ranks)
