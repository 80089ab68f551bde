"""The key/value and queue semantics every store shares, as one in-memory state machine.

HashStore guards a :class:`KVState` with a condition variable, the TCPStore server owns
one, and FileStore rebuilds one by replaying its record log. Method names match the
protocol's request names, so every store dispatches an operation the same way.

Semantics follow torch's HashStore: values are bytes; ``add`` keeps the value as decimal
ASCII, reads it like C's ``stoll`` (leading blanks, sign, digits) and wraps at int64;
queues live beside the keys: ``check``/``wait`` see a key or a non-empty queue,
``get``/``multi_get`` only keys, ``delete_key``/``num_keys``/``list_keys`` ignore queues.
Keys starting with :data:`INTERNAL_PREFIX` are bookkeeping and never listed or counted.

Blocking operations (``multi_get``, ``wait``, ``queue_pop``) raise :class:`NotReady` with
the missing keys instead of blocking; the caller decides how to wait. Every mutation is
recorded as a change message (set/del/push/pop) that ``take_changes`` hands out: the
server wakes waiters with them, FileStore appends them to its log, HashStore notifies.
"""
from __future__ import annotations

import re
from collections import deque

from ._protocol import Message

#: Prefix of internal bookkeeping keys (worker counts, reference counts).
INTERNAL_PREFIX = "\x00pydist/"

_INT64_MIN, _INT64_SPAN = -(1 << 63), 1 << 64
_STOLL = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")


class NotReady(Exception):
    """A blocking operation cannot complete yet; ``missing`` names the keys it waits for.
    ``retry_args``, if given, are the arguments to re-run it with (an operation that
    already changed the state before blocking, like a barrier's arrival)."""

    def __init__(self, missing: list[str], retry_args: tuple | None = None):
        super().__init__(", ".join(missing))
        self.missing = missing
        self.retry_args = retry_args


def wrap_int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as C++ arithmetic does."""
    return (value - _INT64_MIN) % _INT64_SPAN + _INT64_MIN


def parse_int(key: str, value: bytes) -> int:
    """The integer a stored value holds, read as ``std::stoll`` reads it (torch's add).
    Raises ValueError naming the key if it holds no integer or one outside int64."""
    match = _STOLL.match(value)
    if match is None:
        raise ValueError(f"add: the value of key {key!r} is not an integer: {value[:40]!r}")
    number = int(match.group(1))
    if number != wrap_int64(number):
        raise ValueError(f"add: the value of key {key!r} is outside the int64 range: {value[:40]!r}")
    return number


class KVState:
    """Keys, queues, and a record of the changes since the last ``take_changes``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {}
        self._changes: list[Message] = []

    # -- changes ---------------------------------------------------------------------
    def take_changes(self) -> list[Message]:
        """The changes made since the last call, oldest first."""
        changes, self._changes = self._changes, []
        return changes

    def apply(self, change: Message) -> None:
        """Replay one change (from a FileStore log) without recording it."""
        name, args = change
        if name == "set":
            self.data[args[0]] = args[1]
        elif name == "del":
            self.data.pop(args[0], None)
        elif name == "push":
            self.queues.setdefault(args[0], deque()).append(args[1])
        else:
            self._pop(args[0])

    def _record(self, change: Message) -> None:
        self.apply(change)
        self._changes.append(change)

    def _pop(self, key: str) -> bytes:
        queue = self.queues[key]
        value = queue.popleft()
        if not queue:
            del self.queues[key]
        return value

    def _exists(self, key: str) -> bool:
        return key in self.data or key in self.queues

    # -- operations ------------------------------------------------------------------
    def set(self, key: str, value: bytes) -> None:
        self._record(Message("set", (key, value)))

    def add(self, key: str, amount: int) -> int:
        current = self.data.get(key)
        result = wrap_int64((0 if current is None else parse_int(key, current)) + amount)
        self.set(key, str(result).encode())
        return result

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if current is None and expected:
            return expected
        if current is not None and current != expected:
            return current
        self.set(key, desired)
        return desired

    def append(self, key: str, value: bytes) -> None:
        self.set(key, self.data.get(key, b"") + value)

    def delete_key(self, key: str) -> bool:
        if key not in self.data:
            return False
        self._record(Message("del", (key,)))
        return True

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: got {len(keys)} keys but {len(values)} values")
        for key, value in zip(keys, values):
            self.set(key, value)

    def check(self, keys: list[str]) -> bool:
        return all(self._exists(key) for key in keys)

    def num_keys(self) -> int:
        return sum(1 for key in self.data if not key.startswith(INTERNAL_PREFIX))

    def list_keys(self) -> list[str]:
        return [key for key in self.data if not key.startswith(INTERNAL_PREFIX)]

    def queue_push(self, key: str, value: bytes) -> None:
        self._record(Message("push", (key, value)))

    def queue_len(self, key: str) -> int:
        return len(self.queues.get(key, ()))

    # -- blocking operations: raise NotReady instead of waiting ---------------------
    def multi_get(self, keys: list[str]) -> list[bytes]:
        missing = [key for key in keys if key not in self.data]
        if missing:
            raise NotReady(missing)
        return [self.data[key] for key in keys]

    def wait(self, keys: list[str]) -> None:
        missing = [key for key in keys if not self._exists(key)]
        if missing:
            raise NotReady(missing)

    def queue_pop(self, key: str) -> bytes:
        if key not in self.queues:
            raise NotReady([key])
        value = self.queues[key][0]
        self._record(Message("pop", (key,)))
        return value
