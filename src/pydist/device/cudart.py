"""The CUDA runtime calls torch does not offer, through ctypes on the libcudart torch loaded.

Behaviour
    ``Runtime.load(where)`` finds the libcudart already mapped into this process (torch's, once
    ``torch.cuda.init()`` ran; read from /proc/self/maps, as vLLM's ``cuda_wrapper`` does),
    else ``libcudart.so`` by name, and declares the calls pydist needs: ``cudaMalloc`` /
    ``cudaFree`` (buffers outside torch's caching allocator), ``cudaIpcGetMemHandle`` /
    ``cudaIpcOpenMemHandle`` (with ``cudaIpcMemLazyEnablePeerAccess``) /
    ``cudaIpcCloseMemHandle``, ``cudaHostRegister`` (portable) / ``cudaHostUnregister``, and the
    runtime's and driver's versions. A ``cudaIpcMemHandle_t`` is ``CUDA_IPC_HANDLE_SIZE`` = 64
    bytes, passed to ``cudaIpcOpenMemHandle`` by value (torch's own memory handles are 66 bytes
    or more: a version byte, a type byte, then this; not what this module makes).

Failure modes
    No libcudart: DeviceError saying so. A call returning an error: DeviceError naming the
    call, ``where`` (rank and device), the error code and CUDA's own message.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from .errors import DeviceError

IPC_HANDLE_SIZE = 64
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess
_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable


class IpcMemHandle(ctypes.Structure):
    """``cudaIpcMemHandle_t``: 64 opaque bytes."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


_POINTER = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES: dict[str, list[Any]] = {
    "cudaMalloc": [_POINTER, ctypes.c_size_t],
    "cudaFree": [ctypes.c_void_p],
    "cudaIpcGetMemHandle": [ctypes.POINTER(IpcMemHandle), ctypes.c_void_p],
    "cudaIpcOpenMemHandle": [_POINTER, IpcMemHandle, ctypes.c_uint],
    "cudaIpcCloseMemHandle": [ctypes.c_void_p],
    "cudaHostRegister": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
    "cudaHostUnregister": [ctypes.c_void_p],
    "cudaRuntimeGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cudaDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
}


def loaded_library(fragment: str = "libcudart") -> str | None:
    """The path of a shared library mapped into this process whose name has ``fragment``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if fragment in path.rsplit("/", 1)[-1]:
                    return path
    except OSError:
        return None
    return None


class Runtime:
    """The CUDA runtime of this process, its calls checked (module docstring)."""

    def __init__(self, library: ctypes.CDLL, path: str, where: str):
        self.path = path
        self.where = where
        self._lib = library
        for name, arguments in _SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes, function.restype = arguments, ctypes.c_int
        library.cudaGetErrorString.argtypes, library.cudaGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p

    @classmethod
    def load(cls, where: str) -> Runtime:
        """The libcudart torch loaded (call after ``torch.cuda.init()``)."""
        path = loaded_library() or ctypes.util.find_library("cudart")
        if path is None:
            raise DeviceError("load libcudart", where, "no CUDA runtime library is loaded or found")
        return cls(ctypes.CDLL(path), path, where)

    def _check(self, call: str, code: int) -> None:
        if code != 0:
            message = self._lib.cudaGetErrorString(code)
            text = message.decode(errors="replace") if message else "unknown error"
            raise DeviceError(call, self.where, f"CUDA error {code}: {text}")

    def malloc(self, nbytes: int) -> int:
        """``cudaMalloc`` on the current device: the pointer."""
        pointer = ctypes.c_void_p()
        self._check("cudaMalloc", self._lib.cudaMalloc(ctypes.byref(pointer), nbytes))
        return int(pointer.value or 0)

    def free(self, pointer: int) -> None:
        """``cudaFree``."""
        self._check("cudaFree", self._lib.cudaFree(ctypes.c_void_p(pointer)))

    def ipc_get_mem_handle(self, pointer: int) -> bytes:
        """``cudaIpcGetMemHandle``: the 64 handle bytes of the allocation at ``pointer``."""
        handle = IpcMemHandle()
        code = self._lib.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(pointer))
        self._check("cudaIpcGetMemHandle", code)
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_SIZE)

    def ipc_open_mem_handle(self, handle: bytes) -> int:
        """``cudaIpcOpenMemHandle`` of 64 handle bytes on the current device: the pointer."""
        if len(handle) != IPC_HANDLE_SIZE:
            raise DeviceError("cudaIpcOpenMemHandle", self.where,
                              f"a memory handle is {IPC_HANDLE_SIZE} bytes, got {len(handle)}")
        raw = IpcMemHandle()
        ctypes.memmove(ctypes.addressof(raw), handle, IPC_HANDLE_SIZE)
        pointer = ctypes.c_void_p()
        self._check("cudaIpcOpenMemHandle",
                    self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), raw, _LAZY_ENABLE_PEER_ACCESS))
        return int(pointer.value or 0)

    def ipc_close_mem_handle(self, pointer: int) -> None:
        """``cudaIpcCloseMemHandle``."""
        self._check("cudaIpcCloseMemHandle", self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer)))

    def host_register(self, pointer: int, nbytes: int) -> None:
        """``cudaHostRegister`` (portable: pinned for every device)."""
        self._check("cudaHostRegister",
                    self._lib.cudaHostRegister(ctypes.c_void_p(pointer), nbytes, _HOST_REGISTER_PORTABLE))

    def host_unregister(self, pointer: int) -> None:
        """``cudaHostUnregister``."""
        self._check("cudaHostUnregister", self._lib.cudaHostUnregister(ctypes.c_void_p(pointer)))

    def versions(self) -> tuple[int, int]:
        """(runtime, driver) versions, as CUDA numbers them (13000: 13.0)."""
        runtime, driver = ctypes.c_int(), ctypes.c_int()
        self._check("cudaRuntimeGetVersion", self._lib.cudaRuntimeGetVersion(ctypes.byref(runtime)))
        self._check("cudaDriverGetVersion", self._lib.cudaDriverGetVersion(ctypes.byref(driver)))
        return runtime.value, driver.value
