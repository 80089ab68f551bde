"""The native engine: picks an algorithm per call and runs it over the world's transport.

Choice (docs/algorithms.md has the costs; ``PYDIST_ALGO_<COLLECTIVE>=<name>`` forces one,
e.g. ``PYDIST_ALGO_ALL_REDUCE=ring``):

- every rank of the group on this host, with shared memory: the ``shm`` algorithm of each
  collective (through the group's arena);
- ranks on several hosts, some host with more than one of them: ``hierarchical`` all_reduce,
  broadcast, reduce, all_gather and reduce_scatter (shared memory inside hosts, the network
  among one leader per host); otherwise, and for the other collectives, the network
  algorithms below, whose same-host pairs still go through shared-memory rings;
- network algorithms: all_reduce ``recursive_doubling`` up to SMALL_ALL_REDUCE_BYTES (or
  fewer elements than ranks) and the segmented ``ring`` above (``network_all_reduce``, also
  the choice among the hosts' leaders in ``hierarchical``); ``binomial`` trees for
  broadcast and reduce; all_gather ``bruck`` up to SMALL_ALL_GATHER_BYTES of output and
  reduce_scatter ``recursive_doubling`` (an all_reduce of the whole input) up to
  SMALL_ALL_REDUCE_BYTES of input, among more than two ranks, the ``ring`` above
  (``network_by_size``, also among the hosts' leaders); ``pairwise`` all_to_all;
  ``linear`` gather and scatter; ``dissemination`` barrier.

AVG and PREMUL_SUM run as sums with a step before or after (core.ops: prescale, postscale).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algorithms import (
    allgather_bruck,
    allgather_hierarchical,
    allgather_ring,
    allgather_shm,
    allreduce_hierarchical,
    allreduce_rails,
    allreduce_recursive_doubling,
    allreduce_ring,
    allreduce_shm,
    alltoall_pairwise,
    alltoall_shm,
    barrier_dissemination,
    barrier_shm,
    broadcast_binomial,
    broadcast_hierarchical,
    broadcast_rails,
    broadcast_shm,
    gather_linear,
    gather_shm,
    reduce_binomial,
    reduce_hierarchical,
    reduce_scatter_hierarchical,
    reduce_scatter_recursive_doubling,
    reduce_scatter_ring,
    reduce_scatter_shm,
    reduce_shm,
    scatter_linear,
    scatter_shm,
)
from ..algorithms.comm import Comm, Hierarchy, as_bytes
from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import DistBackendError, DistError, OpTimeoutError
from ..core.ops import RedOpType, ReduceOp, postscale, prescale
from ..core.opspec import OpSpec
from ..core.settings import Settings
from ..transport.base import MessageKey, Request
from ..transport.world import WorldTransport
from .base import Engine, GroupHealth, KeptCall, OpContext

#: all_reduce among network peers: recursive doubling (log2(p) rounds, the whole buffer each)
#: up to this size, the pipelined ring (2(p-1) rounds of 1/p of it) above. Recursive doubling
#: wins while rounds cost latency, the ring once bytes dominate (it sends 2(p-1)/p buffers per
#: rank, not log2(p)). Measured with pydist-bench, 4 ranks, PYDIST_SHM=0 (loopback TCP), 2 busy
#: cores, each algorithm forced: recursive doubling was faster up to 1 MiB (512 KiB: 2.5-3.6 ms
#: vs 5.3-8.7 ms), about even at 2 MiB, the ring faster from 4 MiB (12-19 ms vs 24-26 ms). So
#: 64 KiB is conservative on loopback; it stays until the cross-host engine measures real links
#: (veth, 1 Gbit/s), where the ring's smaller byte count matters sooner.
SMALL_ALL_REDUCE_BYTES = 64 * 1024

#: all_gather among network peers: Bruck (log2(p) rounds) up to this much output per rank,
#: the ring (p-1 rounds, pipelined by segment) above. Both send (p-1)/p of the output; Bruck
#: wins while rounds cost latency (many ranks or hosts, small blocks), the ring once segment
#: pipelining over the neighbour link matters. See docs/algorithms.md for the measurement.
SMALL_ALL_GATHER_BYTES = 64 * 1024

#: calls whose algorithm a group's engine remembers (then it forgets them all and starts again)
CHOICES_KEPT = 1024
#: The most seconds a group's creation waits for its shared memory (``prepare``): the members
#: passed a rendezvous just before, so a longer wait means one is stuck.
PREPARE_SECONDS = 30.0

_log = logging.getLogger("pydist")

#: per collective, its algorithms by name (their signatures differ by collective)
ALGORITHMS: dict[str, dict[str, Callable[..., None]]] = {
    "all_reduce": {"shm": allreduce_shm.all_reduce, "hierarchical": allreduce_hierarchical.all_reduce,
                   "rails": allreduce_rails.all_reduce, "recursive_doubling": allreduce_recursive_doubling.all_reduce,
                   "ring": allreduce_ring.all_reduce},
    "broadcast": {"shm": broadcast_shm.broadcast, "hierarchical": broadcast_hierarchical.broadcast,
                  "rails": broadcast_rails.broadcast, "binomial": broadcast_binomial.broadcast},
    "reduce": {"shm": reduce_shm.reduce, "hierarchical": reduce_hierarchical.reduce,
               "binomial": reduce_binomial.reduce},
    "all_gather": {"shm": allgather_shm.all_gather, "hierarchical": allgather_hierarchical.all_gather,
                   "bruck": allgather_bruck.all_gather, "ring": allgather_ring.all_gather},
    "reduce_scatter": {"shm": reduce_scatter_shm.reduce_scatter,
                       "hierarchical": reduce_scatter_hierarchical.reduce_scatter,
                       "recursive_doubling": reduce_scatter_recursive_doubling.reduce_scatter,
                       "ring": reduce_scatter_ring.reduce_scatter},
    "all_to_all": {"shm": alltoall_shm.all_to_all, "pairwise": alltoall_pairwise.all_to_all},
    "gather": {"shm": gather_shm.gather, "linear": gather_linear.gather},
    "scatter": {"shm": scatter_shm.scatter, "linear": scatter_linear.scatter},
    "barrier": {"shm": barrier_shm.barrier, "dissemination": barrier_dissemination.barrier},
}
#: hierarchical algorithms: shared memory inside each host, the network between hosts. The
#: engine picks "hierarchical" (one leader per host); "rails" (every rank carries a slice
#: across hosts) only when forced: on this 2-core machine it used 24 % more CPU and was
#: slower (docs/algorithms.md, "Several ranks per host").
HIERARCHICAL = ("hierarchical", "rails")
NETWORK_DEFAULT = {"broadcast": "binomial", "reduce": "binomial",
                   "all_to_all": "pairwise", "gather": "linear", "scatter": "linear", "barrier": "dissemination"}


def network_all_reduce(nbytes: int, count: int, peers: int) -> str:
    """The all_reduce algorithm among ``peers`` network ranks for a buffer of ``nbytes``
    holding ``count`` elements (fewer elements than peers: the ring has nothing to split)."""
    return "recursive_doubling" if nbytes <= SMALL_ALL_REDUCE_BYTES or count < peers else "ring"


#: all_gather (bytes: its output) and reduce_scatter (its input) among network peers: the
#: latency-bound algorithm up to a size, among more than two peers; the ring above
BY_SIZE = {"all_gather": ("bruck", SMALL_ALL_GATHER_BYTES),
           "reduce_scatter": ("recursive_doubling", SMALL_ALL_REDUCE_BYTES)}


def network_by_size(collective: str, nbytes: int, peers: int) -> str:
    """The algorithm of ``collective`` (one of BY_SIZE) among ``peers`` network ranks for ``nbytes``."""
    small, limit = BY_SIZE[collective]
    return small if nbytes <= limit and peers > 2 else "ring"


#: the host stage of the hierarchical all_gather and reduce_scatter, by the network choice's name
HOST_STAGE: dict[str, dict[str, Callable[..., None]]] = {
    "all_gather": {"bruck": allgather_bruck.bruck_allgather, "ring": allgather_ring.ring_allgather},
    "reduce_scatter": {"recursive_doubling": reduce_scatter_recursive_doubling.doubling_reduce_scatter,
                       "ring": reduce_scatter_ring.ring_reduce_scatter}}


class NativeEngine(Engine):
    """pydist's own engine for one group: its members (``transport_ranks``, in group-rank
    order) over the world's transport; ``rank``: this rank's group rank; ``state``: the
    group's lifecycle (aborts and dead members end arena waits)."""

    name = "pydist"

    def __init__(self, transport: WorldTransport, group_id: int, transport_ranks: list[int], rank: int,
                 state: GroupHealth, settings: Settings, segment_bytes: int | None = None):
        self.transport = transport
        self.group_id = group_id
        self.transport_ranks = transport_ranks
        self.rank = rank
        self.size = len(transport_ranks)
        self.state = state
        self._p2p_keys: dict[int, MessageKey] = {}  # by tag: the point-to-point message keys
        self.segment_bytes = segment_bytes or settings.segment_bytes
        self.forced = settings.forced_algorithms()
        hosts = [transport.host_of(r) for r in transport_ranks]
        self.local = [g for g, host in enumerate(hosts) if host == hosts[rank]]  # group ranks on this host
        self.spans_hosts = len(set(hosts)) > 1
        # every host's group ranks, hosts in the order of their lowest group rank (their leader)
        self.hosts = [[g for g, host in enumerate(hosts) if host == name] for name in dict.fromkeys(hosts)]
        self._layouts: dict[int | None, tuple] = {}  # see _layout
        self._chosen: dict[OpSpec, str] = {}  # the algorithm of each call seen (choose is a pure function of it)
        self._arena = None
        self._arena_tried = False
        self._local_arena = None
        self._shm_comm: Comm | None = None  # see _shm
        self._kept: dict[OpSpec, KeptCall] = {}  # see _keep

    # -- algorithm choice -----------------------------------------------------------------
    def _arena_for(self, ctx: OpContext, group_ranks: list[int]):
        """The arena of ``group_ranks`` (this host's), made on first use; None without one.
        Its waits fail when the group was aborted or one of those members is gone (not any
        member of the group: a rank on another host may leave once it is done)."""
        index = group_ranks.index(self.rank)
        members = [self.transport_ranks[g] for g in group_ranks]
        try:
            arena = self.transport.arena(self.group_id, members, group_ranks, index, ctx.deadline, self._describe,
                                         alive=lambda: self._alive(members))
        except OpTimeoutError as error:  # the member that creates it never came
            creator = min(members)
            raise OpTimeoutError(f"{ctx.name} (seq {ctx.seq}) on rank {self.transport_ranks[self.rank]}: "
                                 f"{ctx.timeout_text} for rank {creator} "
                                 f"({self.transport.peer_host(creator)}) to set up the group's shared memory; "
                                 "that rank has not reached this operation or is stuck") from error
        if arena is not None:
            arena.alive = lambda: self._alive(members)
        return arena

    def arena(self, ctx: OpContext):
        if not self._arena_tried and self.size > 1 and not self.spans_hosts:
            self._arena = self._arena_for(ctx, list(range(self.size)))
        self._arena_tried = True
        return self._arena

    def prepare(self, deadline: Deadline) -> None:
        """Make the group's arena now, or this host's part for a group spanning hosts, and map
        the first page of every slot: the first operation did it (store round trips, the
        segment's creation, page faults: 3.5-4.9 ms of a 4 B all_reduce at 8-16 ranks). Best
        effort: where it fails (a member died meanwhile) the first operation tries again and
        fails as that operation, as before (a shrink then shrinks the new group again). No
        barrier follows: a member that fails it would leave the arena's phases out of step.
        It waits at most PREPARE_SECONDS of ``deadline`` (a member stuck before making it then
        costs init that much, not the group's whole timeout, before the first operation waits
        for it again and names it at its timeout) and logs a warning when it fails."""
        ctx = OpContext("process group setup", 0, _bounded(deadline, PREPARE_SECONDS))
        try:
            if self.size > 1 and not self.spans_hosts:
                arena = self.arena(ctx)
            elif self.spans_hosts and self._local_arena is None and len(self.local) > 1:
                arena = self._local_arena = self._arena_for(ctx, self.local)
            else:
                return
        except DistError as error:
            self._arena_tried = False
            _log.warning("pydist: group %d's shared memory was not set up at init; its first operation "
                         "tries again: %s", self.group_id, error)
            return
        if arena is not None:
            arena.touch()

    def choose(self, collective: str, ctx: OpContext, nbytes: int = 0, count: int = 0) -> str:
        forced = self.forced.get(collective)
        if forced in ("shm",) + HIERARCHICAL and not self._can(forced, ctx):
            raise ValueError(f"PYDIST_ALGO_{collective.upper()}={forced}: not possible for this group "
                             f"(shm needs every rank on one host with shared memory; hierarchical needs several "
                             f"hosts; rails needs several hosts with the same number of ranks, more than one)")
        if forced:
            return forced
        if self.size > 1 and self.arena(ctx) is not None:
            return "shm"
        if ("hierarchical" in ALGORITHMS[collective] and self.spans_hosts and len(self.hosts) < self.size
                and self.transport.shares_arenas):
            return "hierarchical"
        if collective in BY_SIZE:
            return network_by_size(collective, nbytes, self.size)
        if collective != "all_reduce":
            return NETWORK_DEFAULT[collective]
        return network_all_reduce(nbytes, count, self.size)

    def _can(self, algorithm: str, ctx: OpContext) -> bool:
        if algorithm == "shm":
            return self.size == 1 or self.arena(ctx) is not None
        if algorithm == "rails":
            return self.spans_hosts and self._even() and len(self.local) > 1
        return self.spans_hosts

    def _even(self) -> bool:
        """Every host has the same number of the group's ranks."""
        return len({len(ranks) for ranks in self.hosts}) == 1

    # -- running --------------------------------------------------------------------------
    def _describe(self, member: int) -> str:
        world = self.transport_ranks[member]
        return f"rank {world} ({self.transport.peer_host(world)})"

    def _alive(self, members: list[int]) -> None:
        error = self.state.failure(members)
        if error is not None:
            raise error

    def _comm(self, ctx: OpContext, collective: str, algorithm: str, call: int, sizes: tuple[int, int],
              root: int | None) -> Comm:
        if algorithm == "shm":
            return self._shm(ctx, call)
        comm = Comm(self.transport, self.group_id, self.transport_ranks, self.rank, ctx.seq, ctx.deadline, ctx.name,
                    ctx.timeout_text, None, call)
        if algorithm in HIERARCHICAL:
            comm.hierarchy = self._hierarchy(ctx, collective, algorithm, call, sizes, root)
        return comm

    def _shm(self, ctx: OpContext, call: int) -> Comm:
        """The Comm of an operation over the group's arena: one for all, its operation's fields
        set (it never holds receives: the arena carries the data)."""
        comm = self._shm_comm
        if comm is None:
            comm = self._shm_comm = Comm(self.transport, self.group_id, self.transport_ranks, self.rank, 0,
                                         ctx.deadline, ctx.name, arena=self._arena)
        comm.seq, comm.deadline, comm.op_name, comm.timeout_text, comm.call, comm.arena = (
            ctx.seq, ctx.deadline, ctx.name, ctx.timeout_text, call, self._arena)
        return comm

    def close(self) -> None:
        for arena in (self._arena, self._local_arena):
            if arena is not None:
                arena.release()
        self._arena = self._local_arena = self._shm_comm = None
        self._kept.clear()

    def _hierarchy(self, ctx: OpContext, collective: str, algorithm: str, call: int, sizes: tuple[int, int],
                   root: int | None) -> Hierarchy:
        """The stages of a hierarchical ``algorithm`` of ``collective``: this host's Comm (over
        its arena), the leaders' Comm (one rank per host: the lowest, or ``root`` on its host),
        this rank's rail and, for all_reduce, the network algorithm for ``sizes`` (bytes,
        count) among the leaders or along each rail."""
        if self._local_arena is None and len(self.local) > 1:
            self._local_arena = self._arena_for(ctx, self.local)
            if self._local_arena is None:  # forced with shared memory off, or /dev/shm had no room for it
                raise DistBackendError(f"{ctx.name} (seq {ctx.seq}): {algorithm} {collective} needs shared memory "
                                       "between this host's ranks of the group, which they do not have (PYDIST_SHM=0, "
                                       "or /dev/shm had no room: see the warning of this host's lowest rank; docker "
                                       "run --shm-size=...)")
        hosts, host, leader_ranks, rail_ranks = self._layout(root)
        local = Comm(self.transport, self.group_id, self.transport_ranks, self.rank, ctx.seq, ctx.deadline, ctx.name,
                     ctx.timeout_text, self._local_arena, call)
        leaders = None
        if self.rank == hosts[host][0]:
            leaders = Comm(self.transport, self.group_id, leader_ranks, host, ctx.seq, ctx.deadline, ctx.name,
                           ctx.timeout_text, call=call)
        rail = None
        if algorithm == "rails" and rail_ranks is not None:
            rail = Comm(self.transport, self.group_id, rail_ranks, host, ctx.seq, ctx.deadline, ctx.name,
                        ctx.timeout_text, call=call)
        inter = None
        if collective == "all_reduce":
            nbytes, count = sizes
            per_rail = len(self.local) if algorithm == "rails" else 1
            inter = ALGORITHMS["all_reduce"][network_all_reduce(nbytes // per_rail, count // per_rail, len(hosts))]
        elif collective in BY_SIZE:
            inter = HOST_STAGE[collective][network_by_size(collective, sizes[0], len(hosts))]
        return Hierarchy(local, leaders, hosts, host, rail, inter)

    def _layout(self, root: int | None) -> tuple[list[list[int]], int, list[int], list[int] | None]:
        """For a hierarchy rooted at group rank ``root`` (None: unrooted), made once per root:
        every host's group ranks with its leader first (the root leads its own host), this
        rank's host, the leaders' world ranks, and this rank's rail in world ranks (None
        unless every host has as many ranks)."""
        layout = self._layouts.get(root)
        if layout is None:
            hosts = [[root] + [g for g in ranks if g != root] if root in ranks else ranks for ranks in self.hosts]
            host = next(h for h, ranks in enumerate(hosts) if self.rank in ranks)
            place = self.hosts[host].index(self.rank)
            rail = [self.transport_ranks[ranks[place]] for ranks in self.hosts] if self._even() else None
            layout = self._layouts[root] = (hosts, host, [self.transport_ranks[ranks[0]] for ranks in hosts], rail)
        return layout

    def _run(self, ctx: OpContext, collective: str, *args, sizes: tuple[int, int] = (0, 0),
             root: int | None = None) -> str:
        """Run ``collective`` (rooted at group rank ``root``, if any) with the algorithm chosen
        for ``sizes`` (bytes, count) and return its name. The call's fingerprint
        (``ctx.spec.call``) goes with every message and arena sync, so that ranks in different
        calls fail (DesyncError) instead of hanging. On failure the receives still posted
        are withdrawn and the error raised as it is (the group layer handles it)."""
        spec = ctx.spec
        remembered = spec.kind == collective  # a context whose spec describes another call: not cached
        algorithm = self._chosen.get(spec) if remembered else None
        if algorithm is None:
            algorithm = self.choose(collective, ctx, *sizes)
            if remembered:
                if len(self._chosen) >= CHOICES_KEPT:
                    self._chosen.clear()
                self._chosen[spec] = algorithm
        comm = self._comm(ctx, collective, algorithm, spec.call, sizes, root)
        engaged = algorithm != "shm" and self.transport.engage(sizes[0] or _payload_bytes(args))
        try:
            ALGORITHMS[collective][algorithm](comm, *args)
        except BaseException:
            comm.abandon()
            raise
        finally:
            if engaged:
                self.transport.disengage()
        return algorithm

    def broadcast(self, ctx: OpContext, buf: np.ndarray, root: int) -> str:
        spec = ctx.spec
        kept = self._kept.get(spec)
        if kept is not None:
            return kept(ctx.seq, ctx.deadline, ctx.timeout_text, buf)
        algorithm = self._run(ctx, "broadcast", buf, root, self.segment_bytes, root=root)
        if algorithm == "shm" and spec.kind == "broadcast":
            path = broadcast_shm.latency_path(self._arena, buf.dtype, buf.size, root)
            if path is not None:
                self._keep(spec, path)
        return algorithm

    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> str:
        spec = ctx.spec
        kept = self._kept.get(spec)
        if kept is not None:  # a small call over the arena run before
            return kept(ctx.seq, ctx.deadline, ctx.timeout_text, buf, op)
        scaled = op.op is not RedOpType.SUM  # the common case: nothing to scale before or after
        if scaled:
            prescale(buf, op)
        algorithm = self._run(ctx, "all_reduce", buf, op, self.segment_bytes, sizes=(buf.nbytes, buf.size))
        if scaled:
            postscale(buf, op, self.size)
        if algorithm == "shm" and spec.kind == "all_reduce":
            self._keep_all_reduce(spec, buf, op)
        return algorithm

    def kept(self, spec: OpSpec) -> KeptCall | None:
        return self._kept.get(spec)

    def _keep_all_reduce(self, spec: OpSpec, buf: np.ndarray, op: ReduceOp) -> None:
        """Keep the all_reduce ``spec`` describes where it takes the arena's latency path
        (allreduce_shm.latency_path), with the op's scaling around it (PREMUL_SUM's factor
        is each call's)."""
        path = allreduce_shm.latency_path(self._arena, buf.dtype, buf.size, op)
        if path is None:
            return
        if spec.reduce_op is RedOpType.SUM:  # nothing to scale: the path itself (it ignores the op)
            self._keep(spec, path)
            return
        size = self.size

        def scaled(comm: Comm, array: np.ndarray, this_op: ReduceOp) -> None:
            prescale(array, this_op)
            path(comm, array)
            postscale(array, this_op, size)
        self._keep(spec, scaled)

    def _keep(self, spec: OpSpec, path: Callable[..., None]) -> None:
        """Keep ``path(comm, *args)``, an algorithm's bound path over the arena, as the
        KeptCall of ``spec``: its next calls skip the algorithm choice, the OpContext and the
        Comm's set-up, and a blocking one the group's general path (ProcessGroup.run_kept):
        ~2.5 us of a 4 B all_reduce's ~6.5 us of Python (issue 40). Bounded as the choices
        are; dropped by close."""
        comm = self._shm_comm
        assert comm is not None  # the call just ran over the arena
        name, call = spec.name, spec.call

        def kept(seq: int, deadline: Deadline, timeout_text: str, *args: Any) -> str:
            comm.seq, comm.deadline, comm.op_name, comm.timeout_text, comm.call = (
                seq, deadline, name, timeout_text, call)
            path(comm, *args)
            return "shm"
        if len(self._kept) >= CHOICES_KEPT:
            self._kept.clear()
        self._kept[spec] = kept

    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> str:
        is_root = self.rank == root
        work = buf if is_root or op.op != RedOpType.PREMUL_SUM else buf.copy()
        prescale(work, op)
        algorithm = self._run(ctx, "reduce", work, root, op, self.segment_bytes, root=root)
        if is_root:
            postscale(buf, op, self.size)
        return algorithm

    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> str:
        nbytes = sum(out.nbytes for out in outputs)
        return self._run(ctx, "all_gather", outputs, input, self.segment_bytes, sizes=(nbytes, 0))

    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> str:
        return self._run(ctx, "gather", input, outputs, root)

    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> str:
        return self._run(ctx, "scatter", output, inputs, root)

    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> str:
        if op.op == RedOpType.PREMUL_SUM:
            inputs = [block.copy() for block in inputs]
            for block in inputs:
                prescale(block, op)
        nbytes = sum(block.nbytes for block in inputs)
        algorithm = self._run(ctx, "reduce_scatter", output, inputs, op, self.segment_bytes, sizes=(nbytes, 0))
        postscale(output, op, self.size)
        return algorithm

    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> str:
        return self._run(ctx, "all_to_all", outputs, inputs)

    def barrier(self, ctx: OpContext) -> str:
        spec = ctx.spec
        kept = self._kept.get(spec)
        if kept is not None:
            return kept(ctx.seq, ctx.deadline, ctx.timeout_text)
        algorithm = self._run(ctx, "barrier")
        if algorithm == "shm" and spec.kind == "barrier":
            self._keep(spec, ALGORITHMS["barrier"]["shm"])  # (one arena sync: nothing to bind)
        return algorithm

    def _p2p_key(self, tag: int) -> MessageKey:
        key = self._p2p_keys.get(tag)
        if key is None:
            if len(self._p2p_keys) >= 1024:  # tags in use are few; a program cycling through many is bounded
                self._p2p_keys.clear()
            key = self._p2p_keys[tag] = MessageKey(self.group_id, 0, tag)
        return key

    def isend(self, buf: np.ndarray, dst: int, tag: int) -> Request:
        return self.transport.isend(self.transport_ranks[dst], as_bytes(buf), self._p2p_key(tag))

    def irecv(self, buf: np.ndarray, src: int | None, tag: int) -> Request:
        peer = None if src is None else self.transport_ranks[src]
        return self.transport.irecv(peer, as_bytes(buf), self._p2p_key(tag))

    def cancel(self, request: Request) -> None:
        self.transport.cancel(request)

    def evicted(self) -> BaseException | None:
        return self.state.evicted()

    def abort_peers(self, error: BaseException) -> None:
        """ABORT frames to every member: their operations of this group fail with ``error``'s
        account (a dead peer named as such), not with "rank N shut down" later."""
        self.transport.abort(self.transport_ranks, self.group_id, error, sorted(self.state.dead))

    def peer_host(self, rank: int) -> str:
        return self.transport.peer_host(self.transport_ranks[rank])


def _payload_bytes(args: tuple) -> int:
    """Bytes of the arrays among an algorithm's arguments (lists of arrays included)."""
    total = 0
    for arg in args:
        if isinstance(arg, np.ndarray):
            total += arg.nbytes
        elif isinstance(arg, list):
            total += sum(item.nbytes for item in arg if isinstance(item, np.ndarray))
    return total


def _bounded(deadline: Deadline, seconds: float) -> Deadline:
    """``deadline``, or ``seconds`` from now if that comes first."""
    soon = _deadline.now() + seconds
    return Deadline(soon if deadline.at is None else min(deadline.at, soon))
