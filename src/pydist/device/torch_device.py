"""What the CUDA and the torch-CPU devices share: arrays are torch tensors, work is torch ops.

Behaviour
    Arrays are ``torch.Tensor`` objects on the device (``describe`` refuses another device's,
    naming both). A buffer's bytes are a flat uint8 tensor (``_bytes``, the implementation's
    own way there); ``view`` slices it and reinterprets the slice as the dtype. Copies are
    ``Tensor.copy_(non_blocking=True)``, host arrays through ``torch.from_numpy`` (bfloat16 as
    its int16 bits); the reductions are the in-place torch ops of each ReduceOp (``KERNELS``),
    prescale ``mul_``, postscale ``div_`` (integers ``rounding_mode="trunc"``), all under the
    implementation's ``_on(stream)``. torch is imported when a device is made, never at import.

Failure modes
    A tensor of an unsupported dtype: TypeError naming it; on another device: ValueError.
"""
from __future__ import annotations

import contextlib
import sys
from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..core.ops import RedOpType
from .dtypes import DType, dtype
from .events import Stream
from .interface import Device


def _kernels() -> dict[RedOpType, Callable[[Any, Any], Any]]:
    import torch

    def add(dst: Any, src: Any) -> Any:
        return dst.add_(src)

    return {
        RedOpType.SUM: add,
        RedOpType.AVG: add,
        RedOpType.PREMUL_SUM: add,
        RedOpType.PRODUCT: lambda dst, src: dst.mul_(src),
        RedOpType.MIN: lambda dst, src: torch.minimum(dst, src, out=dst),
        RedOpType.MAX: lambda dst, src: torch.maximum(dst, src, out=dst),
        RedOpType.BAND: lambda dst, src: dst.bitwise_and_(src),
        RedOpType.BOR: lambda dst, src: dst.bitwise_or_(src),
        RedOpType.BXOR: lambda dst, src: dst.bitwise_xor_(src),
    }


def storages_over(raw: object, owner: str) -> str | None:
    """What holds ``raw``'s attribute ``owner``, the object torch tensors over the memory
    hold (each tensor's storage keeps one reference to it), besides ``raw`` itself."""
    uses = sys.getrefcount(getattr(raw, owner)) - 2  # raw's reference, getrefcount's argument
    return f"{uses} tensor storage{'s' if uses > 1 else ''} over it" if uses > 0 else None


class TorchDevice(Device):
    """A device whose arrays are torch tensors on ``torch_device``."""

    def __init__(self, index: int, rank: int | None, torch_device: Any):
        super().__init__(index, rank)
        import torch

        self.torch = torch
        self.torch_device = torch_device
        self._kernels = _kernels()

    @abstractmethod
    def _bytes(self, raw: Any) -> Any:
        """A flat uint8 tensor over the memory ``raw``."""

    @abstractmethod
    def _on(self, stream: Stream, call: str) -> contextlib.AbstractContextManager[Any]:
        """The context in which torch ops of ``call`` run on ``stream``."""


    def describe(self, array: Any) -> tuple[DType, tuple[int, ...], bool]:
        if not isinstance(array, self.torch.Tensor):
            raise TypeError(f"expected a torch tensor on {self.torch_device}, got {type(array).__name__}")
        if array.device != self.torch_device:
            raise ValueError(f"a tensor on {array.device} given to {self!r} ({self.torch_device})")
        name = str(array.dtype).removeprefix("torch.")
        return dtype(name), tuple(array.shape), array.is_contiguous()

    def _torch_dtype(self, kind: DType) -> Any:
        return getattr(self.torch, kind.name)

    def _view(self, raw: Any, kind: DType, count: int, offset: int) -> Any:
        return self._bytes(raw)[offset:offset + count * kind.itemsize].view(self._torch_dtype(kind))

    def _empty(self, shape: tuple[int, ...], kind: DType) -> Any:
        return self.torch.empty(shape, dtype=self._torch_dtype(kind), device=self.torch_device)

    def _reshape_device(self, array: Any, shape: tuple[int, ...]) -> Any:
        return array.view(shape)

    def _host(self, array: Any, kind: DType) -> Any:
        """``array`` as a tensor: a host array through ``torch.from_numpy`` (zero copy)."""
        if not isinstance(array, np.ndarray):
            return array
        if kind.name == "bfloat16":
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(array)

    def _copy(self, dst: Any, src: Any, kind: DType, stream: Stream) -> None:
        with self._on(stream, "copy"):
            self._host(dst, kind).copy_(self._host(src, kind), non_blocking=True)

    def _reduce(self, dst: Any, src: Any, op: RedOpType, kind: DType, stream: Stream) -> None:
        with self._on(stream, f"reduce_into {op.name}"):
            self._kernels[op](dst, src)

    def _multiply(self, array: Any, factor: float | int, kind: DType, stream: Stream) -> None:
        with self._on(stream, "prescale"):
            array.mul_(factor)

    def _divide(self, array: Any, divisor: int, kind: DType, stream: Stream) -> None:
        with self._on(stream, "postscale"):
            if kind.kind == "f":
                array.div_(divisor)
            else:
                array.div_(divisor, rounding_mode="trunc")


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    """A context that does nothing (eager streams)."""
    yield
