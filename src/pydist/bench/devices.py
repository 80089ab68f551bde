"""``pydist-bench --device``: the benchmark's buffers on a device, and who can run them there.

``--device cuda`` puts every rank's buffers on a CUDA device (rank r on ``cuda:r % count``:
several ranks share a GPU when there are fewer GPUs than ranks, as pydist allows and NCCL
refuses); pydist runs them on its own device engine (PYDIST_CUDA_ENGINE=1 is set for its
ranks), gloo on torch's CUDA path, NCCL (``--compare nccl``) where it runs. ``--device
standin`` runs pydist on the strict CPU stand-in of a GPU (pydist.device.standin): the same
engine, so the path is exercised without a GPU; its times say nothing about a GPU. Each timed
call is followed by a synchronize of the caller's stream (a device call returns once its
work is enqueued): the time is the work's, not its enqueueing's. The slowest rank's time and
the bus bandwidth are computed as for host buffers (.timing, .ops).
"""
from __future__ import annotations

import os
from typing import Any

DEVICES = ("cpu", "cuda", "standin")
#: backend key -> the devices it runs buffers on (others: unavailable with a reason)
RUNS_ON = {"pydist": DEVICES, "gloo": ("cpu", "cuda"), "nccl": ("cuda",)}


def unavailable(key: str, device: str) -> str | None:
    """Why backend ``key`` cannot run ``device`` buffers here, or None."""
    if device not in RUNS_ON.get(key, ("cpu",)):
        return f"does not run {device} buffers (--device {device})"
    if device == "cuda":
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if not torch.cuda.is_available():
            return "no CUDA device here (torch.cuda.is_available() is False)"
    return None


def place(comm: Any, device: str) -> Any:
    """``comm`` (a TorchStyleComm) with its benchmarked buffers put on ``device`` and every
    call followed by a synchronize of the caller's stream (module docstring); the timings it
    reduces stay on the host."""
    if device == "cpu":
        return comm
    if device == "standin":
        from ..core.deadline import Deadline
        from ..device import open_device

        standin = open_device("standin", 0, comm.rank)
        stream = standin.current_stream()
        comm.wrap = lambda array: standin.from_host(array, str(array.dtype), stream)
        comm.sync = lambda: stream.synchronize(Deadline.after(600), "a benchmarked call")
        return comm
    import torch

    index = comm.rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    os.environ.update(PYDIST_CUDA_ENGINE="1")
    target = torch.device("cuda", index)
    comm.wrap = lambda array: torch.from_numpy(array).to(target)
    comm.sync = torch.cuda.synchronize
    return comm
