"""Staging device tensors through pinned host memory, chunk by chunk, three stages deep.

Behaviour
    One rank's staged call (issue 47 item 3) moves device arrays to the host, runs a host step
    (a CPU collective of the group) on them, and moves the result back, in chunks that flow
    through pydist.device.staged_schedule: while chunk k is on the network, chunk k+1 comes
    down (device -> host) and chunk k-1 goes up (host -> device). ``Staging`` holds what the
    call needs: the device, the caller's stream, the group's two staging streams (``down``
    for the copies to the host, ``up`` for those back: on CUDA each runs on its own copy
    engine, so chunk k+1 coming down and chunk k-1 going up overlap), the group's pool of
    pinned host buffers (a buffer per chunk in flight) and the call's deadline.

    ``Staging.run(parts, step)`` stages a list of :class:`Part`: each a 1-D range of ``count``
    elements, copied down from the device array ``down`` and/or up into ``up`` (either may be
    None). Chunk k holds elements [k*u, (k+1)*u) of every part (u = the pool's buffer bytes /
    parts / itemsize), laid end to end in one pinned buffer; ``step(k, segments)`` runs the
    host step on those numpy views (bfloat16 as int16 bits; ``widened`` makes a step see
    float32 values). ``chunks`` fixes the number of chunks (every rank of a host step must
    run the same number; by default what its own parts need).

    Stream order is the caller's, as NCCL's: both staging streams wait for the caller's work
    so far before their first copy (the copies down read what it wrote; the copies up
    overwrite only what it is done with). Each copy is followed by an event, which the
    schedule waits on (a CUDA event query loop against the deadline) before the host reads a
    buffer and before a buffer goes back to the pool: a chunk goes up only after the host saw
    it come down, so an in-place part's two streams never touch the same elements at once.
    When ``run`` returns every copy is complete, and the caller's stream waits for both
    staging streams, so work the caller enqueues next sees the result. The arrays staged are
    kept alive for the stream that copies them (torch's record_stream).

    ``trace`` (tests) is told each stage as it happens: ("down", k) when a copy down is
    enqueued, ("down done", k) when the host has waited for it, ("net", k) and ("net done",
    k) around the host step, ("up", k) and ("up done", k) likewise.

Cost
    Per chunk: two async copies (one on each staging stream) and two events, one host step; the host waits
    for copy k+1 only after step k. With chunk times d, n, u and c chunks: about
    d + u + c * max(d, n, u) instead of c * (d + n + u). Pinned memory: at most
    min(3, pool buffers) buffers of the pool at once, reused for the group's life.

Failure modes
    A failing host step (a dead peer: PeerFailedError naming it; a timeout: OpTimeoutError)
    stops the schedule: it waits for copies already started and returns their buffers to the
    pool (keeping out any whose copy may still run), then re-raises unchanged. A part that
    does not fit a chunk (more parts than the buffer has elements for): ValueError naming
    PYDIST_CUDA_CHUNK_BYTES. A non-contiguous device array: ValueError (pass a contiguous
    copy). The device's own errors (DeviceError naming the call, rank and device) propagate.
"""
from __future__ import annotations

import dataclasses
import mmap
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
from ..core.deadline import Deadline
from ..core.ops import ReduceOp
from ..device.dtypes import DType
from ..device.events import Event, Stream
from ..device.interface import Device
from ..device.memory import HostRegistration
from ..device.pinned_pool import PinnedPool, buffers_for
from ..device.staged_schedule import DEPTH, Chunk, run_staged

Trace = Callable[[str, int], None]
#: A host step: chunk index, the chunk's segment of each part (numpy views of a pinned buffer).
Step = Callable[[int, list[np.ndarray]], None]


class HostCollectives(Protocol):
    """A group's CPU collectives over numpy arrays, blocking, in the group's ranks: the host
    step of a staged call. They handle every ReduceOp themselves (AVG, PREMUL_SUM) and may
    be given an output that is also one of their inputs (in-place all_gather and gather).
    The engine passes the group's own network algorithms; tests pass pydist's API on a group."""

    rank: int
    size: int

    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> None: ...
    def broadcast(self, array: np.ndarray, root: int) -> None: ...
    def reduce(self, array: np.ndarray, root: int, op: ReduceOp) -> None: ...
    def all_gather(self, outputs: list[np.ndarray], input: np.ndarray) -> None: ...
    def reduce_scatter(self, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None: ...
    def gather(self, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None: ...
    def scatter(self, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None: ...
    def all_to_all(self, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None: ...


class PeerSteps(Protocol):
    """The host step of a staged send or recv: one chunk to or from ``peer``, blocking (the
    engine's: pydist.algorithms.device_staged_p2p, keyed by the message; tests: pydist's API)."""

    def send(self, array: np.ndarray, peer: int) -> None: ...
    def recv(self, array: np.ndarray, peer: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class Part:
    """``count`` elements staged through one segment of each chunk: copied down from the
    device array ``down`` and/or up into ``up`` (1-D, contiguous; None: no copy that way)."""

    count: int
    down: Any = None
    up: Any = None


class _Copied:
    """A started copy: the event recorded after it on the staging stream (staged_schedule's Pending)."""

    def __init__(self, event: Event | None, what: str, done: Callable[[], None]):
        self.event, self.what, self._done = event, what, done

    def wait(self, deadline: Deadline) -> None:
        if self.event is not None:
            self.event.synchronize(deadline, self.what)
        self._done()


def host_dtype(kind: DType) -> np.dtype:
    """The numpy type that holds ``kind`` on the host (bfloat16 as int16 bits, as pydist.core.buffers)."""
    return np.dtype(np.int16) if kind.name == "bfloat16" else kind.compute


def flat(device: Device, array: Any, name: str) -> Any:
    """``array`` as a 1-D array of its elements (a view); ValueError when it is not contiguous."""
    _, shape, contiguous = device.describe(array)
    if not contiguous:
        raise ValueError(f"{name}: a non-contiguous device tensor (shape {shape}); stage a contiguous copy")
    return device.flat(array)


def numel(device: Device, array: Any) -> int:
    """The number of elements of a device array."""
    return int(np.prod(device.describe(array)[1]))


def widened(kind: DType, step: Step) -> Step:
    """``step`` seeing float32 values where ``kind`` is bfloat16 (the CPU reduces bfloat16 in
    float32, as pydist.core.buffers does; the result is rounded back to bfloat16 bits)."""
    if kind.name != "bfloat16":
        return step

    def run(index: int, segments: list[np.ndarray]) -> None:
        wide = [bf16_bits_to_float32(segment) for segment in segments]
        step(index, wide)
        for segment, values in zip(segments, wide):
            segment[...] = float32_to_bf16_bits(values)
    return run


def pinned_pool(device: Device, chunk_bytes: int, pinned_bytes: int) -> PinnedPool[np.ndarray]:
    """A group's pool: at most ``pinned_bytes // chunk_bytes`` buffers of ``chunk_bytes``, each
    page-aligned host memory registered with ``device`` (CUDA: cudaHostRegister) while the pool
    holds it. ValueError naming the settings when not even one chunk fits."""
    try:
        count = buffers_for(pinned_bytes, chunk_bytes)
    except ValueError as error:
        raise ValueError(f"PYDIST_CUDA_PINNED_BYTES={pinned_bytes} must hold at least one chunk of "
                         f"PYDIST_CUDA_CHUNK_BYTES={chunk_bytes}: {error}") from None
    registrations: dict[int, HostRegistration] = {}

    def allocate(nbytes: int) -> np.ndarray:
        buffer = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)  # unmapped with its last view
        registrations[id(buffer)] = device.register_host(buffer)
        return buffer

    def free(buffer: np.ndarray) -> None:
        registrations.pop(id(buffer)).unregister()

    return PinnedPool(chunk_bytes, count, allocate, free, name=f"pinned pool of {device.where}")


@dataclasses.dataclass
class Staging:
    """What one rank's staged call needs (module docstring)."""

    device: Device
    caller: Stream
    down: Stream
    up: Stream
    pool: PinnedPool[np.ndarray]
    deadline: Deadline
    depth: int = DEPTH
    trace: Trace | None = None

    def unit(self, parts: int, kind: DType) -> int:
        """Elements of each part per chunk: the pool's buffer shared by ``parts`` parts."""
        per = self.pool.buffer_bytes // max(1, parts) // kind.itemsize
        if per < 1:
            raise ValueError(f"a chunk of {self.pool.buffer_bytes} bytes (PYDIST_CUDA_CHUNK_BYTES) cannot hold "
                             f"{parts} parts of {kind.name}: at least {parts * kind.itemsize} bytes are needed")
        return per

    def chunks_for(self, parts: Sequence[Part], kind: DType) -> int:
        """How many chunks ``parts`` need."""
        unit = self.unit(len(parts), kind)
        return -(-max((part.count for part in parts), default=0) // unit)

    def run(self, parts: Sequence[Part], kind: DType, step: Step, chunks: int | None = None) -> None:
        """Stage ``parts`` through ``step``, pipelined (module docstring)."""
        device, streams = self.device, {"down": self.down, "up": self.up}
        trace = _no_trace if self.trace is None else self.trace
        unit = self.unit(len(parts), kind)
        count = self.chunks_for(parts, kind) if chunks is None else chunks
        host = host_dtype(kind)
        for part in parts:
            if part.down is not None:
                device.keep_alive(part.down, self.down)
            if part.up is not None:
                device.keep_alive(part.up, self.up)
        self._follow(self.caller, self.down)  # the copies down read what the caller's work wrote
        self._follow(self.caller, self.up)  # the copies up overwrite only after the caller's work used it

        def segments(index: int, buffer: np.ndarray) -> list[tuple[Part, int, int, np.ndarray]]:
            start, views = index * unit, []
            for j, part in enumerate(parts):
                stop = min(start + unit, part.count)
                length = max(0, stop - start)
                at = j * unit * kind.itemsize
                views.append((part, start, stop, buffer[at:at + length * kind.itemsize].view(host)))
            return views

        def copied(chunk: Chunk, buffer: np.ndarray, way: str) -> _Copied:
            moved, stream = False, streams[way]
            for part, start, stop, view in segments(chunk.index, buffer):
                array = part.down if way == "down" else part.up
                if array is not None and stop > start:
                    if way == "down":
                        device.copy(view, array[start:stop], stream)
                    else:
                        device.copy(array[start:stop], view, stream)
                    moved = True
            trace(way, chunk.index)
            event = None
            if moved:
                event = device.event()
                event.record(stream)
            where = "to the host" if way == "down" else "to the device"
            return _Copied(event, f"the copy of chunk {chunk.index} {where}",
                           lambda: trace(f"{way} done", chunk.index))

        def network(chunk: Chunk, buffer: np.ndarray) -> None:
            trace("net", chunk.index)
            step(chunk.index, [view for _, _, _, view in segments(chunk.index, buffer)])
            trace("net done", chunk.index)

        nbytes = len(parts) * unit * kind.itemsize
        run_staged([Chunk(k, k * unit, nbytes) for k in range(count)], self.pool,
                   lambda chunk, buffer: copied(chunk, buffer, "down"), network,
                   lambda chunk, buffer: copied(chunk, buffer, "up"), self.deadline, self.depth)
        self._follow(self.up, self.caller)  # (done already: the host waited for every copy)
        self._follow(self.down, self.caller)

    def _follow(self, earlier: Stream, later: Stream) -> None:
        """Later work on ``later`` waits for the work enqueued on ``earlier`` so far."""
        event = self.device.event()
        event.record(earlier)
        later.wait_event(event)


def _no_trace(stage: str, index: int) -> None:
    """No tracing."""
