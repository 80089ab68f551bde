"""The device interface: the one place pydist talks to a device (CUDA, or a stand-in).

Behaviour
    A :class:`Device` is one device of this process (``cuda:0``, or a stand-in of one), seen
    by one rank. It gives:

    - shareable memory outside any caching allocator: ``allocate`` a :class:`Buffer`,
      ``export`` it as handle bytes, ``open`` a peer's handle as a :class:`Mapping`,
      ``close`` that, ``free`` the buffer; ``view`` either as an array of a dtype at an offset;
    - ``empty`` arrays (the device's own tensors: what users pass), ``to_host``/``from_host``;
    - streams (``current_stream``, ``new_stream``) and events (``event``, interprocess ones
      ``export``ed and ``open_event``ed by peers), ``Stream.wait_event`` (on the device, the
      host does not block), ``Event.synchronize(deadline)`` and ``Stream.synchronize(deadline)``
      (the host polls against the deadline and names a peer that died; never an unbounded wait);
    - asynchronous work on a stream: ``copy`` (device<->device, device<->host, any shapes of
      one element count where one side is contiguous, strided views included),
      ``reduce_into`` (``dst = dst op src`` for every ReduceOp; AVG and PREMUL_SUM add, with
      ``prescale`` before and ``postscale`` after, as pydist.core.ops does on the host),
      ``keep_alive`` (torch's ``record_stream``: an array dropped by its owner is not reused
      until the stream's work so far is done), ``delay`` (tests: hold the stream a while);
    - ``register_host``: pin host memory in place (a shared-memory arena: ``cudaHostRegister``);
    - identity: ``uuid``, the physical device whatever the process's CUDA_VISIBLE_DEVICES.

    The rules CUDA leaves undefined or enforces with a bare error code are checked here, the
    same for every implementation, with a DeviceError naming the call, this rank and device:
    opening a handle in the process that exported it, opening one handle twice in a process,
    exporting a peer's memory again, closing a mapping or freeing a buffer that arrays or
    unfinished work still use, freeing a buffer a live peer still has open (a ledger,
    pydist.device.ledger), a handle of another kind of device. A freed and re-allocated buffer
    always has new handle bytes. Misuse (a wrong dtype, shape, offset, another device's array)
    raises TypeError/ValueError at the call, before anything is enqueued.

    Implementations (each a subclass filling in the ``_`` methods): pydist.device.cuda (CUDA,
    through torch and the CUDA runtime), pydist.device.standin (the strict CPU stand-in the
    tests run: lazy streams, poison), pydist.device.torch_cpu (torch CPU tensors in shared
    memory, eager). ``strict`` is True for an implementation that runs work only when waited
    for and poisons outputs not yet produced, so that a missing wait fails deterministically.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ..core.deadline import Deadline
from ..core.ops import RedOpType, as_reduce_op, check_op_dtype
from . import handles
from .dtypes import DType, dtype, host_matches
from .errors import DeviceError
from .events import Event, Stream
from .handles import EVENT, MEMORY, Handle
from .ledger import Ledger
from .memory import Buffer, HostRegistration, Mapping, Memory, span


class Device(ABC):
    """One device of this process, as one rank uses it (module docstring)."""

    kind: ClassVar[str]
    #: True: work runs only when waited for and unproduced outputs read as poison.
    strict: ClassVar[bool] = False
    #: Replaces ``build`` (tests: a rank posing as one with another build).
    _build: str | None = None

    def __init__(self, index: int, rank: int | None = None):
        self.index = index
        self.rank = rank
        self._registered: list[HostRegistration] = []

    @property
    @abstractmethod
    def uuid(self) -> str:
        """The physical device's UUID (equal in every process using it)."""

    @property
    def build(self) -> str:
        """What this process drives the device with (CUDA: torch's and CUDA's versions): the
        ranks that share buffers must agree on it."""
        return self._build or self._describe_build()

    def _describe_build(self) -> str:
        return self.kind

    @property
    def where(self) -> str:
        """This rank and device, as messages name them."""
        device = f"{self.kind}:{self.index}"
        return device if self.rank is None else f"rank {self.rank}, {device}"

    def error(self, call: str, message: str) -> DeviceError:
        """A DeviceError for ``call`` made here."""
        return DeviceError(call, self.where, message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where})"

    # -- shareable memory -------------------------------------------------------------------

    def allocate(self, nbytes: int) -> Buffer:
        """``nbytes`` of device memory that peers can open (outside any caching allocator)."""
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"allocate: nbytes: expected a positive int, got {nbytes!r}")
        return Buffer(self, self._allocate(nbytes), nbytes)

    def export(self, memory: Buffer) -> bytes:
        """The handle of ``memory`` (the same bytes on every call) for peers to ``open``."""
        if isinstance(memory, Mapping):
            raise self.error("export", f"memory opened from {memory.source.exporter} cannot be exported again "
                             "(CUDA refuses it): copy it into a buffer of this process")
        buffer = self._mine(memory, Buffer, "export")
        if buffer.handle is None:
            ledger = Ledger.create()
            try:
                buffer.handle = handles.encode(Handle(MEMORY, self.kind, os.getpid(), self.rank, buffer.nbytes,
                                                      self.uuid, self._export(buffer.raw), ledger.name))
            except BaseException:
                ledger.retire()
                ledger.close()
                raise
            buffer.ledger = ledger
        return buffer.handle

    def open(self, handle: bytes) -> Mapping:
        """Map a peer's exported buffer (once per process and handle)."""
        source = self._decode(handle, MEMORY, "open")
        try:
            ledger = Ledger.attach(source.ledger)
        except FileNotFoundError:
            raise self.error("open", f"{source.exporter} freed that buffer: its handle is stale") from None
        try:
            ledger.register(self.rank)
            try:
                raw = self._open(source)
            except BaseException:
                ledger.unregister()
                raise
        except ValueError as error:
            ledger.close()
            raise self.error("open", f"{source.exporter}'s buffer: {error}") from None
        except BaseException:
            ledger.close()
            raise
        return Mapping(self, raw, source, ledger)

    def close(self, mapping: Mapping) -> None:
        """Unmap a peer's buffer; DeviceError while arrays or unfinished work still use it."""
        mapping = self._mine(mapping, Mapping, "close")
        self._refuse_in_use(mapping, "close")
        self._close(mapping.raw)
        mapping.closed = True
        mapping.ledger.unregister()
        mapping.ledger.close()

    def free(self, buffer: Buffer) -> None:
        """Give ``buffer`` back; DeviceError while it is in use here or open in a live peer."""
        if isinstance(buffer, Mapping):
            raise self.error("free", f"{buffer!r} belongs to its exporter: close it instead")
        buffer = self._mine(buffer, Buffer, "free")
        self._refuse_in_use(buffer, "free")
        if buffer.ledger is not None:
            try:
                buffer.ledger.retire()
            except ValueError as error:
                raise self.error("free", str(error)) from None
            buffer.ledger.close()
        self._free(buffer.raw)
        buffer.closed = True

    def view(self, memory: Memory, dtype_name: str, count: int | None = None, offset: int = 0) -> Any:
        """``count`` elements of ``dtype_name`` at byte ``offset`` of ``memory`` (default: to
        its end), as a 1-D array of this device. ``offset`` is a multiple of the element size."""
        memory = self._mine(memory, Memory, "view")
        kind = dtype(dtype_name)
        if not isinstance(offset, int) or offset < 0 or offset % kind.itemsize:
            raise ValueError(f"view: offset: expected a non-negative multiple of {kind.itemsize}, got {offset!r}")
        if count is None:
            count = max(0, memory.nbytes - offset) // kind.itemsize
        if not isinstance(count, int) or count < 0 or offset + count * kind.itemsize > memory.nbytes:
            raise ValueError(f"view: {count!r} elements of {kind.name} at offset {offset} do not fit "
                             f"{memory.nbytes} bytes")
        return self._view(memory.raw, kind, count, offset)

    def _mine(self, memory: Any, cls: type, call: str) -> Any:
        if not isinstance(memory, cls):
            raise TypeError(f"{call}: expected a {cls.__name__} of this device, got {type(memory).__name__}")
        assert isinstance(memory, Memory)
        if memory.device is not self:
            raise ValueError(f"{call}: {memory!r} belongs to {memory.device!r}, not {self!r}")
        if memory.closed:
            raise self.error(call, f"{memory!r} was already {'freed' if isinstance(memory, Buffer) else 'closed'}")
        return memory

    def _refuse_in_use(self, memory: Memory, call: str) -> None:
        use = self._in_use(memory.raw)
        if use:
            raise self.error(call, f"{memory!r} is still in use ({use}): synchronize and drop its arrays first")

    def _decode(self, handle: bytes, what: bytes, call: str) -> Handle:
        try:
            source = handles.decode(handle)
        except (TypeError, ValueError) as error:
            raise self.error(call, f"not a device handle: {error}") from None
        if source.what != what:
            raise self.error(call, f"the handle is of {'an event' if source.what == EVENT else 'memory'}")
        if source.kind != self.kind:
            raise self.error(call, f"the handle comes from a {source.kind} device; this one is {self.kind}")
        if source.pid == os.getpid():
            raise self.error(call, "the handle was exported by this process (CUDA refuses to open it "
                             "here): use the original")
        return source

    # -- arrays -----------------------------------------------------------------------------

    def empty(self, shape: Sequence[int] | int, dtype_name: str) -> Any:
        """A new array of this device (uninitialised), as users' tensors are."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(not isinstance(n, int) or n < 0 for n in shape):
            raise ValueError(f"empty: shape: expected non-negative ints, got {shape!r}")
        return self._empty(shape, dtype(dtype_name))

    def flat(self, array: Any) -> Any:
        """``array`` as a 1-D view of its elements (the same memory); ValueError when it is not
        contiguous (copy it into an ``empty`` one first)."""
        _, shape, contiguous = self.describe(array)
        if not contiguous:
            raise ValueError(f"flat: {array!r} is not contiguous")
        return self._reshape_device(array, (int(np.prod(shape)),))

    def to_host(self, array: Any, stream: Stream, deadline: Deadline) -> np.ndarray:
        """A host copy of ``array`` once ``stream``'s work so far is done (bfloat16 as int16
        bits, as pydist.core.buffers holds it)."""
        kind, shape, _ = self.describe(array)
        host = np.empty(shape, np.int16 if kind.name == "bfloat16" else kind.compute)
        self.copy(host, array, stream)
        stream.synchronize(deadline, "a copy to the host")
        return host

    def from_host(self, host: np.ndarray, dtype_name: str, stream: Stream) -> Any:
        """A new array holding ``host``'s values, copied on ``stream`` (keep ``host`` as it is
        until the stream has run)."""
        array = self.empty(np.shape(host), dtype_name)
        self.copy(array, host, stream)
        return array

    # -- work on a stream -------------------------------------------------------------------

    def copy(self, dst: Any, src: Any, stream: Stream) -> None:
        """Enqueue ``dst[...] = src`` on ``stream``: device or host arrays (not both host) of one
        dtype and element count; of two shapes, the contiguous one is read in the other's."""
        self._check_stream(stream, "copy")
        if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
            raise TypeError("copy: dst and src are both host arrays: one must be an array of this device")
        if isinstance(dst, np.ndarray) and not dst.flags.writeable:
            raise ValueError("copy: dst is a read-only host array")
        for name, value in (("dst", dst), ("src", src)):
            if isinstance(value, np.ndarray) and any(step < 0 for step in value.strides):
                raise ValueError(f"copy: host {name} has a negative stride (torch cannot view it)")
        kind = self._common_dtype(dst, src, "copy")
        dst, src = self._conform(dst, src, "copy")
        self._copy(dst, src, kind, stream)

    def reduce_into(self, dst: Any, src: Any, op: object, stream: Stream) -> None:
        """Enqueue ``dst = dst op src`` (arrays of this device) on ``stream``. AVG and PREMUL_SUM
        add here: ``prescale`` before and ``postscale`` after make them."""
        self._check_stream(stream, "reduce_into")
        reduce = as_reduce_op(op)
        for name, value in (("dst", dst), ("src", src)):
            if isinstance(value, np.ndarray):
                raise TypeError(f"reduce_into: {name} is a host array; reduce arrays of this device")
        kind = self._common_dtype(dst, src, "reduce_into")
        check_op_dtype(reduce, kind.compute, kind.name)
        dst, src = self._conform(dst, src, "reduce_into")
        self._reduce(dst, src, reduce.op, kind, stream)

    def prescale(self, array: Any, op: object, stream: Stream) -> None:
        """Enqueue PREMUL_SUM's multiplication by its factor (other ops: nothing)."""
        reduce = as_reduce_op(op)
        if reduce.op == RedOpType.PREMUL_SUM:
            kind = self._check_scaled(array, reduce, stream, "prescale")
            assert reduce.factor is not None  # as_reduce_op refuses PREMUL_SUM without one
            factor = float(reduce.factor) if kind.kind == "f" else int(reduce.factor)
            self._multiply(array, factor, kind, stream)

    def postscale(self, array: Any, op: object, group_size: int, stream: Stream) -> None:
        """Enqueue AVG's division by ``group_size`` (integers truncate toward zero, as NCCL);
        other ops: nothing."""
        reduce = as_reduce_op(op)
        if reduce.op == RedOpType.AVG:
            if not isinstance(group_size, int) or group_size < 1:
                raise ValueError(f"postscale: group_size: expected a positive int, got {group_size!r}")
            kind = self._check_scaled(array, reduce, stream, "postscale")
            self._divide(array, group_size, kind, stream)

    def _check_scaled(self, array: Any, reduce: Any, stream: Stream, call: str) -> DType:
        self._check_stream(stream, call)
        kind = self.describe(array)[0]
        check_op_dtype(reduce, kind.compute, kind.name)
        return kind

    def _check_stream(self, stream: Stream, call: str) -> None:
        if not isinstance(stream, Stream) or stream.device is not self:
            raise ValueError(f"{call}: stream: expected a stream of {self!r}, got {stream!r}")

    def _common_dtype(self, dst: Any, src: Any, call: str) -> DType:
        device_side = [self.describe(a)[0] for a in (dst, src) if not isinstance(a, np.ndarray)]
        kind = device_side[0]
        if any(other.name != kind.name for other in device_side):
            raise TypeError(f"{call}: dst is {self.describe(dst)[0].name}, src is {self.describe(src)[0].name}")
        for name, value in (("dst", dst), ("src", src)):
            if isinstance(value, np.ndarray) and not host_matches(value, kind.name):
                raise TypeError(f"{call}: host {name} of {value.dtype} cannot hold {kind.name}")
        return kind

    def _shape(self, array: Any) -> tuple[tuple[int, ...], bool]:
        if isinstance(array, np.ndarray):
            return array.shape, array.flags.c_contiguous
        _, shape, contiguous = self.describe(array)
        return shape, contiguous

    def _conform(self, dst: Any, src: Any, call: str) -> tuple[Any, Any]:
        (dst_shape, dst_dense), (src_shape, src_dense) = self._shape(dst), self._shape(src)
        if dst_shape == src_shape:
            return dst, src
        if int(np.prod(dst_shape)) != int(np.prod(src_shape)):
            raise ValueError(f"{call}: dst has shape {dst_shape}, src {src_shape}: not one element count")
        if dst_dense:
            return self._reshape(dst, src_shape), src
        if src_dense:
            return dst, self._reshape(src, dst_shape)
        raise ValueError(f"{call}: dst {dst_shape} and src {src_shape} differ in shape and neither is contiguous")

    def _reshape(self, array: Any, shape: tuple[int, ...]) -> Any:
        if isinstance(array, np.ndarray):
            return array.reshape(shape)
        return self._reshape_device(array, shape)

    # -- host memory ------------------------------------------------------------------------

    def register_host(self, array: np.ndarray) -> HostRegistration:
        """Pin ``array``'s memory in place (C-contiguous, writable, not empty) until the
        registration's ``unregister``; copies to and from it can then run asynchronously."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError("register_host: expected a writable C-contiguous numpy array")
        if array.nbytes == 0:
            raise ValueError("register_host: the array is empty")
        start, end = span(array)
        for other in self._registered:
            if start < other.span[1] and other.span[0] < end:
                raise self.error("register_host", "that memory overlaps memory registered already")
        registration = HostRegistration(self, array, self._register(array))
        self._registered.append(registration)
        return registration

    # -- what each implementation supplies --------------------------------------------------

    @abstractmethod
    def describe(self, array: Any) -> tuple[DType, tuple[int, ...], bool]:
        """(dtype, shape, contiguous) of an array of this device; ValueError for another's."""

    @abstractmethod
    def current_stream(self) -> Stream:
        """The stream the caller's work goes to (torch's current stream on CUDA)."""

    @abstractmethod
    def new_stream(self) -> Stream:
        """A stream of its own (a group's)."""

    @abstractmethod
    def event(self, interprocess: bool = False) -> Event:
        """A new event (``interprocess``: one peers can open)."""

    @abstractmethod
    def open_event(self, handle: bytes) -> Event:
        """A peer's exported event, to wait on (not to record)."""

    @abstractmethod
    def keep_alive(self, array: Any, stream: Stream) -> None:
        """Keep ``array``'s memory from reuse until ``stream``'s work so far is done."""

    @abstractmethod
    def delay(self, seconds: float, stream: Stream) -> None:
        """Enqueue a pause of about ``seconds`` on ``stream`` (tests)."""

    @abstractmethod
    def _allocate(self, nbytes: int) -> Any: ...

    @abstractmethod
    def _export(self, raw: Any) -> bytes: ...

    @abstractmethod
    def _open(self, source: Handle) -> Any: ...

    @abstractmethod
    def _in_use(self, raw: Any) -> str | None:
        """What still uses the memory ``raw`` (arrays, unfinished work), or None."""

    @abstractmethod
    def _close(self, raw: Any) -> None: ...

    @abstractmethod
    def _free(self, raw: Any) -> None: ...

    @abstractmethod
    def _view(self, raw: Any, kind: DType, count: int, offset: int) -> Any: ...

    @abstractmethod
    def _empty(self, shape: tuple[int, ...], kind: DType) -> Any: ...

    @abstractmethod
    def _reshape_device(self, array: Any, shape: tuple[int, ...]) -> Any: ...

    @abstractmethod
    def _copy(self, dst: Any, src: Any, kind: DType, stream: Stream) -> None: ...

    @abstractmethod
    def _reduce(self, dst: Any, src: Any, op: RedOpType, kind: DType, stream: Stream) -> None: ...

    @abstractmethod
    def _multiply(self, array: Any, factor: float | int, kind: DType, stream: Stream) -> None: ...

    @abstractmethod
    def _divide(self, array: Any, divisor: int, kind: DType, stream: Stream) -> None: ...

    @abstractmethod
    def _register(self, array: np.ndarray) -> Any: ...

    @abstractmethod
    def _unregister(self, raw: Any) -> None: ...
