"""init_method URLs to (store, rank, world_size), as torch's rendezvous handlers do.

- ``env://`` (the default): MASTER_ADDR, MASTER_PORT, and RANK/WORLD_SIZE unless given as
  arguments; a TCPStore whose server runs on rank 0, or, under pydist-run/torchrun
  (TORCHELASTIC_USE_AGENT_STORE=True), in the launcher's agent.
- ``tcp://host:port``: a TCPStore served by rank 0 at host:port.
- ``file:///path``: a FileStore on a file every rank can reach.
``?rank=R&world_size=N`` in any URL stands for the arguments. Missing pieces raise
ValueError naming them, before anything blocks.
"""
from __future__ import annotations

import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from .store import FileStore, TCPStore


def _pick(name: str, argument: int, query: dict[str, list[str]], env: str | None, url: str) -> int:
    """The value of rank/world_size: argument, then URL query, then environment variable."""
    if argument is not None and argument != -1:
        return int(argument)
    if name in query:
        return int(query[name][0])
    if env is not None and os.environ.get(env) is not None:
        try:
            return int(os.environ[env])
        except ValueError:
            raise ValueError(f"environment variable {env}={os.environ[env]!r} is not an integer") from None
    where = f"the {name}= argument, ?{name}= in the URL" + (f" or the {env} environment variable" if env else "")
    raise ValueError(f"init_method {url!r}: {name} is required; pass {where}")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"Error initializing pydist using env:// rendezvous: environment variable "
                         f"{name} expected, but not set")
    return value


def rendezvous(url: str, rank: int, world_size: int, timeout: timedelta):
    """(store, rank, world_size) for an init_method URL; the caller owns and closes the store."""
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    scheme = parsed.scheme
    if scheme == "env":
        rank = _pick("rank", rank, query, "RANK", url)
        world_size = _pick("world_size", world_size, query, "WORLD_SIZE", url)
        host, port_text = _env("MASTER_ADDR"), _env("MASTER_PORT")
        try:
            port = int(port_text)
        except ValueError:
            raise ValueError(f"environment variable MASTER_PORT={port_text!r} is not a port number") from None
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return _tcp_store(host, port, rank, world_size, timeout, agent_store), rank, world_size
    if scheme == "tcp":
        if not parsed.hostname or parsed.port is None:
            raise ValueError(f"init_method {url!r}: expected tcp://host:port")
        rank = _pick("rank", rank, query, None, url)
        world_size = _pick("world_size", world_size, query, None, url)
        return _tcp_store(parsed.hostname, parsed.port, rank, world_size, timeout, False), rank, world_size
    if scheme == "file":
        path = parsed.path
        if not path:
            raise ValueError(f"init_method {url!r}: expected file:///absolute/path")
        rank = _pick("rank", rank, query, None, url)
        world_size = _pick("world_size", world_size, query, None, url)
        _check_rank(rank, world_size)
        return FileStore(path, world_size), rank, world_size
    raise ValueError(f"init_method {url!r}: unsupported scheme {scheme!r}; expected env://, tcp:// or file://")


def _check_rank(rank: int, world_size: int) -> None:
    """Reject a bad rank before a store is created (a store may start a server or a file)."""
    if not 0 <= rank < max(world_size, 1):
        raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta, agent_store: bool) -> TCPStore:
    _check_rank(rank, world_size)
    return TCPStore(host, port, world_size, is_master=(rank == 0 and not agent_store), timeout=timeout,
                    multi_tenant=True)
