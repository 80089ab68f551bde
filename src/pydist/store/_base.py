"""The abstract :class:`Store`: torch.distributed's Store API on two primitives.

Public methods check and coerce their arguments (keys are str, values str or bytes-like,
returned values are bytes; a wrong type raises TypeError naming the argument, a key over
64 KiB or a value over 256 MiB ValueError, on every store alike), then call

- ``_call(op, *args)``: run one non-blocking operation and return its result;
- ``_call_blocking(op, args, timeout_s)``: run a blocking one (multi_get, wait, queue_pop),
  waiting at most ``timeout_s`` seconds (0: do not wait), else raise :class:`StoreTimeoutError`.

``op`` names a request of :data:`pydist.store._protocol.REQUESTS` and a method of
:class:`pydist.store._state.KVState`. Timeouts raise StoreTimeoutError (a DistStoreError)
whose message names the missing keys and the time waited, as torch words it:
``wait timeout after 200ms, keys: a, b (HashStore)``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from ..core import deadline as _deadline
from ..core.deadline import DEFAULT_STORE_TIMEOUT, Deadline, to_seconds
from ..core.errors import DistStoreError, QueueEmptyError
from ._protocol import MAX_KEY_BYTES, MAX_VALUE_BYTES
from ._state import NotReady, wrap_int64

T = TypeVar("T")
ValueLike = str | bytes | bytearray | memoryview


class StoreTimeoutError(DistStoreError):
    """A blocking store operation timed out; ``keys`` are the keys still missing."""

    def __init__(self, message: str, keys: Sequence[str]):
        super().__init__(message)
        self.keys = list(keys)


def timeout_error(where: str, missing: Sequence[str], seconds: float) -> StoreTimeoutError:
    """The error for a wait on ``missing`` keys that gave up after ``seconds``."""
    shown = ", ".join(missing)
    return StoreTimeoutError(f"wait timeout after {round(seconds * 1000)}ms, keys: {shown} ({where})", missing)


def _bounded(size: int, limit: int, name: str) -> None:
    if size > limit:
        raise ValueError(f"{name}: {size} bytes is over the limit of {limit} bytes")


def check_key(key: Any, name: str = "key") -> str:
    """``key`` if it is a str of at most MAX_KEY_BYTES in UTF-8, else TypeError/ValueError
    naming the argument."""
    if not isinstance(key, str):
        raise TypeError(f"{name}: expected str, got {type(key).__name__}")
    if len(key) > MAX_KEY_BYTES // 4:
        _bounded(len(key.encode()), MAX_KEY_BYTES, name)
    return key


def check_keys(keys: Any, name: str = "keys") -> list[str]:
    """``keys`` as a list of str (a bare str is refused: it is not a list of keys)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise TypeError(f"{name}: expected a list of str, got {type(keys).__name__}")
    return [check_key(key, f"{name}[{i}]") for i, key in enumerate(keys)]


def to_bytes(value: Any, name: str = "value") -> bytes:
    """A str (UTF-8) or bytes-like value as bytes, else TypeError naming the argument
    (ValueError if over MAX_VALUE_BYTES)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        raise TypeError(f"{name}: expected str or bytes, got {type(value).__name__}")
    _bounded(len(data), MAX_VALUE_BYTES, name)
    return data


def retry_until(attempt: Callable[[], T], pause: Callable[[float], Any], timeout_s: float, where: str) -> T:
    """Call ``attempt`` until it stops raising NotReady, calling ``pause(seconds_left)``
    between tries; after ``timeout_s`` raise StoreTimeoutError naming the missing keys."""
    deadline = Deadline.after(timeout_s)
    while True:
        try:
            return attempt()
        except NotReady as e:
            left = deadline.remaining() or 0.0
            if left <= 0:
                raise timeout_error(where, e.missing, timeout_s) from None
            pause(left)


class Backoff:
    """A pause that sleeps ``first`` seconds, doubling up to ``cap`` (never past the deadline)."""

    def __init__(self, first: float = 0.001, cap: float = 0.05):
        self._delay = first
        self._cap = cap

    def __call__(self, left: float) -> None:
        _deadline.sleep(min(self._delay, left))
        self._delay = min(self._delay * 2, self._cap)


class Store(ABC):
    """A key/value store shared by the ranks of a job; torch.distributed.Store's API.

    Every store is a context manager; ``close()`` releases its resources.
    """

    def __init__(self, timeout: timedelta = DEFAULT_STORE_TIMEOUT):
        self._timeout = timedelta(seconds=self._seconds(timeout))

    # -- primitives ------------------------------------------------------------------
    @abstractmethod
    def _call(self, op: str, *args: Any) -> Any:
        """Run the non-blocking operation ``op``."""

    @abstractmethod
    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """Run the blocking operation ``op``, waiting at most ``timeout_s`` seconds."""

    def _where(self) -> str:
        """What this store is, for error messages."""
        return type(self).__name__

    # -- timeout ---------------------------------------------------------------------
    @staticmethod
    def _seconds(timeout: Any, name: str = "timeout") -> float:
        seconds = to_seconds(timeout)
        if seconds is None or seconds < 0:
            raise ValueError(f"{name}: expected a non-negative timedelta, got {timeout!r}")
        return seconds

    @property
    def timeout(self) -> timedelta:
        """How long blocking operations wait (torch's default: 5 minutes)."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Change the timeout of later blocking operations."""
        self._timeout = timedelta(seconds=self._seconds(timeout))

    # -- the API ---------------------------------------------------------------------
    def set(self, key: str, value: ValueLike) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""
        self._call("set", check_key(key), to_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store timeout for it to be set."""
        return self._call_blocking("multi_get", ([check_key(key)],), self.timeout.total_seconds())[0]

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer under ``key`` (missing: 0) and return the sum.
        ValueError if the key holds no integer."""
        if not isinstance(amount, int):
            raise TypeError(f"amount: expected int, got {type(amount).__name__}")
        if amount != wrap_int64(amount):
            raise ValueError(f"amount: {amount} is outside the int64 range")
        return self._call("add", check_key(key), int(amount))

    def compare_set(self, key: str, expected_value: ValueLike, desired_value: ValueLike) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` (or is missing and
        ``expected_value`` is empty); return the value now stored, or ``expected_value``
        if the key is missing and nothing was set."""
        expected, desired = to_bytes(expected_value, "expected_value"), to_bytes(desired_value, "desired_value")
        return self._call("compare_set", check_key(key), expected, desired)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Wait until every key (or a queue of that name) exists; DistStoreError naming
        the missing keys after ``timeout`` (default: the store timeout)."""
        seconds = self.timeout.total_seconds() if timeout is None else self._seconds(timeout)
        self._call_blocking("wait", (check_keys(keys),), seconds)

    def check(self, keys: list[str]) -> bool:
        """Whether every key (or a queue of that name) exists, without waiting."""
        return bool(self._call("check", check_keys(keys)))

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return bool(self._call("delete_key", check_key(key)))

    def num_keys(self) -> int:
        """How many keys are stored (queues not counted)."""
        return self._call("num_keys")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, waiting up to the store timeout for all of them."""
        return self._call_blocking("multi_get", (check_keys(keys),), self.timeout.total_seconds())

    def multi_set(self, keys: list[str], values: list[ValueLike]) -> None:
        """Set several keys at once (atomically). ValueError if the lengths differ."""
        checked = check_keys(keys)
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise TypeError(f"values: expected a list of str or bytes, got {type(values).__name__}")
        if len(checked) != len(values):
            raise ValueError(f"multi_set: got {len(checked)} keys but {len(values)} values")
        self._call("multi_set", checked, [to_bytes(v, f"values[{i}]") for i, v in enumerate(values)])

    def append(self, key: str, value: ValueLike) -> None:
        """Append ``value`` to the value of ``key`` (missing: set it)."""
        self._call("append", check_key(key), to_bytes(value))

    def queue_push(self, key: str, value: ValueLike) -> None:
        """Append ``value`` to the queue ``key``."""
        self._call("queue_push", check_key(key), to_bytes(value))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Take the oldest value from the queue ``key``. Blocking: wait up to the store
        timeout (DistStoreError); non-blocking: QueueEmptyError if the queue is empty."""
        key = check_key(key)
        if block:
            return self._call_blocking("queue_pop", (key,), self.timeout.total_seconds())
        try:
            return self._call_blocking("queue_pop", (key,), 0.0)
        except StoreTimeoutError:
            raise QueueEmptyError(f"queue_pop: queue {key!r} is empty ({self._where()})") from None

    def queue_len(self, key: str) -> int:
        """How many values the queue ``key`` holds (0 if it does not exist)."""
        return self._call("queue_len", check_key(key))

    def list_keys(self) -> list[str]:
        """Every stored key (queues not listed)."""
        return self._call("list_keys")

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - a store owning nothing needs no close
        """Release the store's resources (idempotent)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{self._where()}>"
