"""What the staged path across hosts runs on: the group's CPU collectives and the host's device ones.

Behaviour
    ``NetworkSteps(native, ctx, members)`` is pydist.algorithms.device_staging.HostCollectives
    over the native engine's network algorithms among ``members`` (group ranks: the whole
    group, a rail, the hosts' leaders), inside the running operation ``ctx``: every chunk's
    host step is one run of the algorithm the native engine would pick for those bytes
    (recursive doubling or the ring for all_reduce, Bruck or the ring for all_gather...), its
    messages keyed by the operation's sequence number (chunks follow one another in the same
    order on every rank, and messages between two ranks match in order). AVG and PREMUL_SUM
    are scaled here, as the native engine does. ``SlotsHost(call)`` is
    pydist.algorithms.device_rails.OneHost over the device engine's one-host algorithms on
    the host's slots (a DeviceCall whose slots were opened on the host's arena).

Failure modes
    A step's error (PeerFailedError naming a dead peer, OpTimeoutError naming the one not
    coming, DesyncError) propagates unchanged after the receives it posted are withdrawn.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algorithms import device_allgather, device_broadcast, device_reduce, device_reduce_scatter
from ..algorithms.comm import Comm
from ..algorithms.device_slots import DeviceCall
from ..core.ops import ReduceOp, postscale, prescale
from ..device.events import Stream
from .base import OpContext
from .choice import ALGORITHMS, NETWORK_DEFAULT, network_all_reduce, network_by_size


class NetworkSteps:
    """The CPU collectives of ``members`` (group ranks) in operation ``ctx`` (module docstring)."""

    def __init__(self, native: Any, ctx: OpContext, members: list[int]):
        self.rank, self.size = members.index(native.rank), len(members)
        self.segment_bytes = native.segment_bytes
        self.comm = Comm(native.transport, native.group_id, [native.transport_ranks[g] for g in members], self.rank,
                         ctx.seq, ctx.deadline, ctx.name, ctx.timeout_text, None, ctx.spec.call)

    def _run(self, collective: str, algorithm: str, *args: Any) -> None:
        try:
            ALGORITHMS[collective][algorithm](self.comm, *args)
        except BaseException:
            self.comm.abandon()
            raise

    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> None:
        self._scaled(array, [array], op, lambda: self._run(
            "all_reduce", network_all_reduce(array.nbytes, array.size, self.size), array, op, self.segment_bytes))

    def broadcast(self, array: np.ndarray, root: int) -> None:
        self._run("broadcast", NETWORK_DEFAULT["broadcast"], array, root, self.segment_bytes)

    def reduce(self, array: np.ndarray, root: int, op: ReduceOp) -> None:
        self._scaled(array if self.rank == root else None, [array], op, lambda: self._run(
            "reduce", NETWORK_DEFAULT["reduce"], array, root, op, self.segment_bytes))

    def all_gather(self, outputs: list[np.ndarray], input: np.ndarray) -> None:
        nbytes = sum(out.nbytes for out in outputs)
        self._run("all_gather", network_by_size("all_gather", nbytes, self.size), outputs, input, self.segment_bytes)

    def reduce_scatter(self, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None:
        algorithm = network_by_size("reduce_scatter", sum(block.nbytes for block in inputs), self.size)
        self._scaled(output, inputs, op, lambda: self._run(
            "reduce_scatter", algorithm, output, inputs, op, self.segment_bytes))

    def gather(self, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None:
        self._run("gather", NETWORK_DEFAULT["gather"], input, outputs, root)

    def scatter(self, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None:
        self._run("scatter", NETWORK_DEFAULT["scatter"], output, inputs, root)

    def all_to_all(self, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
        self._run("all_to_all", NETWORK_DEFAULT["all_to_all"], outputs, inputs)

    def barrier(self) -> None:
        self._run("barrier", NETWORK_DEFAULT["barrier"])

    def _scaled(self, result: np.ndarray | None, contributions: list[np.ndarray], op: ReduceOp,
                run: Callable[[], None]) -> None:
        """``run()`` with PREMUL_SUM's factor on the ``contributions`` (staging buffers: this
        rank's copies) before and AVG's division of ``result`` (None: none here) after."""
        for block in contributions:
            prescale(block, op)
        run()
        if result is not None:
            postscale(result, op, self.size)


@dataclasses.dataclass
class SlotsHost:
    """OneHost over the one-host device algorithms on ``call``'s slots (the host's)."""

    call: DeviceCall

    @property
    def rank(self) -> int:
        return self.call.slots.rank

    @property
    def size(self) -> int:
        return self.call.slots.size

    def _on(self, stream: Stream) -> DeviceCall:
        return dataclasses.replace(self.call, stream=stream)

    def _blocks(self, array: Any) -> list[Any]:
        flat = self.call.device.flat(array)
        per = int(np.prod(self.call.device.describe(flat)[1])) // self.size
        return [flat[j * per:(j + 1) * per] for j in range(self.size)]

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, stream: Stream) -> None:
        device_reduce_scatter.reduce_scatter(self._on(stream), output, self._blocks(input), op)

    def all_gather(self, output: Any, input: Any, stream: Stream) -> None:
        device_allgather.all_gather(self._on(stream), self._blocks(output), input)

    def broadcast(self, tensor: Any, root: int, stream: Stream) -> None:
        device_broadcast.broadcast(self._on(stream), tensor, root)

    def reduce(self, tensor: Any, root: int, op: ReduceOp, stream: Stream) -> None:
        device_reduce.reduce(self._on(stream), tensor, root, op)
