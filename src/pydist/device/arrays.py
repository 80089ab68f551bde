"""Which device an array lives on, and the Device object a rank uses for it.

Behaviour
    ``kind_of(obj)`` (pydist.core.buffers.device_kind) says what a user's tensor is without
    importing anything: "standin" for an array of the strict stand-in, the device type of a
    torch tensor that is not on the CPU ("cuda"), None for host memory.
    ``where(obj)`` names its device for messages ("cuda:1", "standin:0"). ``device_for(obj,
    rank)`` is the Device that runs work on it: a stand-in array's own device, or this
    process's CudaDevice of the tensor's index (one per index, made on first use).

Failure modes
    ``device_for`` on anything but a device tensor: ValueError; on CUDA without a usable
    runtime: DeviceError (pydist.device.cuda).
"""
from __future__ import annotations

from typing import Any

from ..core.buffers import device_kind
from .interface import Device

_CUDA: dict[int, Device] = {}


kind_of = device_kind


def where(obj: Any) -> str:
    """The device of a device array, as messages name it."""
    if kind_of(obj) == "standin":
        return f"standin:{obj.device.index}"
    return str(obj.device)


def device_for(obj: Any, rank: int | None) -> Device:
    """The Device that runs work on device array ``obj`` in this process (``rank``: for messages)."""
    kind = kind_of(obj)
    if kind == "standin":
        device: Device = obj.device
        return device
    if kind != "cuda":
        raise ValueError(f"{obj!r} is not a device tensor pydist moves (CUDA, or the test stand-in)")
    index = obj.device.index if obj.device.index is not None else 0
    found = _CUDA.get(index)
    if found is None:
        from .cuda import CudaDevice
        found = _CUDA[index] = CudaDevice(index, rank)
    return found
