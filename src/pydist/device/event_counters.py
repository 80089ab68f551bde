"""An interprocess event's shared state: two counters in a /dev/shm page.

Behaviour
    ``recorded`` is the epoch of the exporter's most recent record, set at the record call (so
    a peer's ``wait_event`` takes the most recent record *at its call*, as
    ``cudaStreamWaitEvent`` does); ``done`` is the newest epoch whose work has run, every
    earlier one included. A never-recorded event has both at 0: complete. Only the exporter
    writes; peers read (aligned 8-byte words: one store or load each on the machines pydist
    runs on). The exporter removes the file when its event goes (``close``); every map,
    the exporter's and the peers', lives as long as its Counters object (work queued on it
    included), and a peer's then never moves again.

Failure modes
    ``attach`` of a file that is not one (magic): ValueError; gone: FileNotFoundError.
    ``PeerEvent.open`` turns both into DeviceError naming the exporter.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from . import shm_files
from .events import Event, Stream
from .handles import EVENT, Handle

if TYPE_CHECKING:
    from .interface import Device

SIZE = 4096
_MAGIC = 0x5044_4556_454E_5431  # "PDEVENT1"


class Counters:
    """The two epochs of one interprocess event (module docstring)."""

    def __init__(self, name: str, memory, owner: bool):
        self.name = name
        self.owner = owner
        self._words = np.frombuffer(memory, np.uint64, 3)  # holds the map

    @classmethod
    def create(cls) -> Counters:
        """New counters, both 0, owned by this process."""
        name = shm_files.new_name("e")
        fd, memory = shm_files.create(name, SIZE)
        os.close(fd)
        counters = cls(name, memory, owner=True)
        counters._words[0] = _MAGIC
        return counters

    @classmethod
    def attach(cls, name: str) -> Counters:
        """The exporter's counters ``name``."""
        fd, memory = shm_files.attach(name, SIZE)
        os.close(fd)
        counters = cls(name, memory, owner=False)
        if int(counters._words[0]) != _MAGIC:
            raise ValueError(f"/dev/shm/{name} is not an event's counters")
        return counters

    @property
    def recorded(self) -> int:
        """The epoch of the most recent record."""
        return int(self._words[1])

    @recorded.setter
    def recorded(self, epoch: int) -> None:
        self._words[1] = epoch

    @property
    def done(self) -> int:
        """The newest epoch whose work (and every earlier one's) has run."""
        return int(self._words[2])

    @done.setter
    def done(self, epoch: int) -> None:
        self._words[2] = epoch

    def complete(self) -> bool:
        """Whether the most recent record's work has run (never recorded: True)."""
        return self.done >= self.recorded

    def close(self) -> None:
        """The owner removes the file (peers that mapped it keep their maps). The map itself
        goes with this object: work still queued on these counters keeps it valid."""
        if self.owner:
            shm_files.unlink(self.name)


class PeerEvent(Event):
    """A peer's interprocess event opened here (``open``): waited on, never recorded or
    exported again; ``query`` is the counters' ``complete`` (implementations add to it)."""

    def __init__(self, device: Device, source: Handle, counters: Counters):
        super().__init__(device, True, source)
        self.counters = counters

    @classmethod
    def open(cls, device: Device, handle: bytes) -> PeerEvent:
        """The event of ``handle`` (bytes a peer's ``Event.export`` made) on ``device``."""
        source = device._decode(handle, EVENT, "open_event")
        try:
            counters = Counters.attach(shm_files.check_name(source.payload.decode("ascii", "replace")))
        except FileNotFoundError:
            raise device.error("open_event", f"{source.exporter}'s event is gone") from None
        except ValueError as error:
            raise device.error("open_event", str(error)) from None
        return cls(device, source, counters)

    def _record(self, stream: Stream) -> None:
        raise AssertionError("Event.record refuses a peer's event")

    def query(self) -> bool:
        return self.counters.complete()

    def _payload(self) -> bytes:
        raise self.device.error("export event", "an event opened from a peer cannot be exported again")
