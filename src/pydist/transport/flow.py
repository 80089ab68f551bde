"""Back-pressure for unexpected messages: the bytes this rank holds from each peer before it
posted receives for them, and the peers whose connections it stopped reading.

A transport that reads a byte stream (tcp) asks the matcher ``should_pause(peer)`` between
frames: True when this rank holds ``limit`` bytes or more of that peer's unexpected messages
(PYDIST_MAX_UNEXPECTED_BYTES) and no posted receive wants that peer's data. The transport
then stops reading that connection, so TCP's flow control blocks the sender, until
``resume(peer)`` is called: a receive from that peer (or from any source) was posted, or the
bytes held from it fell below the limit. Streams are FIFO and an operation's sends complete
before the next operation starts, so the data a lagging rank needs always arrived before the
data that made it pause: pausing never withholds a message a posted receive waits for.
"""
from __future__ import annotations

from collections.abc import Callable


class ReadThrottle:
    """Held bytes per peer and the paused peers (the matcher calls it under its lock)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held: dict[int, int] = {}
        self.paused: set[int] = set()
        #: set by the transport that pauses: resume(peer) starts reading from it again
        self.resume: Callable[[int], None] | None = None

    def add(self, source: int, nbytes: int) -> None:
        """An unexpected message of ``nbytes`` from ``source`` is now held."""
        self.held[source] = self.held.get(source, 0) + nbytes

    def remove(self, source: int, nbytes: int) -> list[int]:
        """A held message was taken by a receive; the peers to resume (``source`` if it was
        paused and is now under the limit)."""
        left = self.held.get(source, 0) - nbytes
        if left > 0:
            self.held[source] = left
        else:
            self.held.pop(source, None)
        if source in self.paused and left < self.limit:
            self.paused.discard(source)
            return [source]
        return []

    def over(self, source: int) -> bool:
        return self.held.get(source, 0) >= self.limit

    def wanted(self, source: int | None) -> list[int]:
        """A receive from ``source`` (None: any) was posted and waits: the paused peers that
        may hold its data, no longer paused."""
        if not self.paused:
            return []
        if source is None:
            peers = sorted(self.paused)
            self.paused.clear()
            return peers
        if source in self.paused:
            self.paused.discard(source)
            return [source]
        return []

    def notify(self, peers: list[int]) -> None:
        """Tell the transport to read from ``peers`` again (call without the matcher's lock)."""
        if peers and self.resume is not None:
            for peer in peers:
                self.resume(peer)
