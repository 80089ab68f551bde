"""A group's same-host arena: shared slots every member can read, and phase counters.

Layout: a 64-byte line with the Signal (doorbell, sleepers); one 64-byte line per member
holding [phase, fingerprint x2, cpu] (the fingerprint double-buffered by phase parity, so a
fast member writing its next one cannot change what a slow one still compares; the CPU it
last waited on, for the Signal's spin budget); then
2 parities x (members + 1) slots of ``slot_bytes``: one slot per member and one shared
slot. Algorithms alternate parities per
use (``next_parity``) and separate writing from reading with ``sync``; the invariant that
makes reuse safe: data written for a use is read only between that use's sync and the
member's next sync, and a member writes a parity again only after a later sync.

``sync`` is a barrier of the members (spin, yield, then futex sleep; see signal). It can
carry a fingerprint of the call (op, dtype, count, root, reduce op): members whose
fingerprints differ all raise DesyncError (a DistBackendError) naming the rank and both
calls, instead of hanging or mixing data. A member that does not arrive before the deadline
makes the others raise OpTimeoutError naming it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from ...core.deadline import Deadline
from ...core.errors import DesyncError, OpTimeoutError
from ...core.fingerprint import describe_fingerprint, how_calls_differ
from .segment import Keepalive
from .signal import Signal, WaitTimeout

LINE = 64
CPU_WORD = 3  # in a member's line: the CPU it last waited on, +1 (see signal)


class _Operation(Protocol):
    """What the arena needs of the running operation (a Comm): its deadline, and its
    description and timeout wording for errors."""
    deadline: Deadline
    timeout_text: str

    def describe(self) -> str: ...


def arena_bytes(members: int, slot_bytes: int) -> int:
    return _data_offset(members) + 2 * (members + 1) * slot_bytes


def _data_offset(members: int) -> int:
    header = LINE * (1 + members)
    return (header + 4095) // 4096 * 4096


class Arena:
    """One member's handle on a shared arena (each member has its own object)."""

    def __init__(self, memory: np.ndarray, base: int, group_ranks: list[int], index: int, slot_bytes: int,
                 oversubscribed: bool, describe: Callable[[int], str] = str, keepalive: Keepalive | None = None,
                 ranks_here: int = 0):
        self.group_ranks = group_ranks  # of the members, in arena order
        self.size = len(group_ranks)
        self.rank = index
        self.slot_bytes = slot_bytes
        self._keepalive = keepalive  # the segment that owns ``memory``
        self._describe = describe
        self._signal = Signal(memory.data, base, 0, oversubscribed, ranks_here)  # .data: memoryview(memory)
        self._words = memory.data.cast("Q")
        self._line = [(LINE * (1 + m)) // 8 for m in range(self.size)]
        self._peers = [(m, word) for m, word in enumerate(self._line) if m != index]  # what sync waits on
        start = _data_offset(self.size)
        self._slots = [[memory[start + (p * (self.size + 1) + m) * slot_bytes:
                               start + (p * (self.size + 1) + m + 1) * slot_bytes] for m in range(self.size + 1)]
                       for p in (0, 1)]
        # the members' slots of a parity lie one after another: as the rows of one array
        self._rows = [memory[start + p * (self.size + 1) * slot_bytes:
                             start + (p * (self.size + 1) + self.size) * slot_bytes].reshape(self.size, slot_bytes)
                      for p in (0, 1)]
        self._typed: dict[np.dtype, list[list[np.ndarray]]] = {}
        self._slot_cache: dict[tuple, list[np.ndarray] | np.ndarray] = {}
        self.phase = self._words[self._line[index]]
        self._uses = 0
        self.alive: Callable[[], None] | None = None

    def wake(self) -> None:
        """Wake the members asleep in ``sync`` (a peer died or aborted the group: they look
        at the group's state at once instead of at the end of their sleep slice)."""
        signal = self._signal
        if signal is not None:
            signal.wake()

    def release(self) -> None:
        """Give the memory back: unlink the segment if nobody did yet (a member never
        attached), drop this handle's views into it and unmap it."""
        # released: dropped so that the segment unmaps, never read again
        self._signal = self._words = self._slots = self._rows = None  # type: ignore[assignment]
        self._typed, self._slot_cache = {}, {}
        self.alive = None
        if self._keepalive is not None:
            self._keepalive.unlink()
            self._keepalive.close()

    def touch(self) -> None:
        """Map the first page of every slot into this process (a read: the page faults of
        the first operations, moved to set-up)."""
        for parity in self._slots:
            for slot in parity:
                _ = slot[0]

    def next_parity(self) -> int:
        parity = self._uses & 1
        self._uses += 1
        return parity

    def _views(self, dtype: np.dtype) -> list[list[np.ndarray]]:
        views = self._typed.get(dtype)
        if views is None:
            count = self.slot_bytes // dtype.itemsize
            views = [[slot[:count * dtype.itemsize].view(dtype) for slot in parity] for parity in self._slots]
            self._typed[dtype] = views
        return views

    def slot(self, parity: int, member: int, dtype: np.dtype) -> np.ndarray:
        """Member ``member``'s slot of ``parity`` as ``dtype`` elements."""
        return self._views(dtype)[parity][member]

    def slots(self, parity: int, dtype: np.dtype, length: int) -> list[np.ndarray]:
        """The first ``length`` elements of every member's slot of ``parity`` (cached views:
        the latency path asks for the same ones call after call)."""
        key = (parity, dtype, length)
        views = self._slot_cache.get(key)
        if views is None:
            if len(self._slot_cache) > 256:
                self._slot_cache.clear()
            views = self._slot_cache[key] = [self.slot(parity, m, dtype)[:length] for m in range(self.size)]
        return views  # type: ignore[return-value]

    def rows(self, parity: int, dtype: np.dtype, length: int) -> np.ndarray:
        """The first ``length`` elements of every member's slot of ``parity``, as the rows of
        one 2-D view (cached): one ufunc call reduces them all (core.ops.reduce_rows)."""
        key = (parity, dtype, length, "rows")
        view = self._slot_cache.get(key)
        if view is None:
            if len(self._slot_cache) > 256:
                self._slot_cache.clear()
            view = self._slot_cache[key] = self._rows[parity].view(dtype)[:, :length]
        return view  # type: ignore[return-value]

    def shared(self, parity: int, dtype: np.dtype) -> np.ndarray:
        """The shared slot of ``parity`` as ``dtype`` elements."""
        return self._views(dtype)[parity][self.size]

    def sync(self, op: _Operation, fingerprint: int = 0) -> None:
        """Barrier of the members within ``op``'s deadline; with a fingerprint (the call's),
        raise when the members' calls differ."""
        self.phase += 1
        line = self._line[self.rank]
        if fingerprint:
            self._words[line + 1 + (self.phase & 1)] = fingerprint
        self._signal.publish(line, self.phase)
        words, phase = self._words, self.phase
        for member, word in self._peers:
            if words[word] < phase:  # not there yet: spin, yield, sleep
                self._wait(member, op)
        if fingerprint:
            self._check(fingerprint, op)

    def _wait(self, member: int, op: _Operation) -> None:
        try:
            self._signal.wait_at_least(self._line[member], self.phase, op.deadline, self.alive,
                                       (self._line[self.rank] + CPU_WORD, self._line[member] + CPU_WORD))
        except WaitTimeout:
            raise OpTimeoutError(f"{op.describe()}: {op.timeout_text} for {self._describe(member)}; that rank has "
                                 "not reached this operation or is stuck") from None

    def _check(self, fingerprint: int, op: _Operation) -> None:
        for member in range(self.size):
            theirs = self._words[self._line[member] + 1 + (self.phase & 1)]
            if theirs != fingerprint:
                raise DesyncError(f"{op.describe()}: {how_calls_differ(fingerprint, theirs)}: {self._describe(member)} "
                                  f"called {describe_fingerprint(theirs)} while this rank called "
                                  f"{describe_fingerprint(fingerprint)}")
