"""A group's device collectives when its ranks span hosts (issue 47 item 3): the staged path.

Behaviour
    ``AcrossHostsEngine`` is the DeviceEngine of a group whose ranks are on several hosts
    (pydist.groups.device_engines makes it for such a group). Its slots are its host's (the
    group's ranks on this host, over the host's arena) and each collective runs on the
    call's stream through DeviceEngine's ``_run`` (contiguous copies, the end event, the
    watchdog), composed as pydist.algorithms.device_rails.choose says for the group's layout:

    - "rails" (every host has as many ranks, more than one, with shared memory): all_reduce,
      reduce, broadcast, all_gather and reduce_scatter reduce or gather inside each host on
      the device and carry 1/L of the tensor per rank along its rail (each byte between
      hosts once); "leaders" (unequal hosts): all_reduce through each host's first rank;
    - otherwise, and for gather, scatter and all_to_all: every rank stages its own tensors
      through the whole group's CPU collective (pydist.algorithms.device_staged_*).

    The pinned pool (PYDIST_CUDA_CHUNK_BYTES chunks, PYDIST_CUDA_PINNED_BYTES in all) and the
    two staging streams (down, up) are the group's, made at its first call. Unlike one
    host's calls, a call here returns once its work is *done*, not just enqueued: the host
    carries every chunk between the device and the network (an async_op call does that on
    the group's thread). The barrier is DeviceEngine's (``drain``, then the host barrier).

    send and recv: to and from a rank of this host, DeviceEngine's channels (device to
    device); of another host, staged (pydist.algorithms.device_staged_p2p: its own pool,
    made at the first such message, and a thread per pair and direction while it has
    messages). A receive takes either kind, so a receive from any rank works too.

Failure modes
    A peer that dies: PeerFailedError naming it from the network step (its rail or group) or
    from the host's barrier; the staged pipeline returns its buffers first. No shared memory
    among a host's ranks (PYDIST_SHM=0, /dev/shm full): the staged path of every rank.
"""
from __future__ import annotations

from typing import Any

from ..algorithms import device_rails as rails
from ..algorithms import device_staged_movement as moved
from ..algorithms import device_staged_reductions as staged
from ..algorithms.device_p2p import Channels, OnEnqueued
from ..algorithms.device_slots import DeviceCall
from ..algorithms.device_staged_p2p import StagedP2P
from ..algorithms.device_staging import Staging, pinned_pool
from ..core.errors import DistBackendError
from ..core.ops import ReduceOp
from ..core.settings import settings
from ..device.events import Stream
from ..device.pinned_pool import PinnedPool
from .base import OpContext
from .device import DeviceEngine, StreamPlan
from .device_host_steps import NetworkSteps, SlotsHost


class AcrossHostsEngine(DeviceEngine):
    """The device engine of a group spanning hosts (module docstring)."""

    def __init__(self, native: Any):
        super().__init__(native)
        hosts: list[list[int]] = native.hosts
        self.hosts = hosts
        self.host = next(h for h, ranks in enumerate(hosts) if native.rank in ranks)
        self.place = hosts[self.host].index(native.rank)
        self.path = rails.choose(hosts, native.transport.shares_arenas)
        self.pool: PinnedPool | None = None
        self.staging_streams: tuple[Stream, Stream] | None = None  # (down, up)
        self.staged_p2p: StagedP2P | None = None

    # -- what a call runs on ----------------------------------------------------------------

    def _staging(self, ctx: OpContext, call: DeviceCall) -> Staging:
        device = call.device
        if self.pool is None or self.staging_streams is None:
            current = settings()
            self.pool = pinned_pool(device, current.cuda_chunk_bytes, current.cuda_pinned_bytes)
            self.staging_streams = (device.new_stream(), device.new_stream())
        return Staging(device, call.stream, *self.staging_streams, self.pool, ctx.deadline)

    def _group(self, ctx: OpContext) -> NetworkSteps:
        return NetworkSteps(self.native, ctx, list(range(self.native.size)))

    def _rail(self, ctx: OpContext) -> NetworkSteps:
        return NetworkSteps(self.native, ctx, [ranks[self.place] for ranks in self.hosts])

    def _root(self, root: int) -> tuple[int, int]:
        """(host, place) of group rank ``root``."""
        host = next(h for h, ranks in enumerate(self.hosts) if root in ranks)
        return host, self.hosts[host].index(root)

    def _across(self, ctx: OpContext, plan: StreamPlan, arrays: list[Any], written: list[Any],
                body: Any) -> str:
        """Run ``body(staging, one_host, staged_arrays)`` through DeviceEngine's ``_run``;
        the algorithm's name is the path's."""
        def run(call: DeviceCall, staged_arrays: list[Any]) -> str:
            if self.path != "staged" and call.slots.size != len(self.native.local):
                raise DistBackendError(f"{ctx.name} (seq {ctx.seq}): the group's ranks on this host share device "
                                       "memory through the host's shared memory, which they could not set up "
                                       "(/dev/shm had no room: see the warning of this host's lowest rank)")
            return body(self._staging(ctx, call), SlotsHost(call), staged_arrays) or f"device_{self.path}"
        return self._run(ctx, plan, run, arrays, written)

    # -- the collectives ----------------------------------------------------------------------

    def all_reduce(self, ctx: OpContext, plan: StreamPlan, array: Any, op: ReduceOp) -> str:
        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> None:
            size = self.native.size
            if self.path == "rails":
                rails.all_reduce(staging, local, self._rail(ctx), s[0], op, size)
            elif self.path == "leaders":
                leaders = NetworkSteps(self.native, ctx, [r[0] for r in self.hosts]) if self.place == 0 else None
                rails.all_reduce_leaders(staging, local, leaders, s[0], op, size)
            else:
                staged.all_reduce(staging, self._group(ctx), s[0], op)
        return self._across(ctx, plan, [array], [array], body)

    def broadcast(self, ctx: OpContext, plan: StreamPlan, array: Any, root: int) -> str:
        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str | None:
            if self.path != "rails":
                moved.broadcast(staging, self._group(ctx), s[0], root)
                return "device_staged"
            rails.broadcast(staging, local, self._rail(ctx), s[0], *self._root(root))
            return None
        return self._across(ctx, plan, [array], [array], body)

    def reduce(self, ctx: OpContext, plan: StreamPlan, array: Any, root: int, op: ReduceOp) -> str:
        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str | None:
            if self.path != "rails":
                staged.reduce(staging, self._group(ctx), s[0], root, op)
                return "device_staged"
            rails.reduce(staging, local, self._rail(ctx), s[0], *self._root(root), op, self.native.size)
            return None
        return self._across(ctx, plan, [array], [array] if self.native.rank == root else [], body)

    def all_gather(self, ctx: OpContext, plan: StreamPlan, outputs: list[Any], input: Any) -> str:
        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str | None:
            if self.path != "rails":
                moved.all_gather(staging, self._group(ctx), s[1:], s[0])
                return "device_staged"
            rails.all_gather(staging, local, self._rail(ctx), s[1:], s[0], self.hosts)
            return None
        return self._across(ctx, plan, [input, *outputs], outputs, body)

    def reduce_scatter(self, ctx: OpContext, plan: StreamPlan, output: Any, inputs: list[Any], op: ReduceOp) -> str:
        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str | None:
            if self.path != "rails":
                staged.reduce_scatter(staging, self._group(ctx), s[0], s[1:], op)
                return "device_staged"
            rails.reduce_scatter(staging, local, self._rail(ctx), s[0], s[1:], op, self.hosts)
            return None
        return self._across(ctx, plan, [output, *inputs], [output], body)

    def gather(self, ctx: OpContext, plan: StreamPlan, input: Any, outputs: list[Any] | None, root: int) -> str:
        parts = outputs or []

        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str:
            moved.gather(staging, self._group(ctx), s[0], s[1:] if outputs is not None else None, root)
            return "device_staged"
        return self._across(ctx, plan, [input, *parts], parts, body)

    def scatter(self, ctx: OpContext, plan: StreamPlan, output: Any, inputs: list[Any] | None, root: int) -> str:
        parts = inputs or []

        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str:
            moved.scatter(staging, self._group(ctx), s[0], s[1:] if inputs is not None else None, root)
            return "device_staged"
        return self._across(ctx, plan, [output, *parts], [output], body)

    def all_to_all(self, ctx: OpContext, plan: StreamPlan, outputs: list[Any], inputs: list[Any]) -> str:
        count = len(outputs)

        def body(staging: Staging, local: SlotsHost, s: list[Any]) -> str:
            moved.all_to_all(staging, self._group(ctx), s[:count], s[count:])
            return "device_staged"
        return self._across(ctx, plan, [*outputs, *inputs], outputs, body)

    # -- point-to-point ------------------------------------------------------------------------

    def send(self, plan: StreamPlan, array: Any, peer: int, tag: int, what: str, done: OnEnqueued) -> None:
        """A rank of this host: device to device (DeviceEngine's); of another: staged."""
        if peer in self.native.local:
            super().send(plan, array, peer, tag, what, done)
        else:
            self._p2p().send(self._message(plan, array, tag, what, done), peer)

    def _channels(self, what: str) -> Channels:
        """DeviceEngine's channels, whose receives hand staged messages to the staged path."""
        if self.channels is None:
            super()._channels(what).staged = self._p2p().receive
        assert self.channels is not None
        return self.channels

    def _p2p(self) -> StagedP2P:
        if self.staged_p2p is None:
            native, current = self.native, settings()
            assert self.device is not None
            self.staged_p2p = StagedP2P(native.transport, native.group_id, native.transport_ranks, native.rank,
                                        self.device, current.cuda_chunk_bytes, current.cuda_pinned_bytes)
        return self.staged_p2p

    def close(self) -> None:
        if self.staged_p2p is not None:
            self.staged_p2p.close()
        super().close()
        if self.pool is not None:
            self.pool.close()
            self.pool = None
