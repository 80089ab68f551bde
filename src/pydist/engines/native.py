"""The native engine: runs a group's calls over the world's transport by a plan per call.

A call's plan (``Plan``) is made at its first run, from its OpSpec: the algorithm the policy
picks for this group (``choice``) and, for a small all_reduce, broadcast or barrier over the
group's arena, that algorithm's latency path bound to the arena once (the slot views and
the ufunc looked up, the Comm made: ``allreduce_shm.latency_path``,
``broadcast_shm.latency_path``). Plans are the engine's one cache, by spec, bounded
(PLANS_KEPT) and dropped by ``close``; every collective method consults it first, so a
call repeated on the same shape costs a look-up and its bound path.

AVG and PREMUL_SUM run as sums with a step before or after (core.ops: prescale, postscale).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..algorithms import allreduce_shm, broadcast_shm
from ..algorithms.comm import Comm, Hierarchy, as_bytes
from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import DistBackendError, DistError, OpTimeoutError
from ..core.ops import RedOpType, ReduceOp, postscale, prescale
from ..core.opspec import OpSpec
from ..core.settings import Settings
from ..transport.base import MessageKey, Request
from ..transport.world import WorldTransport
from .base import Engine, GroupHealth, OpContext
from .choice import ALGORITHMS, BY_SIZE, HIERARCHICAL, HOST_STAGE, Shape, choose, network_all_reduce, network_by_size

#: call specs whose plan a group's engine keeps (then it forgets them all and starts again)
PLANS_KEPT = 1024
#: The most seconds a group's creation waits for its shared memory (``prepare``): the members
#: passed a rendezvous just before, so a longer wait means one is stuck.
PREPARE_SECONDS = 30.0

_log = logging.getLogger("pydist")


class Plan(NamedTuple):
    """How the engine runs the calls of one spec: the ``algorithm`` chosen and, where it
    has one, its ``bound`` path (``bound(ctx, *args)``: the call with no choice, no Comm
    set-up and no dispatch), else None (the general path, ``NativeEngine._run``)."""
    algorithm: str
    bound: Callable[..., None] | None = None


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
        # every host's group ranks, hosts in the order of their lowest group rank (their leader)
        self.shape = Shape(self.size, [[g for g, host in enumerate(hosts) if host == name]
                                       for name in dict.fromkeys(hosts)],
                           [g for g, host in enumerate(hosts) if host == hosts[rank]], transport.shares_arenas)
        self.hosts, self.local, self.spans_hosts = self.shape.hosts, self.shape.local, self.shape.spans_hosts
        self._layouts: dict[int | None, tuple] = {}  # see _layout
        self._plans: dict[OpSpec, Plan] = {}  # see _plan
        self._arena = None
        self._arena_tried = False
        self._local_arena = None
        self._shm_comm: Comm | None = None  # see _shm

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

    def host_arena(self, ctx: OpContext):
        """The arena of this host's ranks of a group spanning hosts, made on first use; None
        when this rank is alone on its host or they have no shared memory."""
        if self._local_arena is None and len(self.local) > 1:
            self._local_arena = self._arena_for(ctx, self.local)
        return self._local_arena

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
            elif self.spans_hosts and len(self.local) > 1:
                arena = self.host_arena(ctx)
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
        """The algorithm of ``collective`` for a call of ``nbytes`` (``count`` elements): the
        policy's (choice.choose) for this group, its arena made now if it has none yet."""
        return choose(collective, self.shape, self.forced.get(collective), lambda: self.arena(ctx) is not None,
                      nbytes, count)

    def _plan(self, ctx: OpContext, collective: str, nbytes: int = 0, count: int = 0) -> Plan:
        """The plan of the call ``ctx.spec`` describes, made and kept now: the algorithm for
        ``nbytes`` (``count`` elements); its path is bound after the first run (``_bind``).
        A context whose spec describes another call (not ``collective``) gets a plan that is
        not kept."""
        plan = Plan(self.choose(collective, ctx, nbytes, count))
        if ctx.spec.kind == collective:
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[ctx.spec] = plan
        return plan

    def _bind(self, ctx: OpContext, plan: Plan, collective: str, buf: np.ndarray | None = None,
              root: int = 0) -> None:
        """After a call of ``plan`` ran its general path over the arena: make the plan's
        bound path where the call has a latency path (one chunk: allreduce_shm.latency_path,
        broadcast_shm.latency_path; a barrier is one arena sync), called as ``bound(ctx,
        *args)`` with the arguments the engine's method has (``root``: a broadcast's). So the first call of each shape
        runs the algorithm's own function (the ALGORITHMS table's), the next ones its bound
        path: the same steps and bits."""
        spec, arena = ctx.spec, self._arena
        if plan.algorithm != "shm" or arena is None or self._plans.get(spec) is not plan:
            return
        path: Callable[..., None] | None = None
        if collective == "barrier":
            path = ALGORITHMS["barrier"]["shm"]
        elif collective == "broadcast" and buf is not None:
            path = broadcast_shm.latency_path(arena, buf.dtype, buf.size, root)
        elif collective == "all_reduce" and buf is not None and spec.reduce_op is not None:
            path = allreduce_shm.latency_path(arena, buf.dtype, buf.size, ReduceOp(spec.reduce_op))
            if path is not None and spec.reduce_op is not RedOpType.SUM:
                path = _scaled(path, self.size)
        if path is None:
            return
        comm = self._shm(ctx, spec.call)
        name, call, run = spec.name, spec.call, path

        def bound(ctx: OpContext, *args: object) -> None:
            comm.seq, comm.deadline, comm.op_name, comm.timeout_text, comm.call = (
                ctx.seq, ctx.deadline, name, ctx.timeout_text, call)
            run(comm, *args)
        self._plans[spec] = Plan(plan.algorithm, bound)

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
        self._plans.clear()  # (their bound paths hold views into the arena)
        for arena in (self._arena, self._local_arena):
            if arena is not None:
                arena.release()
        self._arena = self._local_arena = self._shm_comm = None

    def _hierarchy(self, ctx: OpContext, collective: str, algorithm: str, call: int, sizes: tuple[int, int],
                   root: int | None) -> Hierarchy:
        """The stages of a hierarchical ``algorithm`` of ``collective``: this host's Comm (over
        its arena), the leaders' Comm (one rank per host: the lowest, or ``root`` on its host),
        this rank's rail and, for all_reduce, the network algorithm for ``sizes`` (bytes,
        count) among the leaders or along each rail."""
        if self.host_arena(ctx) is None and len(self.local) > 1:  # forced with shared memory off, or no room
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
            rail = [self.transport_ranks[ranks[place]] for ranks in self.hosts] if self.shape.even else None
            layout = self._layouts[root] = (hosts, host, [self.transport_ranks[ranks[0]] for ranks in hosts], rail)
        return layout

    def _run(self, ctx: OpContext, plan: Plan, collective: str, *args, sizes: tuple[int, int] = (0, 0),
             root: int | None = None) -> str:
        """Run ``collective`` (rooted at group rank ``root``, if any) with the algorithm of
        ``plan`` for ``sizes`` (bytes, count) and return its name. The call's fingerprint
        (``ctx.spec.call``) goes with every message and arena sync, so that ranks in different
        calls fail (DesyncError) instead of hanging. On failure the receives still posted
        are withdrawn and the error raised as it is (the group layer handles it)."""
        algorithm = plan.algorithm
        comm = self._comm(ctx, collective, algorithm, ctx.spec.call, sizes, root)
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
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "broadcast")
        if plan.bound is not None:
            plan.bound(ctx, buf)
            return plan.algorithm
        algorithm = self._run(ctx, plan, "broadcast", buf, root, self.segment_bytes, root=root)
        self._bind(ctx, plan, "broadcast", buf, root)
        return algorithm

    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> str:
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "all_reduce", buf.nbytes, buf.size)
        if plan.bound is not None:  # a small call over the arena
            plan.bound(ctx, buf, op)
            return plan.algorithm
        scaled = op.op is not RedOpType.SUM  # the common case: nothing to scale before or after
        if scaled:
            prescale(buf, op)
        algorithm = self._run(ctx, plan, "all_reduce", buf, op, self.segment_bytes, sizes=(buf.nbytes, buf.size))
        if scaled:
            postscale(buf, op, self.size)
        self._bind(ctx, plan, "all_reduce", buf)
        return algorithm

    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> str:
        is_root = self.rank == root
        work = buf if is_root or op.op != RedOpType.PREMUL_SUM else buf.copy()
        prescale(work, op)
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "reduce")
        algorithm = self._run(ctx, plan, "reduce", work, root, op, self.segment_bytes, root=root)
        if is_root:
            postscale(buf, op, self.size)
        return algorithm

    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> str:
        nbytes = sum(out.nbytes for out in outputs)
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "all_gather", nbytes)
        return self._run(ctx, plan, "all_gather", outputs, input, self.segment_bytes, sizes=(nbytes, 0))

    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> str:
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "gather")
        return self._run(ctx, plan, "gather", input, outputs, root)

    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> str:
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "scatter")
        return self._run(ctx, plan, "scatter", output, inputs, root)

    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> str:
        if op.op == RedOpType.PREMUL_SUM:
            inputs = [block.copy() for block in inputs]
            for block in inputs:
                prescale(block, op)
        nbytes = sum(block.nbytes for block in inputs)
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "reduce_scatter", nbytes)
        algorithm = self._run(ctx, plan, "reduce_scatter", output, inputs, op, self.segment_bytes, sizes=(nbytes, 0))
        postscale(output, op, self.size)
        return algorithm

    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> str:
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "all_to_all")
        return self._run(ctx, plan, "all_to_all", outputs, inputs)

    def barrier(self, ctx: OpContext) -> str:
        plan = self._plans.get(ctx.spec) or self._plan(ctx, "barrier")
        if plan.bound is not None:
            plan.bound(ctx)
            return plan.algorithm
        algorithm = self._run(ctx, plan, "barrier")
        self._bind(ctx, plan, "barrier")
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


def _scaled(path: Callable[..., None], size: int) -> Callable[..., None]:
    """An all_reduce ``path(comm, array)`` of a sum with the op's scaling around it (AVG's
    division after, PREMUL_SUM's factor before: each call's own)."""
    def scaled(comm: Comm, array: np.ndarray, op: ReduceOp) -> None:
        prescale(array, op)
        path(comm, array)
        postscale(array, op, size)
    return scaled


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
