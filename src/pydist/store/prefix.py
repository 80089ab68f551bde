"""PrefixStore: a view of another store whose keys all start with ``prefix + "/"``."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from ._base import Store, check_key
from ._protocol import REQUESTS


class PrefixStore(Store):
    """Every key ``k`` is stored as ``prefix + "/" + k`` in ``store`` (as torch does).

    ``list_keys`` lists only this prefix's keys (without the prefix); ``num_keys`` counts
    every key of the underlying store, as torch's PrefixStore does. The timeout is the
    underlying store's. ``close()`` does not close the underlying store.
    """

    def __init__(self, prefix: str, store: Store):
        if not isinstance(store, Store):
            raise TypeError(f"store: expected a pydist Store, got {type(store).__name__}")
        self._prefix = check_key(prefix, "prefix") + "/"
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one writes into."""
        return self._store

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def _where(self) -> str:
        return f"PrefixStore {self._prefix[:-1]!r} over {self._store._where()}"

    def _map(self, op: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` with every key (kind s) and key list (kind S) prefixed."""
        kinds = REQUESTS[op].fields
        return tuple(
            self._prefix + a if k == "s" else [self._prefix + key for key in a] if k == "S" else a
            for k, a in zip(kinds, args)
        )

    def _call(self, op: str, *args: Any) -> Any:
        return self._store._call(op, *self._map(op, args))

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        return self._store._call_blocking(op, self._map(op, args), timeout_s)

    def list_keys(self) -> list[str]:
        """This prefix's keys, without the prefix."""
        n = len(self._prefix)
        return [key[n:] for key in self._store.list_keys() if key.startswith(self._prefix)]
