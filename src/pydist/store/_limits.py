"""What a store connection may make the server hold in memory, and the service's counts.

The service (:mod:`._service`) tells :class:`Holdings` how many bytes each connection holds
unparsed after each of its reads; Holdings answers which limit they pass, if any (the
service then drops that connection, logged by the I/O loop with the reason, rate limited):

- with a token, a connection holds at most ``UNAUTHENTICATED_BYTES`` before it has
  authenticated, and all such connections together at most ``UNAUTHENTICATED_TOTAL``;
- token or not, the bytes of unfinished messages of all connections together stay under
  ``BUFFERED_TOTAL`` (a message is at most ``MAX_MESSAGE_BYTES``).

How many connections may wait to prove themselves, and for how long, is the admission
policy's (:mod:`pydist.net.admission`, applied by the I/O loop). The limits are read at each
use (tests lower them).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ._protocol import MAX_MESSAGE_BYTES

#: Bytes one connection may send before it has authenticated (with a token; the opening is 70).
UNAUTHENTICATED_BYTES = 64 << 10
#: Bytes all connections that have not authenticated yet may have the server hold together.
UNAUTHENTICATED_TOTAL = 16 << 20
#: Bytes of unfinished messages held for all connections together (one whole message fits).
BUFFERED_TOTAL = MAX_MESSAGE_BYTES + (128 << 20)


@dataclass
class ServiceStats:
    """What a service has handled since it started (pydist-bench --scale reads it): requests
    by name, each counted once when it arrives (a parked one is not counted again when it is
    re-run); connections open now, the most open at once, and opened in all; connections
    waiting to authenticate now; bytes of unfinished messages held now and at most, all
    connections' and those of connections not authenticated yet; connections dropped for a
    limit (these bytes, and the admission policy's cap and deadline)."""

    requests: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    peak_connections: int = 0
    opened: int = 0
    unauthenticated: int = 0
    buffered_bytes: int = 0
    peak_buffered_bytes: int = 0
    unauthenticated_bytes: int = 0
    peak_unauthenticated_bytes: int = 0
    dropped_for_limits: int = 0

    def snapshot(self) -> dict[str, Any]:
        """A copy as plain data (the counts as they are now)."""
        return asdict(self)


class Holdings:
    """The bytes each connection holds unparsed, counted in ``stats``."""

    def __init__(self, stats: ServiceStats):
        self.stats = stats
        self._held: dict[int, int] = {}  # connection id -> bytes it holds unparsed
        self._unproven: set[int] = set()  # connections not authenticated yet (with a token)

    def open(self, cid: int, unproven: bool) -> None:
        """A new connection; ``unproven``: it must authenticate first."""
        if unproven:
            self._unproven.add(cid)
            self.stats.unauthenticated = len(self._unproven)

    def count(self, cid: int, held: int) -> str | None:
        """``cid`` holds ``held`` bytes now; the limit that passes, in words (None: none)."""
        stats = self.stats
        change = held - self._held.get(cid, 0)
        self._held[cid] = held
        stats.buffered_bytes += change
        unproven = cid in self._unproven
        if unproven:
            stats.unauthenticated_bytes += change
        stats.peak_buffered_bytes = max(stats.peak_buffered_bytes, stats.buffered_bytes)
        stats.peak_unauthenticated_bytes = max(stats.peak_unauthenticated_bytes, stats.unauthenticated_bytes)
        if unproven and held > UNAUTHENTICATED_BYTES:
            return f"it sent {held} bytes before authenticating (limit {UNAUTHENTICATED_BYTES})"
        if unproven and stats.unauthenticated_bytes > UNAUTHENTICATED_TOTAL:
            return (f"connections not authenticated yet hold {stats.unauthenticated_bytes} bytes "
                    f"(limit {UNAUTHENTICATED_TOTAL})")
        if stats.buffered_bytes > BUFFERED_TOTAL:
            return (f"unfinished messages hold {stats.buffered_bytes} bytes of the store's memory "
                    f"(limit {BUFFERED_TOTAL}); this connection's {held}")
        return None

    def forget(self, cid: int) -> None:
        """Stop counting ``cid``: closed, dropped, or authenticated (then counted again, as
        any connection, from its next ``count``)."""
        held = self._held.pop(cid, 0)
        self.stats.buffered_bytes -= held
        if cid in self._unproven:
            self._unproven.discard(cid)
            self.stats.unauthenticated_bytes -= held
            self.stats.unauthenticated = len(self._unproven)
