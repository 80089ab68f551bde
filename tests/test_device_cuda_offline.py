"""What of the CUDA device can be checked without a GPU (the rest is make gpu-check's): it
imports without torch or CUDA and refuses to start without a device, naming it; the handle
struct is CUDA's 64 bytes; the tensors over a buffer are counted through the object they
hold; the runtime is found among the libraries this process maps."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from pydist.device import DeviceError, open_device, unavailable
from pydist.device.cuda import CudaMemory
from pydist.device.cudart import IPC_HANDLE_SIZE, IpcMemHandle, loaded_library
from pydist.device.torch_device import storages_over


@pytest.mark.slow
def test_the_cuda_module_imports_without_torch():
    code = "import sys, pydist.device.cuda, pydist.device.cudart; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_without_a_gpu_a_cuda_device_is_refused_naming_rank_and_device():
    if unavailable("cuda") is None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(DeviceError, match=r"open_device on rank 3, cuda:1: .*torch"):
        open_device("cuda", 1, rank=3)


def test_the_memory_handle_is_cudas_64_bytes():
    assert IPC_HANDLE_SIZE == 64 and ctypes.sizeof(IpcMemHandle) == 64


def test_tensors_over_cuda_memory_are_counted_through_what_they_hold():
    memory = CudaMemory(0x7F00_0000_0000, 4096)
    assert memory.interface.__cuda_array_interface__["data"] == (0x7F00_0000_0000, False)
    assert memory.interface.__cuda_array_interface__["shape"] == (4096,)
    assert storages_over(memory, "interface") is None
    storages = [memory.interface, memory.interface]  # as two torch storages hold it
    assert storages_over(memory, "interface") == "2 tensor storages over it"
    del storages
    assert storages_over(memory, "interface") is None


def test_the_runtime_is_looked_for_among_the_mapped_libraries():
    assert "libc" in (loaded_library("libc.so") or loaded_library("libc-") or "")
    assert loaded_library("no-such-library-anywhere") is None
