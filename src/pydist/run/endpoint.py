"""The job's store at the rendezvous endpoint: hosted by this agent, or reached as a client.

Static rendezvous: node 0 hosts it at ``--master-addr:--master-port``. c10d: the agent on
the host that owns the endpoint's address hosts it (the first one there, if several);
the others connect, retrying with backoff for ``connect_timeout`` seconds.
"""
from __future__ import annotations

import errno
import socket
from datetime import timedelta
from typing import Any

from .config import LaunchConfig


class EndpointError(RuntimeError):
    """The store could not be started or reached."""


def is_local_address(host: str) -> bool:
    """True if ``host`` resolves to an address of this machine (network namespace)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((address[0], 0))
                return True
            except OSError:
                continue
    return False


def _in_use(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


def open_store(config: LaunchConfig, auth_token: str | None = None) -> tuple[Any, bool]:
    """(the job's TCPStore, whether this agent hosts it), authenticating with ``auth_token``
    (None: no token). Raises EndpointError."""
    from pydist.store import TCPStore  # lazily: not needed to parse arguments

    host, port = config.master_addr, config.master_port
    timeout = timedelta(seconds=config.connect_timeout)
    token = auth_token or ""  # "": no token, whatever the launcher's own environment says
    hosting = config.node_rank == 0 if config.static else is_local_address(host)
    if hosting:
        try:
            return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout,
                            auth_token=token), True
        except RuntimeError as exc:  # DistNetworkError and friends
            if config.static or port == 0 or not _in_use(exc):
                raise EndpointError(f"cannot start the store on {host}:{port}: {exc}") from None
    if port == 0:
        raise EndpointError(f"this node does not host the store ({host} is not one of its addresses), "
                            "so the rendezvous port must be given (--master-port or --rdzv-endpoint HOST:PORT)")
    try:
        return TCPStore(host, port, is_master=False, timeout=timeout, auth_token=token), False
    except RuntimeError as exc:
        raise EndpointError(f"cannot reach the rendezvous endpoint {host}:{port} "
                            f"(retried with backoff for {config.connect_timeout:g}s): {exc}") from None
