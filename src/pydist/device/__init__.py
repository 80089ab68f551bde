"""pydist's device layer: the one place that knows CUDA (issue 47, item 1).

The interface (``interface.Device``, with ``memory``, ``events``) gives shareable device
buffers outside any caching allocator and their handles, streams, events (interprocess ones
too), asynchronous copies and reductions, host-memory registration and device identity; it
enforces CUDA's IPC rules the same way for every implementation. Implementations:

- ``cuda``: CUDA through torch (streams, events, kernels) and ctypes on torch's libcudart
  (``cudart``: cudaMalloc, cudaIpc*MemHandle, cudaHostRegister);
- ``standin``: the strict CPU stand-in the tests run on: lazy streams, poisoned outputs,
  IPC over /dev/shm, so that a missing wait fails deterministically;
- ``torch_cpu``: torch CPU tensors in shared memory, eager: the torch half of the CUDA path.

Shared pieces: ``handles`` (the envelope of a handle), ``ledger`` (who has a buffer open),
``event_counters`` (an interprocess event's epochs), ``shm_files``, ``dtypes``, ``errors``.
For the engine: ``arrays`` (which device a user's tensor is on, and its Device), ``peers`` (a
group's ranks share buffers and events once), ``pinned_pool`` and ``staged_schedule`` (the
staged path across hosts). ``open_device(kind, index, rank)``
makes a device; ``unavailable(kind)`` says why one cannot be made here. Nothing here imports
torch until a torch-backed device is made. docs/guide/gpu.md has the rules and what has run
on a GPU.
"""
from __future__ import annotations

from .errors import DeviceError
from .interface import Device

KINDS = ("standin", "torch-cpu", "cuda")

__all__ = ["KINDS", "Device", "DeviceError", "open_device", "unavailable"]


def unavailable(kind: str) -> str | None:
    """Why a device of ``kind`` cannot be made in this process, or None when it can."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "standin":
        return None
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if kind == "cuda" and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def open_device(kind: str, index: int = 0, rank: int | None = None) -> Device:
    """A device of ``kind`` (one of KINDS) at ``index``, used by ``rank`` (for messages)."""
    reason = unavailable(kind)
    if reason is not None:
        raise DeviceError("open_device", f"rank {rank}, {kind}:{index}", reason)
    if kind == "standin":
        from .standin import StandinDevice
        return StandinDevice(index, rank)
    if kind == "torch-cpu":
        from .torch_cpu import TorchCpuDevice
        return TorchCpuDevice(index, rank)
    from .cuda import CudaDevice
    return CudaDevice(index, rank)
