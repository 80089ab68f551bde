"""Connections on first use (PYDIST_TCP_CONNECT): a pair of ranks connects when it first
exchanges a message, not at init.

Every rank listens and publishes its record as with the full mesh (mesh.py), then accepts,
in a thread of its own (joining.JoinListener), any rank that dials it. A rank dials a peer
when it first sends to it (``Dialer.lanes``), and when it posts a receive naming a peer that
has not dialled it within DIAL_LATER_SECONDS (``Dialer.soon``: a live sender dials first, so
the pair does not connect twice), so that a peer that is gone is named at the first
operation that needs it (its listener refuses at once; a vanished host does not answer
within ``dial_seconds``) instead of at the operation's timeout. A ring or a tree touches 2
or log2(N) peers per rank, not N-1. Rank 0 reads every record and publishes a directory of
host identities; the others read that, and a peer's record when they dial it
(mesh.publish_and_meet).

Two ranks may dial each other at once: each keeps sending on the connections it installed
first (so its messages to that peer stay in order) and reads all of them (see
Peers._install). Ranks sharing a host with shared memory connect at init all the same
(WorldTransport): the shared-memory transport learns of a local peer's death from its socket.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from ...core.deadline import Deadline
from ...core.errors import DistNetworkError, PeerFailedError
from ...net.tls import Contexts
from .joining import JoinListener
from .liveness import verdict
from .mesh import Connection, PeerRecord, dial, lane_count

#: ranks from which PYDIST_TCP_CONNECT=auto connects on first use
LAZY_FROM = 64
#: seconds a receive naming an unconnected peer leaves it to dial first (see Dialer.soon)
DIAL_LATER_SECONDS = 0.25


#: why a dial failed, by what /proc says of the peer (liveness.verdict; other hosts: "gone")
_WHY = {"stopped": "its process is stopped", "alive": "its process runs but did not answer",
        "gone": "its process is gone, or its host or the network between them is"}


def lazy(setting: str, size: int) -> bool:
    """Whether a world of ``size`` ranks connects on first use under PYDIST_TCP_CONNECT=``setting``."""
    return setting == "lazy" or (setting == "auto" and size >= LAZY_FROM)


def dial_seconds(peer_timeout: float) -> float:
    """How long a dial may take before the peer counts as gone: three heartbeat timeouts
    (a loaded host's acceptor may be slow), 60 s without a heartbeat."""
    return 3 * peer_timeout if peer_timeout > 0 else 60.0


class Dialer:
    """Dials peers for one transport, once each (concurrent callers for a peer wait for one dial)."""

    def __init__(self, record: Callable[[int], PeerRecord], rank: int, token: str, peer_timeout: float,
                 auth_token: bytes | None, tls: Contexts | None,
                 install: Callable[[int, PeerRecord, list[Connection]], None],
                 installed: Callable[[int], list | None], unreachable: Callable[[int, BaseException], None]):
        self._record, self._rank, self._token = record, rank, token
        self._peer_timeout, self._auth_token, self._tls = peer_timeout, auth_token, tls
        self._install, self._installed, self._unreachable = install, installed, unreachable
        self._locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._soon: set[int] = set()  # peers a timer will dial unless they dial first

    def lanes(self, peer: int) -> list:
        """``peer``'s connections, dialled now if there are none; PeerFailedError naming it when
        it cannot be reached."""
        lanes = self._installed(peer)
        if lanes is not None:
            return lanes
        with self._locks_lock:
            lock = self._locks.setdefault(peer, threading.Lock())
        with lock:
            lanes = self._installed(peer)
            if lanes is None:
                self._dial(peer)
                lanes = self._installed(peer)
        assert lanes is not None  # installed by _dial (or by the acceptor meanwhile)
        return lanes

    def soon(self, peer: int) -> None:
        """A receive names ``peer``: dial it in DIAL_LATER_SECONDS unless it dialled first
        (``unreachable(peer, error)`` is told when it cannot be reached)."""
        with self._locks_lock:
            if peer in self._soon:
                return
            self._soon.add(peer)
        timer = threading.Timer(DIAL_LATER_SECONDS, self._dial_unless_met, (peer,))
        timer.daemon = True
        timer.start()

    def _dial_unless_met(self, peer: int) -> None:
        with self._locks_lock:
            self._soon.discard(peer)
        try:
            self.lanes(peer)
        except PeerFailedError as error:
            self._unreachable(peer, error)

    def _dial(self, peer: int) -> None:
        mine, theirs = self._record(self._rank), self._record(peer)
        try:
            sockets = dial(mine, theirs, self._token, Deadline.after(dial_seconds(self._peer_timeout)),
                           self._peer_timeout, self._auth_token, self._tls)
        except (OSError, DistNetworkError) as error:
            why = _WHY[verdict(theirs.process, mine.process) or "gone"]
            raise PeerFailedError(f"rank {self._rank} could not connect to rank {peer} on {theirs.label}: {why} "
                                  f"({error})", rank=peer, host=theirs.hostname) from error
        self._install(peer, theirs, sockets)


def meet_on_first_use(transport: Any, listeners: list[socket.socket], auth_token: bytes | None,
                      tls: Contexts | None) -> tuple[Dialer, JoinListener]:
    """``transport``'s (TcpTransport's) dialer, and its acceptor of any rank on ``listeners``."""
    record, rank = transport.record, transport.rank
    dialer = Dialer(record, rank, transport.token, transport.peer_timeout, auth_token, tls,
                    transport._install, lambda peer: transport._lanes.get(peer), transport.peer_lost)
    acceptor = JoinListener(record(rank), listeners, transport.token, transport.peer_timeout, auth_token, tls,
                            set(transport.hosts) - {rank},
                            lambda peer, sockets: transport._install(peer, record(peer), sockets),
                            lambda peer: lane_count(record(rank), record(peer)), lambda peer: record(peer).claim)
    return dialer, acceptor
