"""TCPStore: a store served over TCP by the master rank, torch.distributed's TCPStore.

The master runs the server (:mod:`._tcp_server`: one daemon thread, a ``selectors`` loop
around the sans-IO store service); every rank, the master included, is a client
(:mod:`._tcp_client`: a pool of connections, so threads sharing one client object never wait
behind each other's blocking calls). Connecting retries with backoff until the timeout. Every
call has a client-side deadline (the timeout plus a margin) so a dead server cannot hang it;
a closed or failed connection raises DistNetworkError naming host:port. The store's sockets
live only in these three modules.

With a shared token (``auth_token=``, else PYDIST_AUTH_TOKEN; see :mod:`pydist.net.auth`)
every connection opens with a mutual HMAC challenge–response. The server refuses (and logs,
naming the peer address) a client that fails it, has no token, or speaks torch's protocol;
such a client raises :class:`~pydist.net.auth.AuthenticationError` (a DistNetworkError and a
DistStoreError) saying authentication failed, without retrying.

With PYDIST_TLS_CERT, PYDIST_TLS_KEY and PYDIST_TLS_CA (read when the store is made; see
:mod:`pydist.net.tls`) every connection is mutual TLS, the token's opening (if any) inside it.
The server refuses (and logs) a client without TLS, torch's clients included, or whose
certificate the CA did not sign or that expired; the client raises
:class:`~pydist.store._tcp_client.Refused` at once, saying which side refused and what to fix.
"""
from __future__ import annotations

import math
import weakref
from datetime import timedelta
from typing import Any

from ..core.deadline import DEFAULT_STORE_TIMEOUT, Deadline
from ..core.errors import DistNetworkError, DistStoreError
from ..net import tls as _tls
from ..net.auth import resolve_token
from ._base import Store, StoreTimeoutError, check_key, timeout_error
from ._protocol import ERROR_TYPES, REQUESTS, Message
from ._state import INTERNAL_PREFIX
from ._tcp_client import Pool
from ._tcp_server import Server, acquire_server, release_server

#: Seconds a client waits for an answer beyond the operation's own timeout.
SAFETY_MARGIN_S = 5.0
_WORKERS = INTERNAL_PREFIX + "workers"
_WORKERS_DONE = INTERNAL_PREFIX + "workers_done"


def _shutdown(pool: Pool, server: Server | None) -> None:
    pool.close()
    if server is not None:
        release_server(server)


class TCPStore(Store):
    """A store served over TCP. The master (``is_master=True``) runs the server on
    ``host_name:port`` (port 0: a free one, see ``.port``) and is a client too.

    With ``world_size`` and ``wait_for_workers``, every client counts itself in and the
    master's constructor waits until ``world_size`` clients did, else DistStoreError
    saying how many arrived. ``multi_tenant`` masters in one process share one server per
    (host, port). Closing a master stops its server (the last user's, if shared).

    The server binds only ``host_name`` ("" or "0.0.0.0": every interface). ``auth_token``
    (str or bytes; default PYDIST_AUTH_TOKEN, "" for none) makes the server and this client
    authenticate each other on every connection; the transports of a process group met
    through this store use the same token. Wrong or missing token: AuthenticationError.
    PYDIST_TLS_* (all three or none, else ValueError) put every connection in mutual TLS.
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: timedelta = DEFAULT_STORE_TIMEOUT, wait_for_workers: bool = True,
                 multi_tenant: bool = False, auth_token: str | bytes | None = None):
        super().__init__(timeout)
        self._auth_token = resolve_token(auth_token)
        tls = _tls.contexts()
        check_key(host_name, "host_name")
        for name, value in (("port", port), ("world_size", 1 if world_size is None else world_size)):
            if not isinstance(value, int):
                raise TypeError(f"{name}: expected int, got {type(value).__name__}")
        if not 0 <= port <= 65535 or (port == 0 and not is_master):
            raise ValueError(f"port: expected 1..65535 (0 only for the master), got {port}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size: expected a positive int or None, got {world_size}")
        self._server = (acquire_server(host_name, port, multi_tenant, self._auth_token, tls.server if tls else None)
                        if is_master else None)
        self._host, self._port = host_name, self._server.port if self._server else port
        self._pool = Pool(host_name or "localhost", self._port, self._where(), self._auth_token,
                          tls.client if tls else None)
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._server)
        try:
            first = self._pool.connect(self.timeout.total_seconds(), retry=True)
            self._client_address = first.local_address
            self._pool.put(first)
            if wait_for_workers and world_size is not None:
                self._count_in(world_size, is_master)
        except BaseException:
            self.close()
            raise

    @property
    def host(self) -> str:
        """The address of the store's server."""
        return self._host

    @property
    def port(self) -> int:
        """The port of the store's server (the one taken when 0 was asked for)."""
        return self._port

    @property
    def auth_token(self) -> bytes | None:
        """The shared token this store authenticates with (None: it does not); transports
        rendezvousing through this store use it (see ``pydist.net.auth.token_of``)."""
        return self._auth_token

    def client_address(self) -> str:
        """The local IP address of this client's connection to the server."""
        return self._client_address

    def server_stats(self) -> dict[str, Any] | None:
        """The counts of the server this master runs (requests by name, connections open,
        peak and opened; see ``_limits.ServiceStats``), or None for a client only."""
        return self._server.stats() if self._server is not None else None

    def _where(self) -> str:
        return f"TCPStore {self._host}:{self._port}"

    def _count_in(self, world_size: int, is_master: bool) -> None:
        if self._call("add", _WORKERS, 1) >= world_size:
            self._call("set", _WORKERS_DONE, b"1")
        if not is_master:
            return
        try:
            self._call_blocking("wait", ([_WORKERS_DONE],), self.timeout.total_seconds())
        except StoreTimeoutError:
            arrived = self._call("add", _WORKERS, 0)
            raise DistStoreError(
                f"{self._where()}: only {arrived} of {world_size} workers connected "
                f"within {self.timeout.total_seconds():g}s") from None

    def _request(self, msg: Message, wait_s: float) -> Any:
        answer = self._pool.request(msg, Deadline.after(wait_s + SAFETY_MARGIN_S), self.timeout.total_seconds())
        if answer.name == "timeout":
            missing, waited_ms = answer.args
            raise timeout_error(self._where(), missing, waited_ms / 1000)
        if answer.name == "error":
            code, message = answer.args
            raise ERROR_TYPES.get(code, DistStoreError)(message)
        if answer.name != REQUESTS[msg.name].result:
            raise DistNetworkError(f"store server at {self._host}:{self._port} answered {msg.name} with {answer.name}")
        return answer.args[0] if answer.args else None

    def _call(self, op: str, *args: Any) -> Any:
        return self._request(Message(op, args), self.timeout.total_seconds())

    def _call_blocking(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        return self._request(Message(op, (*args, math.ceil(timeout_s * 1000))), timeout_s)

    def close(self) -> None:
        """Close this client's connections; a master also stops (or releases) its server."""
        self._finalizer()
