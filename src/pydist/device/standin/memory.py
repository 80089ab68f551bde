"""The stand-in's device memory: allocations, the arrays over them, the references work holds.

Behaviour
    An :class:`Allocation` is device bytes: a /dev/shm file for a shareable buffer (its own or
    a peer's, mapped), process memory for an ``empty`` array, or a host array that work copies
    to or from. It counts what uses it: live :class:`StandinArray` objects (``arrays``) and
    work not yet run (``users``); it lists the captured writes not yet applied
    (``pending_writes``, see pydist.device.standin.scheduler) and the ``keep_alive`` streams.

    A :class:`StandinArray` is what a CUDA tensor is to torch: a typed, shaped (strided) view
    of device memory that the host reads only through a copy. It slices like numpy (basic
    slices, steps included), ``reshape``s when contiguous. Work does not hold arrays, only
    :class:`Ref`\\ s to their bytes, so an ``empty`` array whose last array object is dropped goes
    back to the allocator at once, as with torch's caching allocator: work of other streams
    that is not ordered before that point (nor kept with ``keep_alive``) raises DeviceError
    when it runs (pydist.device.standin.scheduler.Scheduler.dropped).
"""
from __future__ import annotations

import mmap
import weakref
from typing import Any

import numpy as np

from ..dtypes import DType


class Allocation:
    """Device (or host) bytes and what uses them (module docstring)."""

    def __init__(self, bits: np.ndarray, label: str, private: bool = False, mapped: mmap.mmap | None = None,
                 name: str = "", root: Any = None):
        self.bits: np.ndarray | None = bits  # uint8, 1-D
        self.label = label
        self.private = private  # an ``empty`` array's: freed when its last array is dropped
        self.mapped = mapped
        self.name = name
        self.root = root  # a host array's base, kept while work uses it
        self.arrays = 0
        self.users = 0
        self.pending_writes: list[Any] = []
        self.stream: Any = None  # an ``empty`` array's: the stream it was made for
        self.kept: list[Any] = []  # streams named by keep_alive
        self.freed = False  # an ``empty`` array's last array object is gone
        self.freed_clock: dict[Any, int] = {}  # then: the work that may still touch it
        self.overlay = True  # whether captured writes can be laid over a copy of ``bits``

    def base(self) -> int:
        """The address of the first byte."""
        assert self.bits is not None
        return int(self.bits.__array_interface__["data"][0])

    def release(self) -> None:
        """Unmap (shared memory); ValueError if numpy views of it are still alive."""
        self.bits = None
        if self.mapped is not None:
            try:
                self.mapped.close()
            except BufferError:
                self.bits = np.frombuffer(self.mapped, np.uint8)
                raise ValueError("views of its bytes are still alive") from None

    def __repr__(self) -> str:
        return self.label


class Ref:
    """A typed (possibly strided) range of an allocation that an operation reads or writes."""

    __slots__ = ("allocation", "bits", "kind")

    def __init__(self, allocation: Allocation, bits: np.ndarray, kind: DType):
        self.allocation = allocation
        self.bits = bits  # in kind.storage, a view into allocation.bits (or a host array)
        self.kind = kind

    def placed(self, memory: np.ndarray) -> np.ndarray:
        """This range's elements within ``memory``, a copy of the allocation's bytes."""
        offset = int(self.bits.__array_interface__["data"][0]) - self.allocation.base()
        return np.ndarray(self.bits.shape, self.bits.dtype, buffer=memory, offset=offset, strides=self.bits.strides)

    def poison(self) -> None:
        """Fill the range with the poison of its dtype."""
        self.bits[...] = self.kind.storage.type(self.kind.poison)


class StandinArray:
    """An array of the stand-in device: ``shape``, ``dtype`` (a name), slicing, ``reshape``."""

    __slots__ = ("device", "allocation", "kind", "bits", "__weakref__")

    def __init__(self, device: Any, allocation: Allocation, kind: DType, bits: np.ndarray):
        self.device = device
        self.allocation = allocation
        self.kind = kind
        self.bits = bits
        allocation.arrays += 1
        weakref.finalize(self, device._array_dropped, allocation)

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(self.bits.shape)

    @property
    def dtype(self) -> str:
        """The element type's name (``float32``, ``bfloat16``...)."""
        return self.kind.name

    def numel(self) -> int:
        """The number of elements."""
        return int(self.bits.size)

    def is_contiguous(self) -> bool:
        """Whether the elements are dense in row-major order."""
        return bool(self.bits.flags.c_contiguous)

    def __getitem__(self, key: Any) -> StandinArray:
        parts = key if isinstance(key, tuple) else (key,)
        if not all(isinstance(part, (int, slice)) or part is Ellipsis for part in parts):
            raise TypeError("index a stand-in array with ints and slices (a view, as on a device)")
        if any(isinstance(part, slice) and (part.step or 1) < 0 for part in parts):
            raise ValueError("a negative step: torch tensors have none, so neither do stand-in arrays")
        bits = self.bits[key]
        if not isinstance(bits, np.ndarray):
            raise TypeError("an element of a stand-in array is not on the host: index with slices")
        return StandinArray(self.device, self.allocation, self.kind, bits)

    def reshape(self, *shape: Any) -> StandinArray:
        """The same elements in ``shape`` (contiguous arrays only, as torch's ``view``)."""
        wanted = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if not self.is_contiguous():
            raise ValueError("reshape of a non-contiguous stand-in array: it would need a copy")
        return StandinArray(self.device, self.allocation, self.kind, self.bits.reshape(wanted))

    def __len__(self) -> int:
        return len(self.bits)

    def __repr__(self) -> str:
        return f"StandinArray({self.kind.name}, shape={self.shape}, in {self.allocation!r})"


def host_ref(array: np.ndarray, kind: DType, registry: dict[int, Allocation]) -> Ref:
    """A Ref to a host array, in one Allocation per underlying array (``registry``, keyed by
    its id while work uses it), so that captured writes to it are seen by later reads."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        root = array  # no common bytes to overlay: this array on its own
    allocation = registry.get(id(root))
    if allocation is None:
        # a non-contiguous array on its own: its values as they are when read (no overlay)
        bits = root.reshape(-1).view(np.uint8) if root.flags.c_contiguous else np.zeros(0, np.uint8)
        allocation = registry[id(root)] = Allocation(bits, f"host array {array.shape} {array.dtype}", root=root)
        allocation.overlay = root.flags.c_contiguous
    return Ref(allocation, array.view(kind.storage), kind)
