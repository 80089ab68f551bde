"""Streams and events as the interface hands them out; each implementation subclasses them.

The host never waits on the device without a deadline: ``Event.synchronize`` polls ``query``
(as CUDA's ``cudaEventQuery``) with backoff against the deadline, and for an event opened from
a peer it checks at each poll that the exporting process lives, raising PeerFailedError naming
it as soon as it is gone (an exporter that died never records again, and CUDA leaves using its
event undefined). ``Stream.synchronize`` records an event and does the same.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import OpTimeoutError, PeerFailedError
from ..core.shm_files import pid_alive
from . import handles, shm_files
from .errors import DeviceError
from .handles import EVENT, Handle

if TYPE_CHECKING:
    from .interface import Device


def peer_died(source: Handle, where: str, what: str) -> PeerFailedError:
    """The error for a wait on ``source``'s event whose exporting process is gone (its files
    in /dev/shm are removed here: nobody else may be left to)."""
    shm_files.remove_stale()
    return PeerFailedError(f"{where}: {source.exporter} exited while this rank waited on its event ({what})",
                           rank=source.rank)


#: What a wait is held up by: the peer's handle when it is a peer's event, and a description.
Blocker = tuple[Handle | None, str]


def wait_for(step: Callable[[], Blocker | None], deadline: Deadline, where: str, what: str) -> None:
    """Poll ``step`` (None: done) with backoff until it is done; PeerFailedError as soon as
    the peer it is held up by is dead, OpTimeoutError naming what it waits for at ``deadline``."""
    last: list[Blocker | None] = [None]

    def settled() -> bool:
        last[0] = step()
        blocker = last[0]
        return blocker is None or (blocker[0] is not None and not pid_alive(blocker[0].pid))

    _deadline.poll_until(settled, deadline)
    blocker = last[0]
    if blocker is None:
        return
    source, description = blocker
    if source is not None and not pid_alive(source.pid):
        raise peer_died(source, where, what)
    owner = f" of {source.exporter}" if source is not None else ""
    raise OpTimeoutError(f"{where}: {what} not complete by the deadline (waiting for {description}{owner})")


class Event(ABC):
    """A point in a stream's work; interprocess events are shared by ``export``/``open_event``."""

    def __init__(self, device: Device, interprocess: bool, source: Handle | None = None):
        self.device = device
        self.interprocess = interprocess
        #: The exporter's handle, for an event opened from a peer (None for this process's own).
        self.source = source
        #: The peers whose events the recorded work waits on (by pid), to name a dead one.
        self.peers: dict[int, Handle] = {}

    def record(self, stream: Stream) -> None:
        """Mark the work enqueued on ``stream`` so far (this process's own events only)."""
        if self.source is not None:
            raise self.device.error("record", "an event opened from a peer is recorded by its exporter only")
        if not isinstance(stream, Stream) or stream.device is not self.device:
            raise ValueError(f"record: expected a stream of {self.device!r}, got {stream!r}")
        self._record(stream)
        self.peers = dict(stream.peers)

    @abstractmethod
    def _record(self, stream: Stream) -> None: ...

    @abstractmethod
    def query(self) -> bool:
        """Whether the work of the most recent record is done (a never-recorded event is)."""

    @abstractmethod
    def _payload(self) -> bytes:
        """The implementation's own handle bytes for this event."""

    def ran(self) -> bool:
        """Whether the most recent record's work is done, without making any work run (a
        device runs its work anyway: ``query``; the stand-in's lazy streams override it)."""
        return self.query()

    def export(self) -> bytes:
        """Handle bytes a peer process opens with ``open_event``."""
        if not self.interprocess or self.source is not None:
            raise self.device.error("export event", "only an interprocess event of this process can be exported")
        return handles.encode(Handle(EVENT, self.device.kind, os.getpid(), self.device.rank, 0,
                                     self.device.uuid, self._payload()))

    def blocker(self) -> Blocker | None:
        """None once complete, else what it waits for: a dead exporter or peer whose event
        the recorded work waits on, else its exporter (None: this process's own work). A
        query that fails (CUDA may, on a dead exporter's event) names the dead peer."""
        try:
            if self.query():
                return None
        except DeviceError:
            dead = self.dead_peer()
            if dead is None:
                raise
            return dead
        return self.dead_peer() or (self.source, "its most recent record")

    def dead_peer(self) -> Blocker | None:
        """(the dead process's handle, what) when the exporter of this event, or of an event
        its recorded work waits on, is dead; None otherwise (runs no work)."""
        for source in (self.source, *self.peers.values()):
            if source is not None and not pid_alive(source.pid):
                return source, "an event the work waits on"
        return None

    def synchronize(self, deadline: Deadline, what: str = "an event") -> None:
        """Return once ``query()`` is True, polling; past ``deadline`` OpTimeoutError, and a
        PeerFailedError naming the peer as soon as the exporter, or a peer whose event the
        recorded work waits on, is seen dead."""
        wait_for(self.blocker, deadline, self.device.where, what)


class Stream(ABC):
    """An ordered queue of device work."""

    def __init__(self, device: Device):
        self.device = device
        #: The peers whose events this stream has waited on (by pid), to name a dead one.
        self.peers: dict[int, Handle] = {}

    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits for ``event``'s most recent record at this call (a
        never-recorded event: no wait). The host does not block."""
        if not isinstance(event, Event) or event.device.kind != self.device.kind:
            raise TypeError(f"wait_event: expected an event of a {self.device.kind} device, got {event!r}")
        self._wait_event(event)
        for source in (event.source, *event.peers.values()):
            if source is not None:
                self.peers[source.pid] = source

    @abstractmethod
    def _wait_event(self, event: Event) -> None: ...

    def synchronize(self, deadline: Deadline, what: str = "stream work") -> None:
        """Return once the work enqueued so far is done (polling against ``deadline``; a
        PeerFailedError as soon as a peer whose event it waits on is seen dead)."""
        marker = self.device.event()
        marker.record(self)
        marker.synchronize(deadline, what)
