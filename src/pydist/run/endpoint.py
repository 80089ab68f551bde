"""The job's store at the rendezvous endpoint: hosted by this agent, or reached as a client.

Static rendezvous: node 0 hosts it at ``--master-addr:--master-port``. c10d: the agent on
the host that owns the endpoint's address hosts it (the first one there, if several: they take
turns to start it, see _hosting_turn); the others connect, retrying with backoff for
``connect_timeout`` seconds.
"""
from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from .config import LaunchConfig

#: Seconds between looks at whether another agent of this machine is done starting the store.
TURN_POLL_SECONDS = 0.005


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


@contextlib.contextmanager
def _hosting_turn(port: int, seconds: float) -> Iterator[None]:
    """This agent's turn, among the agents of this machine, to try hosting the store on
    ``port`` (0: no turn needed). Linux lets SO_REUSEADDR sockets that bind one port at the
    same moment both fail to listen (EADDRINUSE) or both listen: 2 simultaneous agents, 3,000
    tries, 19 and 3 times. Each then took it for "another agent hosts it" and was refused for
    ``connect_timeout``, or two stores shared a port. The turn is an abstract Unix socket named
    after the port, bound while the store starts: the kernel releases it when it is closed or
    its agent dies, and it is per network namespace, as the port is. Where there are no
    abstract sockets (not Linux), no turn is taken."""
    if not port:
        yield
        return
    turn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                turn.bind(f"\0pydist-endpoint-{port}")
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    break  # no abstract sockets here
                if time.monotonic() >= deadline:
                    raise EndpointError(f"cannot start the store on port {port}: another agent of this machine "
                                        f"was starting one there for {seconds:g}s") from None
                time.sleep(TURN_POLL_SECONDS)  # real time: another process's start-up
        yield
    finally:
        turn.close()


def open_store(config: LaunchConfig, auth_token: str | None = None) -> tuple[Any, bool]:
    """(the job's TCPStore, whether this agent hosts it), authenticating with ``auth_token``
    (None: no token). Raises EndpointError."""
    from pydist.store import TCPStore  # lazily: not needed to parse arguments

    host, port = config.master_addr, config.master_port
    timeout = timedelta(seconds=config.connect_timeout)
    token = auth_token or ""  # "": no token, whatever the launcher's own environment says
    hosting = config.node_rank == 0 if config.static else is_local_address(host)
    if hosting:
        with _hosting_turn(port if not config.static else 0, config.connect_timeout):
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
