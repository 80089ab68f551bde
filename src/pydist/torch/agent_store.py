"""pydist-run's workers' store as a ``torch.distributed.Store``, for torch's env:// rendezvous.

Under pydist-run (TORCHELASTIC_USE_AGENT_STORE=True) torch's env:// handler connects to the
store at MASTER_ADDR:MASTER_PORT with torch's C++ TCPStore client, which can neither
authenticate (PYDIST_AUTH_TOKEN) nor speak TLS (PYDIST_TLS_*); pydist-run's stores require
a token by default, so that client would be refused. :class:`PydistStore` is a Python
subclass of ``torch.distributed.Store`` that forwards every call to pydist's TCPStore client
(which authenticates, and speaks TLS when configured): torch, gloo and the pydist plugin
call it like any torch store (torch dispatches the C++ calls of gloo and PrefixStore to the
Python methods: set, get, add, compare_set, check, delete_key, num_keys, wait, multi_get,
multi_set, append, queue ops, list_keys). pydist's store errors are raised as torch's
(DistNetworkError, DistStoreError, QueueEmptyError from ``queue_pop(block=False)`` on an
empty queue), the pydist error as the cause, so torch's handling of a store timeout or a
lost store is unchanged.

:func:`agent_store_rendezvous` is the env:// and tcp:// handler that yields it; the wrappers
(:mod:`.env_rendezvous`) use it under pydist-run (PYDIST_RUN_WORKER=1) when the store
authenticates (tcp:// only when its host:port is MASTER_ADDR:MASTER_PORT), and torch's
handlers otherwise. Each rendezvous opens one client; the clients of earlier rendezvous are
closed by the next one once torch has no default group (every group that used them was
destroyed), so init/destroy cycles keep at most one client open.

What cannot be helped: a torch C++ ``TCPStore`` client of the workers' store that torch's
rendezvous does not make (a framework's own ``TCPStore(MASTER_ADDR, MASTER_PORT)``) is
refused; its constructor fails with torch's DistNetworkError ("Failed to recv, got 0 bytes")
after its timeout, and the launcher logs "a torch TCPStore client, refused ...".
"""
from __future__ import annotations

import copy
import os
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import torch.distributed as tdist

from ..core.errors import DistNetworkError, DistStoreError, QueueEmptyError
from ..core.settings import settings
from ..net import tls as _tls
from ..net.auth import resolve_token
from ..store import TCPStore

_F = TypeVar("_F", bound=Callable[..., Any])
#: The stores handed to torch, kept alive while torch may use them: torch keeps only the C++
#: half of a Python Store (in PrefixStore, gloo), and once the Python object is gone, calling
#: it fails ("Not implemented"). Closed by the next rendezvous once torch has no default group.
_KEPT: list[PydistStore] = []


def _as_torch_errors(method: _F) -> _F:
    """Raise pydist's store errors as torch's (the pydist error as the cause)."""
    @wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except DistNetworkError as error:
            raise tdist.DistNetworkError(str(error)) from error
        except QueueEmptyError as error:  # queue_pop(block=False) on an empty queue, as torch's stores
            raise tdist.QueueEmptyError(str(error)) from error
        except DistStoreError as error:
            raise tdist.DistStoreError(str(error)) from error
    return call  # type: ignore[return-value]


class PydistStore(tdist.Store):
    """A ``torch.distributed.Store`` that forwards to a pydist store (a TCPStore client).
    ``set_timeout`` sets both torch's and the pydist store's timeout. ``clone`` (torch clones
    a store per shrunk group) gives a store over the same client, whose connection pool
    serves concurrent calls each on a connection of its own, with a timeout of its own: no
    connection per clone. Clones are kept alive by this store (torch holds only their C++
    half); ``close`` closes the pydist store, which ends its clones too; a clone's ``close``
    closes nothing (``owner``: whether this store closes the pydist one)."""

    def __init__(self, store: TCPStore, owner: bool = True):
        super().__init__()
        self._store = store
        self._owner = owner
        self._clones: list[PydistStore] = []
        super().set_timeout(store.timeout)

    @property
    def underlying_store(self) -> TCPStore:
        """The pydist store (its ``auth_token`` is the one the transports use)."""
        return self._store

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        self._store.set_timeout(timeout)

    @_as_torch_errors
    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value)

    @_as_torch_errors
    def get(self, key: str) -> bytes:
        return self._store.get(key)

    @_as_torch_errors
    def add(self, key: str, amount: int) -> int:
        return self._store.add(key, amount)

    @_as_torch_errors
    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._store.compare_set(key, expected_value, desired_value)

    @_as_torch_errors
    def check(self, keys: list[str]) -> bool:
        return self._store.check(list(keys))

    @_as_torch_errors
    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    @_as_torch_errors
    def num_keys(self) -> int:
        return self._store.num_keys()

    @_as_torch_errors
    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._store.wait(list(keys), timeout)

    @_as_torch_errors
    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._store.multi_get(list(keys))

    @_as_torch_errors
    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._store.multi_set(list(keys), list(values))

    @_as_torch_errors
    def append(self, key: str, value: Any) -> None:
        self._store.append(key, value)

    @_as_torch_errors
    def queue_push(self, key: str, value: Any) -> None:
        self._store.queue_push(key, value)

    @_as_torch_errors
    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(key, block)

    @_as_torch_errors
    def queue_len(self, key: str) -> int:
        return self._store.queue_len(key)

    @_as_torch_errors
    def list_keys(self) -> list[str]:
        return self._store.list_keys()

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> PydistStore:
        # a shallow copy shares the client's connection pool (and server); set_timeout rebinds
        # the copy's own timeout only
        clone = PydistStore(copy.copy(self._store), owner=False)
        self._clones.append(clone)
        return clone

    def close(self) -> None:
        self._clones.clear()
        if self._owner:
            self._store.close()


def applies(environ: Any = None) -> bool:
    """Whether torch's env:// must reach MASTER_ADDR:MASTER_PORT with pydist's client: under
    pydist-run's agent store (PYDIST_RUN_WORKER=1, TORCHELASTIC_USE_AGENT_STORE=True) when
    that store authenticates (PYDIST_AUTH_TOKEN) or speaks TLS (PYDIST_TLS_*)."""
    env = os.environ if environ is None else environ
    if not settings().run_worker or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    return resolve_token() is not None or _tls.contexts() is not None


def _required(env_var: str) -> str:
    value = os.environ.get(env_var)
    if not value:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: environment variable "
                         f"{env_var} expected, but not set")
    return value


def _addresses(host: str, port: int) -> set[Any]:
    try:
        return {info[4] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:  # unresolvable: it is no address of the workers' store
        return set()


def targets_workers_store(url: str) -> bool:
    """Whether ``url`` (tcp://host:port) names the workers' store, MASTER_ADDR:MASTER_PORT
    (the same port, and the same host name or an address in common)."""
    parsed = urlparse(url)
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not parsed.hostname or parsed.port is None or not port.isdigit() or parsed.port != int(port):
        return False
    return parsed.hostname == addr or bool(_addresses(parsed.hostname, parsed.port) & _addresses(addr, int(port)))


def _release_unused() -> None:
    """Close the stores of earlier rendezvous when torch has no default group: every torch
    group that used them was destroyed (destroy_process_group)."""
    if not tdist.is_initialized():
        while _KEPT:
            _KEPT.pop().close()


def agent_store_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30),
                           **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """torch's env:// or tcp:// handler under pydist-run's agent store, with pydist's client
    (see the module docstring): rank and world size from the URL, else (env:// only, as
    torch) RANK and WORLD_SIZE; the store at the tcp:// URL's host:port, else
    MASTER_ADDR:MASTER_PORT; torch's ValueError for what is missing. As torch 2.13's
    handlers under an agent store, the store is the client itself, with no attempt prefix
    (each pydist-run round has a store of its own); other ``kwargs`` are ignored as torch's
    handlers ignore them."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    if parsed.scheme == "tcp":  # torch's tcp:// reads no variable: rank and world size are in the URL
        for name, what in (("rank", "rank parameter"), ("world_size", "world size parameter")):
            if name not in query:
                raise ValueError(f"Error initializing torch.distributed using tcp:// rendezvous: {what} missing")
    rank = int(query["rank"][0]) if "rank" in query else int(_required("RANK"))
    world_size = int(query["world_size"][0]) if "world_size" in query else int(_required("WORLD_SIZE"))
    if parsed.scheme == "tcp" and parsed.hostname and parsed.port is not None:
        master_addr, master_port = parsed.hostname, parsed.port
    else:
        master_addr, master_port = _required("MASTER_ADDR"), int(_required("MASTER_PORT"))
    _release_unused()
    try:
        client = TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    except DistNetworkError as error:
        raise tdist.DistNetworkError(str(error)) from error
    except DistStoreError as error:
        raise tdist.DistStoreError(str(error)) from error
    store = PydistStore(client)
    _KEPT.append(store)
    yield store, rank, world_size
    raise RuntimeError(f"Unable to perform re-rendezvous using {parsed.scheme}:// method")
