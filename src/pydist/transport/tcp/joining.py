"""A rank that joins a running job: its listeners stay open while the job's ranks connect to it.

The ranks already in the job dial a newcomer (each lane's HELLO carries the world token and
names the lane); among newcomers the lower rank dials the higher. So a joining rank accepts
from any lower rank of the job, lane by lane, in a thread of its own, and its transport
takes a peer's connections once all of that peer's lanes are in (``take``), so that both
ends agree on the lanes before any message is striped over them.
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable

from ...core.deadline import Deadline
from ...core.errors import DistNetworkError
from ...core.settings import settings
from ...net.auth import token_of
from ...net.tls import Contexts, contexts
from .admission import Admission, serve
from .mesh import (
    Connection,
    PeerRecord,
    _tune,
    lane_count,
    lane_token,
    open_listeners,
    own_record,
    publish,
    read_records,
)
from .mesh_tls import secured

log = logging.getLogger("pydist.transport")
#: seconds between two looks at whether the listener is closing
POLL_SECONDS = 0.2


class JoinListener:
    """Accepts the connections of ranks below ``record.rank`` (or of any rank in ``expected``)
    on each of this rank's listeners until closed; ``take(peer, theirs, deadline)`` hands
    over one peer's, or, with ``deliver``, each peer's go to ``deliver(peer, connections)``
    once all ``lanes_of(peer)`` of its lanes are in (lazy connections, see lazy.py).
    Handshakes run side by side in the listener's thread, one selector for every lane
    (:mod:`.admission`); without a secret a HELLO must carry the ``claim_of(peer)`` of the
    rank's record (None: not checked), and a second connection claiming a (rank, lane)
    accepted already is refused. A failed accept follows :mod:`pydist.net.accepting` (out of
    file descriptors: the least advanced unproven connection is dropped, else a pause), logged
    rate limited; an error that ends the listener's thread is logged, and cuts the
    handshakes in flight."""

    def __init__(self, record: PeerRecord, listeners: list[socket.socket], token: str, peer_timeout: float,
                 auth_token: bytes | None, tls: Contexts | None, expected: set[int] | None = None,
                 deliver: Callable[[int, list[Connection]], None] | None = None,
                 lanes_of: Callable[[int], int] = lambda peer: 1,
                 claim_of: Callable[[int], str | None] = lambda peer: None):
        self.record = record
        self._expected = set(range(record.rank)) if expected is None else expected
        self._deliver, self._lanes_of = deliver, lanes_of
        self._listeners = listeners
        self._token, self._peer_timeout, self._auth_token, self._tls = token, peer_timeout, auth_token, tls
        self._arrived: dict[tuple[int, int], Connection] = {}  # (peer, lane) -> its connection
        self._met: set[tuple[int, int]] = set()  # (peer, lane) accepted once (see _arrive)
        timeout = settings().handshake_timeout
        self._selector = selectors.DefaultSelector()
        self._admissions = [Admission(record.rank, lane_token(token, lane), auth_token, tls, claim_of, timeout,
                                      len(self._expected), self._selector) for lane in range(len(listeners))]
        self._changed = threading.Condition()
        self._closing = False
        for lane, (listener, admission) in enumerate(zip(listeners, self._admissions)):
            admission.listen(listener, lambda: self._expected, self._met_on(lane), lambda: not self._closing)
        self._thread = threading.Thread(target=self._run, name=f"pydist-tcp-join-{record.rank}", daemon=True)
        self._thread.start()

    def _met_on(self, lane: int) -> Callable[[int], bool]:
        """Whether a peer's connection on ``lane`` was accepted once (see _arrive)."""
        return lambda peer: (peer, lane) in self._met

    def _run(self) -> None:
        try:
            while not self._closing:
                due = [d for d in (a.due() for a in self._admissions) if d is not None]
                serve(self._selector, min([POLL_SECONDS, *due]))
                for lane, admission in enumerate(self._admissions):
                    admission.reap()
                    for peer, sock, where in admission.take():
                        self._arrive(peer, lane, sock, where)
        except Exception:  # a bug: this rank accepts no more connections; say so
            log.exception("pydist rank %d: the listener of lazy connections stopped", self.record.rank)
        finally:
            for admission in self._admissions:
                admission.close()
            self._selector.close()

    def _arrive(self, peer: int, lane: int, sock: socket.socket, where) -> None:
        """A proven connection of ``peer`` on ``lane``: kept (with a secret a later one of the
        same lane replaces it: a retry whose first try failed on its side; without one the
        Admission refused a second claim in its HELLO)."""
        with self._changed:
            if self._closing:
                sock.close()
                return
            self._met.add((peer, lane))  # without a secret, the Admission lets one claim of it through
            connection = secured(_tune(sock, self._peer_timeout))
            stale = self._arrived.pop((peer, lane), None)
            if stale is not None:
                stale.close()  # a retry of a connection whose first try stalled
            self._arrived[(peer, lane)] = connection
            wanted = [(peer, k) for k in range(self._lanes_of(peer))]
            if self._deliver is not None and all(w in self._arrived for w in wanted):
                self._deliver(peer, [self._arrived.pop(w) for w in wanted])
            self._changed.notify_all()

    def take(self, peer: int, theirs: PeerRecord, deadline: Deadline) -> list[Connection]:
        """``peer``'s connections, lane 0 first, once it has dialled every lane both records
        offer; DistNetworkError naming it when the deadline passes first."""
        lanes = lane_count(self.record, theirs)
        wanted = [(peer, k) for k in range(lanes)]
        with self._changed:
            if not self._changed.wait_for(lambda: all(w in self._arrived for w in wanted), deadline.remaining()):
                missing = [k for k in range(lanes) if (peer, k) not in self._arrived]
                raise DistNetworkError(f"rank {self.record.rank} joining the job: rank {peer} on {theirs.label} "
                                       f"did not connect (lanes {missing}) before the timeout")
            return [self._arrived.pop(w) for w in wanted]

    def close(self) -> None:
        """Stop accepting at once (the listeners are shut down: a rank dialling now is refused,
        not handshaken and then closed); close the listeners and every connection not taken."""
        self._closing = True
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join()
        for listener in self._listeners:
            listener.close()
        with self._changed:
            for connection in self._arrived.values():
                connection.close()
            self._arrived.clear()


def listen_to_join(store, rank: int, address: str, hostname: str, host_id: str, lanes: list[str], deadline: Deadline,
                   peer_timeout: float) -> tuple[str, JoinListener]:
    """A joining rank: listen on every lane, publish its record, accept the job's ranks as they
    come; (the world token, the listener)."""
    _, token = read_records(store, [], deadline)
    listeners = open_listeners(address, lanes, 64)
    record = own_record(rank, hostname, host_id, [address, *lanes], listeners)
    joined = JoinListener(record, listeners, token, peer_timeout, token_of(store), contexts())
    publish(store, record)
    return token, joined
