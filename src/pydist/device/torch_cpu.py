"""torch CPU tensors in shared memory as a device: the torch half of the CUDA path, on a CPU.

Behaviour
    A :class:`TorchCpuDevice` runs the interface's contract with the same torch code as the
    CUDA device (pydist.device.torch_device: tensor views of buffers, torch copies and
    reductions) on ordinary CPU tensors. Buffers are /dev/shm files seen as tensors through
    ``torch.frombuffer``, so peer processes map them as CUDA IPC would. Streams are eager:
    work runs when enqueued, an event is complete when recorded (interprocess events share
    their counters, pydist.device.event_counters), and ``wait_event`` on a peer's event
    blocks the host until the peer recorded past the most recent record at the call (within
    ``wait_s``). It cannot catch a missing wait (the strict stand-in does); it checks that the
    torch code computes what the contract says.
"""
from __future__ import annotations

import contextlib
import os
import time
import weakref
from typing import Any

import numpy as np

from ..core.deadline import Deadline
from . import shm_files
from .event_counters import Counters, PeerEvent
from .events import Event, Stream, wait_for
from .handles import Handle
from .torch_device import TorchDevice, nothing, storages_over

#: How long a stream's wait on a peer's event may block the host.
WAIT_S = 60.0


class _Shared:
    """A /dev/shm file mapped here."""

    def __init__(self, name: str, owner: bool, nbytes: int):
        fd, self.mapped = (shm_files.create if owner else shm_files.attach)(name, nbytes)
        os.close(fd)
        self.name = name


class EagerStream(Stream):
    """Work runs when enqueued; a wait on a peer's event blocks the host (up to ``wait_s``)."""

    def __init__(self, device: Any, wait_s: float):
        super().__init__(device)
        self.wait_s = wait_s

    def _wait_event(self, event: Event) -> None:
        if isinstance(event, PeerEvent):
            target = event.counters.recorded
            wait_for(lambda: None if event.counters.done >= target else (event.source, f"record {target}"),
                     Deadline.after(self.wait_s), self.device.where, "a wait on a peer's event")
        elif not isinstance(event, EagerEvent):
            raise TypeError(f"wait_event: expected an event of {self.device!r}, got {type(event).__name__}")


class EagerEvent(Event):
    """Complete when recorded; an interprocess one moves its counters."""

    def __init__(self, device: Any, interprocess: bool):
        super().__init__(device, interprocess)
        self.counters = Counters.create() if interprocess else None
        if self.counters is not None:
            weakref.finalize(self, self.counters.close)

    def _record(self, stream: Stream) -> None:
        if self.counters is not None:
            self.counters.recorded += 1
            self.counters.done = self.counters.recorded

    def query(self) -> bool:
        return True

    def _payload(self) -> bytes:
        assert self.counters is not None
        return self.counters.name.encode()


class TorchCpuDevice(TorchDevice):
    """torch CPU tensors in shared memory, eager streams (module docstring)."""

    kind = "torch-cpu"

    def __init__(self, index: int = 0, rank: int | None = None, wait_s: float = WAIT_S):
        import torch

        super().__init__(index, rank, torch.device("cpu"))
        self.wait_s = wait_s
        self._stream = EagerStream(self, wait_s)

    @property
    def uuid(self) -> str:
        return f"CPU-{self.index}"

    def _allocate(self, nbytes: int) -> _Shared:
        return _Shared(shm_files.new_name("m"), True, nbytes)

    def _export(self, raw: _Shared) -> bytes:
        return raw.name.encode()

    def _open(self, source: Handle) -> _Shared:
        return _Shared(shm_files.check_name(source.payload.decode("ascii", "replace")), False, source.nbytes)

    def _bytes(self, raw: _Shared) -> Any:
        return self.torch.frombuffer(raw.mapped, dtype=self.torch.uint8)

    def _in_use(self, raw: _Shared) -> str | None:
        return storages_over(raw, "mapped")

    def _close(self, raw: _Shared) -> None:
        raw.mapped.close()

    def _free(self, raw: _Shared) -> None:
        raw.mapped.close()
        shm_files.unlink(raw.name)

    def _on(self, stream: Stream, call: str) -> contextlib.AbstractContextManager[Any]:
        return nothing()

    def current_stream(self) -> Stream:
        return self._stream

    def new_stream(self) -> Stream:
        return EagerStream(self, self.wait_s)

    def event(self, interprocess: bool = False) -> Event:
        return EagerEvent(self, interprocess)

    def open_event(self, handle: bytes) -> Event:
        return PeerEvent.open(self, handle)

    def keep_alive(self, array: Any, stream: Stream) -> None:
        self.describe(array)

    def delay(self, seconds: float, stream: Stream) -> None:
        time.sleep(seconds)

    def _register(self, array: np.ndarray) -> None:
        return None

    def _unregister(self, raw: None) -> None:
        pass
