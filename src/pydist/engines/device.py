"""The device engine: a group's collectives on device tensors (CUDA, or the test stand-in).

Behaviour
    One DeviceEngine per group and rank, made at the group's first call with device tensors
    and bound to that call's device (a later call on another device is refused, naming both).
    It runs beside the group's native engine and uses its arena for control: a device call
    goes through the group's queue like any other (``ProcessGroup.run``), in issue order.

    Streams, as NCCL (torch >= 2.8): a blocking call's work goes to the caller's current
    stream, decided in the calling thread (``plan``); an ``async_op`` call's to the group's own
    stream, which first waits for the caller's stream as it was at the call (an event recorded
    then), and the call's Work makes the waiter's current stream wait for it
    (pydist.groups.device_work). A call returns once its work is enqueued: the host never
    waits for the device. The arrays an async call uses are kept from reuse until its stream
    is past them (``keep_alive``: torch's ``record_stream``); a non-contiguous tensor goes
    through a contiguous copy on the call's stream.

    Which path: every rank of the group on this host: the one-host algorithms over device
    buffers shared through CUDA IPC (algorithms/device_*.py: all_reduce one shot among two
    ranks and up to PYDIST_DEVICE_ONE_SHOT_BYTES, else reduce-scatter + all-gather; the
    protocol is algorithms/device_slots.py); send and recv through a channel per pair and
    direction (algorithms/device_p2p.py), outside the group's queue. A group spanning hosts:
    engines/device_across.py (its slots are its host's ranks', over the host's arena).
    ``drain`` is this rank's half of NCCL's barrier (the API then runs the host barrier).

    Failures: every call's end event goes to the group's watchdog (engines/device_watchdog):
    a peer that dies or freezes after the call returned fails the group's next device call
    and the call's Work, naming it. ``close`` synchronizes (bounded) every stream the group's
    work went to, closes the peers' buffers and frees this rank's once they closed theirs.

Failure modes
    No shared memory among the ranks (PYDIST_SHM=0, /dev/shm full): DistBackendError at the
    call. The device's own errors: DeviceError naming the call, the rank and the device.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..algorithms import (
    device_allgather,
    device_allreduce_oneshot,
    device_allreduce_twoshot,
    device_alltoall,
    device_broadcast,
    device_gather,
    device_reduce,
    device_reduce_scatter,
    device_scatter,
)
from ..algorithms.comm import Comm
from ..algorithms.device_p2p import Channels, Message, OnEnqueued
from ..algorithms.device_slots import DeviceCall, DeviceSlots, count_of
from ..core.deadline import Deadline
from ..core.errors import DistBackendError
from ..core.ops import ReduceOp
from ..core.settings import settings
from ..device.events import Event, Stream
from ..device.interface import Device
from ..device.shm_files import remove_stale
from .base import OpContext
from .device_watchdog import Watchdog

#: How long ``close`` waits for a group's outstanding device work.
CLOSE_SECONDS = 10.0
_log = logging.getLogger("pydist")


@dataclasses.dataclass
class StreamPlan:
    """Where one call's device work goes, decided in the calling thread: the caller's current
    stream (blocking), or the group's after ``ready`` (async). ``end`` is recorded after the
    call's work once it is enqueued; ``arrays`` are what the Work keeps referenced."""

    stream: Stream
    ready: Event | None = None
    end: Event | None = None
    arrays: list[Any] = dataclasses.field(default_factory=list)


class DeviceEngine:
    """A group's device collectives on this rank (module docstring). ``native``: the group's
    NativeEngine (its arena, transport, members, state)."""

    def __init__(self, native: Any):
        self.native = native
        self.device: Device | None = None
        self.slots: DeviceSlots | None = None
        self.stream: Stream | None = None  # the group's own (async_op)
        self.p2p_stream: Stream | None = None  # the group's own for async send and recv
        self.channels: Channels | None = None
        self.streams: list[Stream] = []  # every stream this group's work went to
        self.watchdog: Watchdog | None = None
        current = settings()
        self.timeout = 1800.0  # the group's timeout, set at each call (deadlines of sends and receives)
        self.slot_bytes = current.device_slot_bytes
        self.one_shot_bytes = current.device_one_shot_bytes

    # -- in the calling thread ----------------------------------------------------------------

    def bind(self, device: Device, what: str, timeout: float) -> None:
        """Use ``device`` for this group (the first call), or refuse another one, naming ``what``;
        ``timeout``: the group's (bounds sends and receives)."""
        self.timeout = timeout
        if self.device is None:
            self.device = device
            self.stream = device.new_stream()
            self.p2p_stream = device.new_stream()
            self.watchdog = Watchdog(device.where, device.strict)
        elif device is not self.device:
            raise ValueError(f"{what}: on {device.where.split(', ')[-1]}, but this rank's group runs its device "
                             f"tensors on {self.device.where.split(', ')[-1]} (one device per rank and group, as "
                             "NCCL: move the tensor there, or use another group)")

    def plan(self, async_op: bool, p2p: bool = False) -> StreamPlan:
        """The streams of a call made now in this thread (see StreamPlan); ``p2p``: a send or
        receive (async ones go to the group's point-to-point stream)."""
        assert self.device is not None and self.stream is not None and self.p2p_stream is not None
        current = self.device.current_stream()
        if not async_op:
            return StreamPlan(current)
        ready = self.device.event()
        ready.record(current)
        return StreamPlan(self.p2p_stream if p2p else self.stream, ready)

    # -- the collectives (run by the group, in issue order) -----------------------------------

    def all_reduce(self, ctx: OpContext, plan: StreamPlan, array: Any, op: ReduceOp) -> str:
        def body(call: DeviceCall, staged: list[Any]) -> str:
            nbytes = count_of(call.device, staged[0]) * call.device.describe(staged[0])[0].itemsize
            if call.slots.size > 2 and nbytes > self.one_shot_bytes:
                device_allreduce_twoshot.all_reduce(call, staged[0], op)
                return "device_twoshot"
            device_allreduce_oneshot.all_reduce(call, staged[0], op)
            return "device_oneshot"
        return self._run(ctx, plan, body, [array], [array])

    def broadcast(self, ctx: OpContext, plan: StreamPlan, array: Any, root: int) -> str:
        return self._run(ctx, plan, _named("device", lambda call, s: device_broadcast.broadcast(call, s[0], root)),
                         [array], [array])

    def reduce(self, ctx: OpContext, plan: StreamPlan, array: Any, root: int, op: ReduceOp) -> str:
        return self._run(ctx, plan, _named("device", lambda call, s: device_reduce.reduce(call, s[0], root, op)),
                         [array], [array] if self.native.rank == root else [])

    def all_gather(self, ctx: OpContext, plan: StreamPlan, outputs: list[Any], input: Any) -> str:
        return self._run(ctx, plan, _named("device", lambda call, s: device_allgather.all_gather(call, s[1:], s[0])),
                         [input, *outputs], outputs)

    def reduce_scatter(self, ctx: OpContext, plan: StreamPlan, output: Any, inputs: list[Any], op: ReduceOp) -> str:
        return self._run(ctx, plan, _named("device", lambda call, s: device_reduce_scatter.reduce_scatter(
            call, s[0], s[1:], op)), [output, *inputs], [output])

    def gather(self, ctx: OpContext, plan: StreamPlan, input: Any, outputs: list[Any] | None, root: int) -> str:
        parts = outputs or []
        return self._run(ctx, plan, _named("device", lambda call, s: device_gather.gather(
            call, s[0], s[1:] if outputs is not None else None, root)), [input, *parts], parts)

    def scatter(self, ctx: OpContext, plan: StreamPlan, output: Any, inputs: list[Any] | None, root: int) -> str:
        parts = inputs or []
        return self._run(ctx, plan, _named("device", lambda call, s: device_scatter.scatter(
            call, s[0], s[1:] if inputs is not None else None, root)), [output, *parts], [output])

    def all_to_all(self, ctx: OpContext, plan: StreamPlan, outputs: list[Any], inputs: list[Any]) -> str:
        count = len(outputs)
        return self._run(ctx, plan, _named("device", lambda call, s: device_alltoall.all_to_all(
            call, s[:count], s[count:])), [*outputs, *inputs], outputs)

    def drain(self, seconds: float) -> None:
        """NCCL's barrier, this rank's half: the caller's device work so far, and the group's,
        complete (its streams synchronized within ``seconds``; a dead peer named at once)."""
        self._check()
        assert self.device is not None and self.stream is not None and self.p2p_stream is not None
        deadline = Deadline.after(seconds)
        for stream in (self.device.current_stream(), self.stream, self.p2p_stream):
            stream.synchronize(deadline, "the device work before a barrier")

    # -- point-to-point (not through the group's queue: each progresses on its own) ----------

    def send(self, plan: StreamPlan, array: Any, peer: int, tag: int, what: str, done: OnEnqueued) -> None:
        """Start sending ``array`` to group rank ``peer``; ``done(error, None)`` once its device
        work is enqueued on the plan's stream (its end recorded), or it failed."""
        message = self._message(plan, array, tag, what, done)
        self._channels(what).send(message, peer)

    def recv(self, plan: StreamPlan, array: Any, peer: int | None, tag: int, what: str, done: OnEnqueued) -> None:
        """Start receiving into ``array`` from group rank ``peer`` (None: any); ``done(error,
        the sender's group rank)`` as for ``send``."""
        message = self._message(plan, array, tag, what, done)
        self._channels(what).recv(message, peer)

    def _channels(self, what: str) -> Channels:
        native = self.native
        if self.channels is None:
            assert self.device is not None
            self.channels = Channels(native.transport, native.group_id, native.transport_ranks, native.rank,
                                     self.device, self.slot_bytes)
        return self.channels

    def _message(self, plan: StreamPlan, array: Any, tag: int, what: str, done: OnEnqueued) -> Message:
        """The Message of a send or receive of ``array`` (contiguous) whose end is recorded and
        watched once enqueued, then reported to ``done``."""
        self._check()
        device, watchdog = self.device, self.watchdog
        assert device is not None and watchdog is not None
        self._used(plan.stream)
        if plan.ready is not None:
            plan.stream.wait_event(plan.ready)
        deadline = Deadline.after(self.timeout)

        def enqueued(error: BaseException | None, source: int | None) -> None:
            if error is None:
                try:
                    if plan.ready is not None:
                        device.keep_alive(array, plan.stream)
                    plan.end = device.event()
                    plan.end.record(plan.stream)
                    watchdog.track(plan.end, what, deadline)
                except Exception as failure:  # noqa: BLE001 - the call reports it
                    error = failure
            done(error, source)

        return Message(device.flat(array), count_of(device, array), device.describe(array)[0].name, tag, plan.stream,
                       enqueued, deadline=deadline, what=what)

    # -- one call -----------------------------------------------------------------------------

    def _check(self) -> None:
        """Raise the failure the watchdog found (a peer dead or frozen after an earlier call)."""
        failure = self.watchdog.failure if self.watchdog is not None else None
        if failure is not None:
            raise failure

    def _run(self, ctx: OpContext, plan: StreamPlan, body: Callable[[DeviceCall, list[Any]], str],
             arrays: list[Any], written: list[Any]) -> str:
        """Run ``body`` on ``arrays`` (contiguous stand-ins of them) on the plan's stream, then
        record its end and hand it to the watchdog."""
        self._check()
        device = self.device
        assert device is not None and self.watchdog is not None
        self._used(plan.stream)
        call = DeviceCall(self._slots(ctx), plan.stream, self._comm(ctx), ctx.spec.call)
        if plan.ready is not None:
            plan.stream.wait_event(plan.ready)
        with contiguous(device, plan.stream, arrays, written) as staged:
            algorithm = body(call, staged)
        if plan.ready is not None:
            for array in arrays:
                device.keep_alive(array, plan.stream)
        plan.end = device.event()
        plan.end.record(plan.stream)
        self.watchdog.track(plan.end, f"{ctx.name} (seq {ctx.seq})", ctx.deadline)
        return algorithm

    def _used(self, stream: Stream) -> None:
        if all(stream is not known for known in self.streams):
            self.streams.append(stream)

    def _comm(self, ctx: OpContext) -> Comm:
        native = self.native
        arena = self.slots.arena if self.slots is not None else None
        return Comm(native.transport, native.group_id, native.transport_ranks, native.rank, ctx.seq, ctx.deadline,
                    ctx.name, ctx.timeout_text, arena, ctx.spec.call)

    def _slots(self, ctx: OpContext) -> DeviceSlots:
        """The group's device slots, opened at its first device call (every rank at once)."""
        if self.slots is None:
            native, device = self.native, self.device
            assert device is not None
            if native.spans_hosts:  # this host's ranks of the group (engines/device_across.py checks the arena)
                arena = native.host_arena(ctx)
            else:
                arena = native.arena(ctx) if native.size > 1 else None
            if native.size > 1 and arena is None and not native.spans_hosts:
                raise DistBackendError(f"{ctx.name} (seq {ctx.seq}): device tensors between the ranks of a host go "
                                       "through CUDA IPC, controlled through the group's shared memory, which it "
                                       "does not have (PYDIST_SHM=0, or /dev/shm had no room)")
            operation = Comm(native.transport, native.group_id, native.transport_ranks, native.rank, ctx.seq,
                             ctx.deadline, ctx.name, ctx.timeout_text, arena, ctx.spec.call)
            self.slots = DeviceSlots.open(device, arena, operation, self.slot_bytes)
        return self.slots

    def close(self) -> None:
        """Wait (bounded) for the outstanding work, close the peers' buffers, free this rank's;
        what cannot be released now (a peer still has this rank's buffer open) is left to the
        process's exit, logged."""
        if self.watchdog is None:
            return
        self.watchdog.close()
        slots, channels, self.slots, self.channels = self.slots, self.channels, None, None
        deadline = Deadline.after(CLOSE_SECONDS)
        for stream in self.streams:
            try:
                stream.synchronize(deadline, "the group's device work, at its destroy")
            except Exception as error:  # noqa: BLE001 - a failed group: its buffers are released all the same
                _log.info("pydist: the group's device work did not all finish before its destroy: %s", error)
        for held in (slots, channels):
            try:
                if held is not None:
                    held.close(deadline)
            except Exception as error:  # noqa: BLE001 - destroy goes on; the memory goes with the process
                _log.warning("pydist: the group's device buffers were not all released at destroy: %s", error)
        remove_stale()  # a peer killed meanwhile left its files


def _named(name: str, body: Callable[[DeviceCall, list[Any]], None]) -> Callable[[DeviceCall, list[Any]], str]:
    """``body``, returning the algorithm's name."""
    def run(call: DeviceCall, staged: list[Any]) -> str:
        body(call, staged)
        return name
    return run


@contextlib.contextmanager
def contiguous(device: Device, stream: Stream, arrays: list[Any], written: list[Any]) -> Iterator[list[Any]]:
    """``arrays`` with each non-contiguous one replaced by a contiguous copy made on
    ``stream`` (copied back after, for those in ``written``)."""
    staged: list[Any] = []
    for array in arrays:
        kind, shape, dense = device.describe(array)
        if dense:
            staged.append(array)
            continue
        copy = device.empty(shape, kind.name)
        device.copy(copy, array, stream)
        device.keep_alive(copy, stream)
        staged.append(copy)
    yield staged
    for array, copy in zip(arrays, staged):
        if copy is not array and any(array is out for out in written):
            device.copy(array, copy, stream)
