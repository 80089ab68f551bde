"""Device memory as the interface hands it out: a :class:`Buffer` this process allocated, a
:class:`Mapping` of a peer's buffer, host memory registered with the device.

Each holds the implementation's own object (``raw``: a CUDA pointer, a stand-in allocation)
and its size; pydist.device.interface.Device does everything with them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .handles import Handle
from .ledger import Ledger

if TYPE_CHECKING:
    from .interface import Device


class Memory:
    """Device bytes this process can use: its own :class:`Buffer` or a peer's :class:`Mapping`."""

    def __init__(self, device: Device, raw: Any, nbytes: int):
        self.device = device
        self.raw = raw
        self.nbytes = nbytes
        self.closed = False


class Buffer(Memory):
    """Memory this process allocated (``Device.allocate``): exported, then freed."""

    handle: bytes | None = None
    ledger: Ledger | None = None

    def __repr__(self) -> str:
        return f"Buffer({self.nbytes} bytes on {self.device.where}{', freed' if self.closed else ''})"


class Mapping(Memory):
    """A peer's buffer opened in this process (``Device.open``): used, then closed."""

    def __init__(self, device: Device, raw: Any, source: Handle, ledger: Ledger):
        super().__init__(device, raw, source.nbytes)
        self.source = source
        self.ledger = ledger

    @property
    def peer(self) -> int | None:
        """The exporter's rank."""
        return self.source.rank

    def __repr__(self) -> str:
        return f"Mapping({self.nbytes} bytes of {self.source.exporter} on {self.device.where})"


class HostRegistration:
    """Host memory registered with the device (pinned in place) until ``unregister``."""

    def __init__(self, device: Device, array: np.ndarray, raw: Any):
        self.device, self.array, self.raw = device, array, raw
        self.span = span(array)

    def unregister(self) -> None:
        """Unpin it (a second call: nothing)."""
        if self in self.device._registered:
            self.device._unregister(self.raw)
            self.device._registered.remove(self)

    def __enter__(self) -> HostRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


def span(array: np.ndarray) -> tuple[int, int]:
    """The addresses [start, end) of ``array``'s bytes."""
    start = array.__array_interface__["data"][0]
    return start, start + array.nbytes


