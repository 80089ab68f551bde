"""The strict stand-in device: CPU memory and lazy streams that obey CUDA's rules, and more.

Behaviour
    A :class:`StandinDevice` behaves as one GPU seen by one rank, for tests on machines
    without one: buffers are /dev/shm files that peer processes map (IPC), arrays are
    :class:`~pydist.device.standin.memory.StandinArray` objects the host reads only through a
    copy, and streams are lazy with poisoned outputs (pydist.device.standin.scheduler), so
    that a missing wait, a tensor dropped too early or a racing read fails the same way on
    every run. The interface's IPC rules (pydist.device.interface) hold as on CUDA.

    Identity: ``visible`` plays CUDA_VISIBLE_DEVICES: index i is physical device
    ``visible[i]`` (default: i), and ``uuid`` names the physical device, so two processes
    with different ``visible`` lists agree on which of them share one.

Cost
    Copies and sums in numpy, plus a copy of each captured operation's inputs.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...core.ops import RedOpType
from .. import shm_files
from ..dtypes import DType
from ..events import Event, Stream
from ..handles import Handle
from ..interface import Device
from . import kernels
from .memory import Allocation, Ref, StandinArray, host_ref
from .scheduler import DELAY, SCHEDULER, WORK, Op
from .streams import ImportedEvent, StandinEvent, StandinStream


class StandinDevice(Device):
    """The stand-in for one GPU (module docstring)."""

    kind = "standin"
    strict = True

    def __init__(self, index: int = 0, rank: int | None = None, visible: Sequence[int] | None = None):
        super().__init__(index, rank)
        physical = visible[index] if visible is not None else index
        self._uuid = f"GPU-5d5d5d5d-0000-4000-8000-{physical:012d}"
        self._current = StandinStream(self)

    @property
    def uuid(self) -> str:
        return self._uuid

    # -- memory ------------------------------------------------------------------------------

    def _allocate(self, nbytes: int) -> Allocation:
        name = shm_files.new_name("m")
        fd, mapped = shm_files.create(name, nbytes)
        os.close(fd)
        bits = np.frombuffer(mapped, np.uint8)
        bits[...] = 0xA5  # uninitialised memory reads as poison
        return Allocation(bits, f"buffer of {nbytes} bytes", mapped=mapped, name=name)

    def _export(self, raw: Allocation) -> bytes:
        return raw.name.encode()

    def _open(self, source: Handle) -> Allocation:
        name = shm_files.check_name(source.payload.decode("ascii", "replace"))
        fd, mapped = shm_files.attach(name, source.nbytes)
        os.close(fd)
        return Allocation(np.frombuffer(mapped, np.uint8), f"{source.exporter}'s buffer of {source.nbytes} bytes",
                          mapped=mapped, name=name)

    def _in_use(self, raw: Allocation) -> str | None:
        uses = []
        if raw.arrays:
            uses.append(f"{raw.arrays} array{'s' if raw.arrays > 1 else ''} over it")
        if raw.users:
            uses.append(f"{raw.users} operation{'s' if raw.users > 1 else ''} not yet run")
        return ", ".join(uses) or None

    def _close(self, raw: Allocation) -> None:
        self._release(raw, "close")

    def _free(self, raw: Allocation) -> None:
        self._release(raw, "free")
        shm_files.unlink(raw.name)

    def _release(self, raw: Allocation, call: str) -> None:
        try:
            raw.release()
        except ValueError as error:
            raise self.error(call, f"{raw!r} is still in use ({error})") from None

    def _view(self, raw: Allocation, kind: DType, count: int, offset: int) -> StandinArray:
        assert raw.bits is not None
        bits = raw.bits[offset:offset + count * kind.itemsize].view(kind.storage)
        return StandinArray(self, raw, kind, bits)

    def _empty(self, shape: tuple[int, ...], kind: DType) -> StandinArray:
        nbytes = int(np.prod(shape)) * kind.itemsize
        bits = np.full(nbytes, 0xA5, np.uint8)  # uninitialised memory reads as poison
        allocation = Allocation(bits, f"array {shape} {kind.name}", private=True)
        allocation.stream = self._current  # torch allocates for the current stream
        return StandinArray(self, allocation, kind, bits.view(kind.storage).reshape(shape))

    def _array_dropped(self, allocation: Allocation) -> None:
        SCHEDULER.dropped(allocation)

    def describe(self, array: Any) -> tuple[DType, tuple[int, ...], bool]:
        if not isinstance(array, StandinArray):
            raise TypeError(f"expected an array of {self!r}, got {type(array).__name__}")
        if array.device is not self:
            raise ValueError(f"{array!r} is on {array.device!r}, not on {self!r}")
        return array.kind, array.shape, array.is_contiguous()

    def _reshape_device(self, array: StandinArray, shape: tuple[int, ...]) -> StandinArray:
        return array.reshape(shape)

    # -- streams and events --------------------------------------------------------------------

    def current_stream(self) -> Stream:
        return self._current

    @contextlib.contextmanager
    def using(self, stream: Stream) -> Iterator[None]:
        """Make ``stream`` the current one meanwhile (``torch.cuda.stream(s)``'s stand-in)."""
        self._check_stream(stream, "using")
        assert isinstance(stream, StandinStream)
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = previous

    def new_stream(self) -> Stream:
        return StandinStream(self)

    def event(self, interprocess: bool = False) -> Event:
        return StandinEvent(self, interprocess)

    def open_event(self, handle: bytes) -> Event:
        return ImportedEvent.open(self, handle)

    def keep_alive(self, array: Any, stream: Stream) -> None:
        self.describe(array)
        self._check_stream(stream, "keep_alive")
        assert isinstance(stream, StandinStream)
        with SCHEDULER.lock:
            if stream not in array.allocation.kept:
                array.allocation.kept.append(stream)

    def delay(self, seconds: float, stream: Stream) -> None:
        self._check_stream(stream, "delay")
        op = Op(DELAY, f"delay of {seconds} s")
        op.seconds = seconds
        SCHEDULER.enqueue(stream, op)

    # -- work ----------------------------------------------------------------------------------

    def _ref(self, array: Any, kind: DType) -> Ref:
        if isinstance(array, np.ndarray):
            with SCHEDULER.lock:
                return host_ref(array, kind, SCHEDULER.hosts)
        return Ref(array.allocation, array.bits, kind)

    def _work(self, stream: Stream, label: str, reads: tuple[Any, ...], writes: tuple[Any, ...], kind: DType,
              compute: Any) -> None:
        with SCHEDULER.lock:
            op = Op(WORK, label, tuple(self._ref(a, kind) for a in reads), tuple(self._ref(a, kind) for a in writes),
                    compute)
            SCHEDULER.enqueue(stream, op)

    def _copy(self, dst: Any, src: Any, kind: DType, stream: Stream) -> None:
        self._work(stream, "copy", (src,), (dst,), kind, lambda bits: [bits])

    def _reduce(self, dst: Any, src: Any, op: RedOpType, kind: DType, stream: Stream) -> None:
        self._work(stream, f"reduce_into {op.name}", (dst, src), (dst,), kind,
                   lambda acc, incoming: [kernels.reduce(acc, incoming, op, kind)])

    def _multiply(self, array: Any, factor: float | int, kind: DType, stream: Stream) -> None:
        self._work(stream, "prescale", (array,), (array,), kind, lambda bits: [kernels.multiply(bits, factor, kind)])

    def _divide(self, array: Any, divisor: int, kind: DType, stream: Stream) -> None:
        self._work(stream, "postscale", (array,), (array,), kind, lambda bits: [kernels.divide(bits, divisor, kind)])

    # -- host memory ---------------------------------------------------------------------------

    def _register(self, array: np.ndarray) -> np.ndarray:
        return array

    def _unregister(self, raw: np.ndarray) -> None:
        with SCHEDULER.lock:
            root = raw
            while isinstance(root.base, np.ndarray):
                root = root.base
            queued = SCHEDULER.hosts.get(id(root))
            if queued is not None and queued.users:
                raise self.error("unregister_host", f"{queued.users} queued copies still use that memory")
