"""The one admission policy of every listener (the store server, each rank's): what a
connection that has not proven it belongs may cost, pure (no socket, time passed in).

A :class:`Gate` holds the connections accepted and not proven yet (a rank's HELLOs and
their proofs, the store's opening; TLS first where used), each with:

- a deadline: ``timeout`` seconds (PYDIST_HANDSHAKE_TIMEOUT) after it was accepted, talking
  or not; ``late`` names those past it, to drop;
- its progress, the furthest step of its protocol it reached (:data:`HEARD` a byte,
  :data:`SECURED` its TLS handshake, :data:`GREETED` its first hello answered);
- a cap on how many are held (:func:`cap`): admitting one more names the connection to drop,
  the one with the least progress, the oldest of those (:meth:`Gate.victim`), never the
  newcomer itself (it had no time to talk yet): a silent one before a talking one, so a
  burst of real clients, each sending its opening at once, is cut last, and a flood of
  connections that each send a byte cannot keep a new one out. Out of file descriptors, a
  listener drops the same one to accept again.

A proven connection leaves the gate (``prove``) before its last handshake bytes are sent,
in the same thread, so it cannot be cut after its peer took it as established.
"""
from __future__ import annotations

import heapq
import itertools
import resource
from collections.abc import Hashable
from typing import Generic, TypeVar

#: connections not proven yet held by one listener at most (more when more peers are expected,
#: fewer when the descriptor limit is low; see cap)
MAX_UNPROVEN = 1024
#: the share of the process's descriptors (soft RLIMIT_NOFILE) unproven connections may hold
FD_SHARE = 4
#: progress steps (a connection's furthest): a byte came, its TLS handshake is done, its
#: first hello was answered
HEARD, SECURED, GREETED = 1, 2, 3

Key = TypeVar("Key", bound=Hashable)


def cap(expected: int = 0) -> int:
    """How many unproven connections a listener holds: MAX_UNPROVEN, at most a FD_SHARE of
    the soft descriptor limit, at least twice the ``expected`` peers (a burst of all of
    them at once always fits). Read at each call."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    by_fds = MAX_UNPROVEN if soft == resource.RLIM_INFINITY else max(1, soft // FD_SHARE)
    return max(2 * expected, min(MAX_UNPROVEN, by_fds))


class Gate(Generic[Key]):
    """The unproven connections of one listener (``timeout``: seconds each may take, 0: no
    limit; ``expected``: the peers that may connect, which scales the cap). Not thread-safe:
    one listener's loop drives it."""

    def __init__(self, timeout: float, expected: int = 0):
        self.timeout, self.expected = timeout, expected
        self._step: dict[Key, int] = {}  # key -> its progress, oldest first
        self._by_step: list[dict[Key, None]] = [{} for _ in range(GREETED + 1)]  # oldest first in each
        self._due: dict[Key, float] = {}  # key -> its deadline (the heap may hold stale entries)
        self._heap: list[tuple[float, int, Key]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._step)

    def __contains__(self, key: object) -> bool:
        return key in self._step

    @property
    def limit(self) -> int:
        """The cap now (see :func:`cap`)."""
        return cap(self.expected)

    def admit(self, key: Key, now: float) -> list[Key]:
        """Hold ``key``, accepted at ``now``; the connections to drop for the cap, which leave
        the gate (never ``key`` itself, see the module)."""
        self._step[key] = 0
        self._by_step[0][key] = None
        if self.timeout > 0:
            self.shorten(key, now + self.timeout)
        victims: list[Key] = []
        while len(self._step) > self.limit:
            victim = self.victim(sparing=key)
            assert victim is not None  # over a cap of at least 1: another is held
            self.discard(victim)
            victims.append(victim)
        return victims

    def progress(self, key: Key, step: int) -> None:
        """``key`` reached ``step`` (kept if it had gone further)."""
        old = self._step.get(key)
        if old is not None and step > old:
            del self._by_step[old][key]
            self._by_step[step][key] = None
            self._step[key] = step

    def shorten(self, key: Key, until: float) -> None:
        """Drop ``key`` at ``until`` if that is before its deadline (a refused connection
        lingering over its farewell)."""
        if key in self._step and until < self._due.get(key, float("inf")):
            self._due[key] = until
            heapq.heappush(self._heap, (until, next(self._order), key))

    def prove(self, key: Key) -> bool:
        """``key`` proved it belongs: it leaves the gate. False if it had been dropped."""
        return self.discard(key)

    def discard(self, key: Key) -> bool:
        """Forget ``key``; whether it was held."""
        step = self._step.pop(key, None)
        if step is None:
            return False
        del self._by_step[step][key]
        self._due.pop(key, None)
        return True

    def victim(self, sparing: Key | None = None) -> Key | None:
        """The connection to drop first: the oldest of those with the least progress, other
        than ``sparing`` (None: no other is held)."""
        for held in self._by_step:
            for key in itertools.islice(held, 2):
                if key != sparing:
                    return key
        return None

    def late(self, now: float) -> list[Key]:
        """The connections past their deadline at ``now``, which leave the gate (to drop)."""
        found: list[Key] = []
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                self.discard(key)
                found.append(key)
        return found

    def due(self) -> float | None:
        """When the next deadline passes (clock time; None: none is timed)."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def late_reason(self) -> str:
        return f"no handshake within {self.timeout:g} s (PYDIST_HANDSHAKE_TIMEOUT)"

    def cap_reason(self) -> str:
        return (f"{self.limit} connections were waiting to prove themselves; the oldest of those with the "
                "least progress is dropped")
