"""init_method URLs to (store, rank, world_size), as torch's rendezvous handlers do.

- ``env://`` (the default): rank, world size and the store's address from the arguments,
  then RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, then the variables of the launcher that
  started the process (torchrun, pydist-run, mpiexec, srun; see :mod:`pydist.rendezvous.launch_env`).
  A TCPStore whose server runs on rank 0, or, under pydist-run/torchrun
  (TORCHELASTIC_USE_AGENT_STORE=True), in the launcher's agent: then the store is the
  agent's seen through a namespace of this launch attempt (:func:`launch_attempt`, else
  ``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``), so neither a restarted attempt nor the
  round after a membership change (``--nnodes 1:2``: same restart count) sees an earlier
  round's keys.
- ``tcp://host:port``: a TCPStore served by rank 0 at host:port.
- ``file:///path``: a FileStore on a file every rank can reach.
``?rank=R&world_size=N`` in any URL stands for the arguments. Missing pieces raise
ValueError naming them, before anything blocks.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

from ..core.settings import settings
from ..store import FileStore, PrefixStore, Store, TCPStore
from ..store._base import timeout_error
from .launch_env import LaunchInfo, job_port, launch_info, parse_hostlist

__all__ = ["rendezvous", "register_rendezvous_handler", "launch_info", "LaunchInfo", "job_port", "parse_hostlist",
           "agent_store", "launch_attempt", "OwningPrefixStore", "TorchStore"]

#: Variables torchrun's agent exports and pydist-run's does not: the agent's store is then
#: torch's C++ TCPStore, reached through torch's client.
TORCHRUN_MARKERS = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE")


def _explicit(name: str, argument: int | None, query: dict[str, list[str]]) -> int | None:
    """rank/world_size from the argument (-1 or None: not given), then the URL query."""
    if argument is not None and argument != -1:
        return int(argument)
    if name in query:
        return int(query[name][0])
    return None


def _required(name: str, value: int | None, url: str) -> int:
    if value is None:
        raise ValueError(f"init_method {url!r}: {name} is required; pass the {name}= argument or ?{name}= in the URL")
    return value


#: init_method schemes added with register_rendezvous_handler: scheme -> handler
_HANDLERS: dict[str, Callable[..., Iterator[tuple[Any, int, int]]]] = {}
_BUILT_IN = ("env", "tcp", "file")


def register_rendezvous_handler(scheme: str, handler: Callable[..., Iterator[tuple[Any, int, int]]]) -> None:
    """Make ``init_method="SCHEME://..."`` call ``handler(url, rank=, world_size=, timeout=)``,
    a generator yielding (a pydist Store, rank, world_size), as torch's handlers do."""
    if not isinstance(scheme, str) or not scheme:
        raise ValueError(f"scheme: expected a non-empty string, got {scheme!r}")
    if scheme in _HANDLERS or scheme in _BUILT_IN:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _HANDLERS[scheme] = handler


def rendezvous(url: str, rank: int | None, world_size: int | None, timeout: timedelta):
    """(store, rank, world_size) for an init_method URL; the caller owns and closes the store."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    scheme = parsed.scheme
    if scheme in _HANDLERS:
        return next(_HANDLERS[scheme](url, rank=rank, world_size=world_size, timeout=timeout))
    if scheme not in ("env", "tcp", "file"):
        raise ValueError(f"init_method {url!r}: unsupported scheme {scheme!r}; expected env://, tcp:// or file://")
    rank, world_size = _explicit("rank", rank, query), _explicit("world_size", world_size, query)
    if scheme == "env":
        info = launch_info(rank, world_size)
        _check_rank(info.rank, info.world_size)
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return agent_store(info, timeout), info.rank, info.world_size
        store = TCPStore(info.master_addr, info.master_port, info.world_size, is_master=info.rank == 0,
                         timeout=timeout, multi_tenant=True)
        return store, info.rank, info.world_size
    rank, world_size = _required("rank", rank, url), _required("world_size", world_size, url)
    if scheme == "tcp" and (not parsed.hostname or parsed.port is None):
        raise ValueError(f"init_method {url!r}: expected tcp://host:port")
    if scheme == "file" and not parsed.path:
        raise ValueError(f"init_method {url!r}: expected file:///absolute/path")
    _check_rank(rank, world_size)
    if scheme == "tcp":
        assert parsed.hostname and parsed.port is not None  # checked above
        store = TCPStore(parsed.hostname, parsed.port, world_size, is_master=rank == 0, timeout=timeout,
                         multi_tenant=True)
        return store, rank, world_size
    return FileStore(parsed.path, world_size), rank, world_size


def _check_rank(rank: int, world_size: int) -> None:
    """Reject a bad rank before a store is created (a store may start a server or a file)."""
    if not 0 <= rank < max(world_size, 1):
        raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")


class OwningPrefixStore(PrefixStore):
    """A PrefixStore that owns its store: ``close()`` closes the store underneath too."""

    def close(self) -> None:
        self.underlying_store.close()


def launch_attempt() -> str:
    """The store namespace of this launch attempt: ``attempt/<run id>/<restart count>/<world
    size>`` under an elastic agent (torchrun, pydist-run: TORCHELASTIC_RUN_ID set), else "".
    torchrun's agent keeps one store across restarts and membership changes (which keep the
    restart count: the world size tells those rounds apart), and torch and pydist name their
    keys alike in every attempt; without this an attempt would read the keys (peer addresses,
    shared-memory names) a failed one left."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return ""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return f"attempt/{run_id}/{restart}/{os.environ.get('WORLD_SIZE', '')}"


def agent_store(info: LaunchInfo, timeout: timedelta) -> OwningPrefixStore:
    """A client of the launcher agent's store at MASTER_ADDR:MASTER_PORT, in this launch
    attempt's namespace (:func:`launch_attempt`; without TORCHELASTIC_RUN_ID
    ``/worker/attempt_{TORCHELASTIC_RESTART_COUNT}``, missing: 0). Under torchrun (see
    :data:`TORCHRUN_MARKERS`; never under pydist-run, which sets PYDIST_RUN_WORKER) with torch
    importable, through torch's TCPStore client."""
    scope = launch_attempt() or f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT') or '0'}"
    torchrun = not settings().run_worker and any(os.environ.get(name) for name in TORCHRUN_MARKERS)
    if torchrun and importlib.util.find_spec("torch"):
        import torch.distributed as tdist
        client: Store = TorchStore(tdist.TCPStore(info.master_addr, info.master_port, info.world_size, False,
                                                  timeout), timeout)
    else:
        client = TCPStore(info.master_addr, info.master_port, info.world_size, is_master=False, timeout=timeout,
                          multi_tenant=True)
    return OwningPrefixStore(scope, client)


class TorchStore(Store):
    """A ``torch.distributed.Store`` as a pydist Store (``close()`` drops the reference)."""

    def __init__(self, store: Any, timeout: timedelta):
        super().__init__(timeout)
        self._store = store

    @property
    def underlying_store(self) -> Any:
        """The torch store."""
        return self._store

    def _where(self) -> str:
        host, port = getattr(self._store, "host", "?"), getattr(self._store, "port", "?")
        return f"torch {type(self._store).__name__} {host}:{port}"

    def _call(self, op: str, *args: Any) -> Any:
        result = getattr(self._store, op)(*args)
        return int(result) if isinstance(result, bool) else result

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        keys = [args[0]] if op == "queue_pop" else list(args[0])
        ready = (lambda: self._store.queue_len(args[0]) > 0) if op == "queue_pop" else (lambda: self._store.check(keys))
        cause = None
        if timeout_s > 0 and not ready():  # torch reads a zero timeout as "forever"
            try:
                self._store.wait(keys, timedelta(seconds=timeout_s))
            except RuntimeError as error:  # torch's DistStoreError when the wait times out
                cause = error
        if not ready():
            raise timeout_error(self._where(), [k for k in keys if not self._store.check([k])], timeout_s) from cause
        if op == "wait":
            return None
        return self._store.multi_get(keys) if op == "multi_get" else self._store.queue_pop(args[0], False)

    def close(self) -> None:
        self._store = None
