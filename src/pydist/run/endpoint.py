"""The job's store at the rendezvous endpoint: hosted by this agent, or reached as a client.

Static rendezvous: node 0 hosts it at ``--master-addr:--master-port``. c10d: the agent on
the host that owns the endpoint's address hosts it (the first one there, if several: they take
turns to start it, see :mod:`.turn`); the others connect, retrying with backoff for
``connect_timeout`` seconds.

Before connecting, a client looks at what answers there (:mod:`.store_probe`): a program that
is not a pydist store, or a pydist store that refuses this job's credentials (another job's),
fails the launch within seconds with an EndpointError that names the port and, on this
machine, the process holding it (:mod:`.holders`). "The tokens differ" is said only when this
job was given a token (PYDIST_AUTH_TOKEN) and the store there requires one.
"""
from __future__ import annotations

import errno
import socket
from datetime import timedelta
from typing import Any

from ..net.addresses import host_port
from ..net.auth import TOKEN_ENV
from .config import LaunchConfig
from .holders import tcp_listener
from .store_probe import FOREIGN, REFUSED, SILENT, Probe, probe_store
from .turn import EndpointError, hosting_turn, store_address

__all__ = ["EndpointError", "is_local_address", "open_store"]

#: What to do about a port someone else holds.
_ADVICE = "Choose another port (--rdzv-endpoint HOST:PORT or --master-port; --standalone takes a free one)"


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


def _holder(host: str, port: int) -> str:
    """Who listens on ``host:port`` of this machine (``pid 1 ('x') of uid 2``), "" where not known."""
    holder = tcp_listener(store_address(host), port) if is_local_address(host) else None
    return holder.describe() if holder is not None else ""


def open_store(config: LaunchConfig, auth_token: str | None = None) -> tuple[Any, bool]:
    """(the job's TCPStore, whether this agent hosts it), authenticating with ``auth_token``
    (None: no token). Raises EndpointError."""
    from pydist.store import TCPStore  # lazily: not needed to parse arguments

    host, port = config.master_addr, config.master_port
    where = host_port(host, port)
    timeout = timedelta(seconds=config.connect_timeout)
    token = auth_token or ""  # "": no token, whatever the launcher's own environment says
    hosting = config.node_rank == 0 if config.static else is_local_address(host)
    if hosting:
        with hosting_turn(host, port if not config.static else 0, config.connect_timeout):
            try:
                return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout,
                                auth_token=token), True
            except RuntimeError as exc:  # DistNetworkError and friends
                if config.static or port == 0 or not _in_use(exc):
                    holder = _holder(host, port) if _in_use(exc) else ""
                    raise EndpointError(f"cannot start the store on {where}: {exc}"
                                        + (f" (held by {holder})" if holder else "")) from None
    if port == 0:
        raise EndpointError(f"this node does not host the store ({host} is not one of its addresses), "
                            "so the rendezvous port must be given (--master-port or --rdzv-endpoint HOST:PORT)")
    _refuse_strangers(config, token)
    try:
        return TCPStore(host, port, is_master=False, timeout=timeout, auth_token=token), False
    except RuntimeError as exc:  # its message says how long it tried, when it did
        raise EndpointError(f"cannot reach the rendezvous endpoint {where}: {exc}") from None


def _refuse_strangers(config: LaunchConfig, token: str) -> None:
    """Raise EndpointError if what answers at the endpoint is not a pydist store, or a pydist
    store that refuses this job (see :mod:`.store_probe`)."""
    from ..net import tls as _tls

    host, port = config.master_addr, config.master_port
    try:
        contexts = _tls.contexts()
    except ValueError:
        return  # the store's client raises it, with its words
    found = probe_store(host, port, token.encode() or None, contexts.client if contexts else None)
    if found.verdict in (SILENT, FOREIGN, REFUSED):
        raise EndpointError(f"cannot use the rendezvous endpoint {host_port(host, port)}: "
                            f"{_what_holds_it(config, token, found, _holder(host, port))}. {_ADVICE}")


def _what_holds_it(config: LaunchConfig, token: str, found: Probe, holder: str) -> str:
    """What the probe found (``holder``: who listens there, if known), in words that claim no
    more than this agent knows."""
    held = f" ({holder})" if holder else ""
    if found.verdict != REFUSED:
        return f"the port is held by a program that is not a pydist store{held}: {found.detail}"
    given = bool(config.base_env.get(TOKEN_ENV))
    store = f"the pydist store on that port{held}"
    if found.store_has_token and not token:
        return (f"{store} requires a token and this job has none: it is another job's store, "
                f"or {TOKEN_ENV} is set on the node that hosts it only")
    if not found.store_has_token:
        return (f"{store} has no token and this job has one"
                + (f" ({TOKEN_ENV}): it is another job's store, or {TOKEN_ENV} is not set on the node that hosts it"
                   if given else " (generated for this single-node job): it is another job's store"))
    if given:
        return f"{store} refused this job's {TOKEN_ENV}: it is another job's store, or the nodes' tokens differ"
    return (f"the port is used by another job's pydist store{held}: this single-node job has a secret of its "
            "own, so it cannot share that store")
