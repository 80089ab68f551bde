"""Peers met after init, mixed into TcpTransport: ranks joining the job (``connect``), and,
with lazy connections (lazy.py), peers dialled on first use (``_dial``) or accepted.
``_install`` starts using a peer's connections."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...core import deadline as _deadline
from ...core.deadline import Deadline
from ...core.errors import DistNetworkError, PeerFailedError
from ...net.auth import token_of
from ...net.tls import contexts
from .connection import Connection
from .mesh import PeerRecord, dial, read_records

if TYPE_CHECKING:
    from .joining import JoinListener
    from .lazy import Dialer


class Peers:
    """TcpTransport's table of peers and their connections, as it grows."""

    rank: int
    size: int
    token: str
    peer_timeout: float
    records: dict[int, PeerRecord]
    hosts: dict[int, str]
    _store: object
    _join: JoinListener | None
    _dialer: Dialer | None
    _lanes: dict[int, list[Connection]]
    _extra: dict[int, list[Connection]]
    _by_fd: dict[int, Connection]
    _every: list[Connection]
    _install_lock: threading.Lock

    def _arm(self, conn: Connection, write: bool | None = None) -> None:
        raise NotImplementedError  # TcpTransport registers a connection with its poller

    def peer_lost(self, peer: int, error: BaseException) -> None:
        raise NotImplementedError  # TcpTransport reports a lost peer

    def _dial(self, peer: int) -> list[Connection] | BaseException:
        """``peer``'s connections, dialled now (lazy connections); the error, reported as the
        peer's loss, when it cannot be reached."""
        if self._dialer is None:
            raise KeyError(f"rank {self.rank} has no connection to rank {peer}")
        try:
            return self._dialer.lanes(peer)
        except PeerFailedError as error:
            self.peer_lost(peer, error)
            return error

    def record(self, peer: int) -> PeerRecord:
        """``peer``'s record, read from the store the first time (lazy connections know only
        their own at init, see mesh.publish_and_meet)."""
        known = self.records.get(peer)
        if known is None:
            records, _ = read_records(self._store, [peer], Deadline.after(60))
            known = records[peer]
            with self._install_lock:
                self.records = {**self.records, peer: known}
        return known

    def connect(self, peers: list[int], deadline: Deadline) -> list[int]:
        """Connect to ``peers`` not connected yet (ranks that joined, or, on a joining rank,
        the job's ranks; with lazy connections, the ranks of this host at init): this rank
        dials those above it, and takes the connections of those below it (they dial it). A
        peer that cannot be reached (its process is gone) is left out; the peers left out are
        returned."""
        peers = [p for p in peers if p != self.rank and p not in self._lanes]
        if not peers:
            return []
        records, _ = read_records(self._store, peers, deadline)
        auth, tls, unreachable = token_of(self._store), contexts(), []
        for peer in peers:
            if peer < self.rank and self._dialer is not None:  # lazy: the lower rank dials (see lazy)
                _deadline.poll_until(lambda: peer in self._lanes, deadline)  # noqa: B023 - called at once
                if peer not in self._lanes:
                    unreachable.append(peer)
                continue
            if peer > self.rank:
                try:
                    sockets = dial(self.records[self.rank], records[peer], self.token, deadline, self.peer_timeout,
                                   auth, tls)
                except (OSError, DistNetworkError):
                    unreachable.append(peer)
                    continue
            else:
                assert self._join is not None  # only a joining rank is dialled by lower ranks
                try:
                    sockets = self._join.take(peer, records[peer], deadline)
                except DistNetworkError:
                    unreachable.append(peer)
                    continue
            self._install(peer, records[peer], sockets)
        return unreachable

    def _install(self, peer: int, record: PeerRecord, sockets: list) -> None:
        """Start using ``peer``'s connections (copies of the tables: the I/O thread reads them
        unlocked); a second set (both dialled at once, see lazy) is only read from."""
        connections = [Connection(self, peer, sock, record.lane(k).label)  # type: ignore[arg-type]  # mixed in
                       for k, sock in enumerate(sockets)]
        with self._install_lock:
            self.records = {**self.records, peer: record}
            self.hosts = {**self.hosts, peer: record.host_id}
            self._by_fd = {**self._by_fd, **{conn.fd: conn for conn in connections}}
            self._every = self._every + connections
            if peer in self._lanes:
                self._extra = {**self._extra, peer: self._extra.get(peer, []) + connections}
            else:
                self._lanes = {**self._lanes, peer: connections}
            self.size = max(self.size, peer + 1)
        for conn in connections:
            self._arm(conn)
