"""The CUDA device: torch's streams, events and kernels, and the CUDA runtime for IPC.

Behaviour
    Buffers are ``cudaMalloc``ed outside torch's caching allocator (pydist.device.cudart), so a
    handle covers exactly one buffer, stays valid until ``free``, and can be opened by every
    peer once (torch's own ``reduce_tensor`` handles may be rebuilt only once per export:
    pytorch#149187). ``export`` is ``cudaIpcGetMemHandle`` (64 bytes), ``open``
    ``cudaIpcOpenMemHandle``, ``close`` ``cudaIpcCloseMemHandle``. A buffer or mapping is seen
    as a flat uint8 tensor through ``__cuda_array_interface__`` (``torch.as_tensor``: the
    tensor's storage holds the memory object, so ``close`` and ``free`` refuse while any
    tensor over it lives; work already enqueued is not seen: synchronize the streams that
    used a mapping before closing it, as the strict stand-in insists). Streams are
    ``torch.cuda.Stream``\\ s, events ``torch.cuda.Event(interprocess=...)`` shared by
    ``ipc_handle()`` /
    ``torch.cuda.Event.from_ipc_handle``; copies and reductions are torch ops
    (pydist.device.torch_device) under ``torch.cuda.stream``. ``keep_alive`` is
    ``Tensor.record_stream``; ``register_host`` is ``cudaHostRegister``; ``delay`` is
    ``torch.cuda._sleep``; ``uuid`` is the device's UUID (physical, whatever
    CUDA_VISIBLE_DEVICES says).

    Importing this module needs neither torch nor CUDA; making a :class:`CudaDevice` needs both.

Failure modes
    No CUDA: DeviceError at construction. A CUDA error from the runtime or from a torch call
    made here: DeviceError naming the call, the rank and the device, the original as cause.
    (What has not run on a GPU yet is listed in docs/guide/gpu.md.)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .cudart import Runtime
from .errors import DeviceError
from .events import Event, Stream
from .handles import EVENT, Handle
from .torch_device import TorchDevice, storages_over

#: Clock rate assumed for ``delay`` where torch does not report the device's (cycles per second).
_CYCLES_PER_S = 1.5e9


class ArrayInterface:
    """``nbytes`` of device memory at ``pointer`` as torch reads them (``__cuda_array_interface__``);
    every tensor made from it holds it, which is how ``close`` and ``free`` see them."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 2}


class CudaMemory:
    """Device memory at ``pointer`` (``nbytes``): ``cudaMalloc``ed or opened from a peer."""

    def __init__(self, pointer: int, nbytes: int):
        self.pointer = pointer
        self.nbytes = nbytes
        self.interface = ArrayInterface(pointer, nbytes)


class CudaStream(Stream):
    """A ``torch.cuda.Stream``."""

    def __init__(self, device: CudaDevice, raw: Any):
        super().__init__(device)
        self.cuda = device
        self.raw = raw

    def _wait_event(self, event: Event) -> None:
        if not isinstance(event, CudaEvent):
            raise TypeError(f"wait_event: expected an event of {self.device!r}, got {type(event).__name__}")
        with self.cuda._calling("wait_event"):
            self.raw.wait_event(event.raw)


class CudaEvent(Event):
    """A ``torch.cuda.Event`` (interprocess ones without timing, as CUDA requires)."""

    def __init__(self, device: CudaDevice, raw: Any, interprocess: bool, source: Handle | None = None):
        super().__init__(device, interprocess, source)
        self.cuda = device
        self.raw = raw

    def _record(self, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        with self.cuda._calling("record"):
            self.raw.record(stream.raw)

    def query(self) -> bool:
        with self.cuda._calling("cudaEventQuery"):
            return bool(self.raw.query())

    def _payload(self) -> bytes:
        with self.cuda._calling("ipc_handle"):
            return bytes(self.raw.ipc_handle())


class CudaDevice(TorchDevice):
    """One CUDA device of this process (module docstring)."""

    kind = "cuda"

    def __init__(self, index: int = 0, rank: int | None = None):
        import torch

        if not torch.cuda.is_available():
            raise DeviceError("init", f"rank {rank}, cuda:{index}", "torch.cuda.is_available() is False")
        super().__init__(index, rank, torch.device("cuda", index))
        torch.cuda.init()
        self.runtime = Runtime.load(self.where)
        properties = torch.cuda.get_device_properties(index)
        self._uuid = str(properties.uuid)
        rate = getattr(properties, "clock_rate", 0)  # kHz, where torch reports it
        self._cycles_per_s = rate * 1e3 if rate else _CYCLES_PER_S
        self._streams: dict[int, Stream] = {}

    @property
    def uuid(self) -> str:
        return self._uuid

    def _describe_build(self) -> str:
        runtime, driver = self.runtime.versions()
        return (f"cuda: torch {self.torch.__version__} built for CUDA {self.torch.version.cuda}, runtime {runtime}, "
                f"driver {driver}")

    @contextlib.contextmanager
    def _calling(self, call: str) -> Iterator[None]:
        """Run a torch call on this device; its RuntimeError as DeviceError naming ``call``."""
        try:
            with self.torch.cuda.device(self.index):
                yield
        except DeviceError:
            raise
        except RuntimeError as error:
            raise self.error(call, str(error)) from error

    # -- memory ------------------------------------------------------------------------------

    def _allocate(self, nbytes: int) -> CudaMemory:
        with self._calling("cudaMalloc"):
            return CudaMemory(self.runtime.malloc(nbytes), nbytes)

    def _export(self, raw: CudaMemory) -> bytes:
        with self._calling("cudaIpcGetMemHandle"):
            return self.runtime.ipc_get_mem_handle(raw.pointer)

    def _open(self, source: Handle) -> CudaMemory:
        with self._calling("cudaIpcOpenMemHandle"):
            return CudaMemory(self.runtime.ipc_open_mem_handle(source.payload), source.nbytes)

    def _bytes(self, raw: CudaMemory) -> Any:
        with self._calling("view"):
            tensor = self.torch.as_tensor(raw.interface, device=self.torch_device)
        if tensor.data_ptr() != raw.pointer:
            raise self.error("view", f"torch made a copy of the memory at {raw.pointer:#x} instead of viewing it")
        return tensor

    def _in_use(self, raw: CudaMemory) -> str | None:
        return storages_over(raw, "interface")

    def _close(self, raw: CudaMemory) -> None:
        with self._calling("cudaIpcCloseMemHandle"):
            self.runtime.ipc_close_mem_handle(raw.pointer)

    def _free(self, raw: CudaMemory) -> None:
        with self._calling("cudaFree"):
            self.runtime.free(raw.pointer)

    # -- streams, events, work -----------------------------------------------------------------

    @contextlib.contextmanager
    def _on(self, stream: Stream, call: str) -> Iterator[None]:
        assert isinstance(stream, CudaStream)
        with self._calling(call), self.torch.cuda.stream(stream.raw):
            yield

    def _stream(self, raw: Any) -> Stream:
        """The one CudaStream of torch stream ``raw`` (it remembers the peers it waited on)."""
        return self._streams.setdefault(raw.cuda_stream, CudaStream(self, raw))

    def current_stream(self) -> Stream:
        return self._stream(self.torch.cuda.current_stream(self.index))

    def new_stream(self) -> Stream:
        with self._calling("new_stream"):
            return self._stream(self.torch.cuda.Stream(device=self.index))

    def event(self, interprocess: bool = False) -> Event:
        with self._calling("event"):
            return CudaEvent(self, self.torch.cuda.Event(interprocess=interprocess), interprocess)

    def open_event(self, handle: bytes) -> Event:
        source = self._decode(handle, EVENT, "open_event")
        with self._calling("Event.from_ipc_handle"):
            raw = self.torch.cuda.Event.from_ipc_handle(self.torch_device, source.payload)
        return CudaEvent(self, raw, True, source)

    def keep_alive(self, array: Any, stream: Stream) -> None:
        self.describe(array)
        assert isinstance(stream, CudaStream)
        with self._calling("record_stream"):
            array.record_stream(stream.raw)

    def delay(self, seconds: float, stream: Stream) -> None:
        with self._on(stream, "torch.cuda._sleep"):
            self.torch.cuda._sleep(int(seconds * self._cycles_per_s))

    def _register(self, array: np.ndarray) -> int:
        pointer = int(array.ctypes.data)
        self.runtime.host_register(pointer, array.nbytes)
        return pointer

    def _unregister(self, raw: int) -> None:
        self.runtime.host_unregister(raw)

