"""How TcpTransport fails its peers, mixed into it: a connection that broke (``_drop``), a
peer declared dead (``evict``, ``cut_off``), a peer that sent what this rank cannot take
(``refuse``), and its own I/O thread dying (``io_thread_died``).

A peer's malformed frame (bad magic or version, a control frame longer than its kind
carries, a data frame longer than this rank can hold, memory that cannot be allocated for
it) is that peer's failure: logged once, the peer told why (a BYE notice), every operation
waiting on it failed with a PeerFailedError naming it and the cause, the connection hung
up. An I/O thread that raises fails every connection, every send and every posted receive
with the cause (logged once) and hangs up on every peer, so nothing waits on a thread
that is gone.
"""
from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from ...core.errors import DistBackendError, PeerFailedError
from ..framing import FramingError
from ..matching import Matcher
from .connection import Connection

log = logging.getLogger("pydist.transport")


class PeerFailures:
    """TcpTransport's ways of failing peers (the reading thread's, except ``cut_off``)."""

    rank: int
    matcher: Matcher
    _lanes: dict[int, list[Connection]]
    _extra: dict[int, list[Connection]]
    _every: list[Connection]
    _closed: bool

    def _arm(self, conn: Connection, write: bool | None = None) -> None:
        raise NotImplementedError  # TcpTransport registers a connection with its poller

    def _do_later(self, call: Callable[[], None]) -> None:
        raise NotImplementedError  # TcpTransport runs it on its I/O thread

    def _connections_to(self, peer: int) -> list[Connection]:
        """Every connection to ``peer``: its lanes, then those of crossed dials."""
        return self._lanes.get(peer, []) + self._extra.get(peer, [])

    def refuse(self, conn: Connection, error: FramingError | MemoryError) -> None:
        """``conn``'s peer sent a frame this rank cannot take (``error``, raised reading it):
        the peer's failure, named with the cause (see the module note)."""
        what = "a malformed frame" if isinstance(error, FramingError) else "a frame too large to hold"
        reason = (f"rank {conn.peer} on {conn.host} sent rank {self.rank} {what} "
                  f"({type(error).__name__}: {error}); rank {self.rank} hung up on it")
        log.warning("pydist rank %d: %s", self.rank, reason)
        failure = PeerFailedError(reason, rank=conn.peer, host=conn.host)
        failure.__cause__ = error
        self.evict(conn, reason, failure)

    def _drop(self, conn: Connection, cause: BaseException | None, error: BaseException | None = None) -> None:
        """``conn`` failed: fail it (with ``error``, else one made from ``cause``) and (before
        close) the peer's other lanes with its error, hanging them up, so the peer too sees
        this rank leave instead of hearing over a surviving lane that it is itself the one gone."""
        conn.fail(cause, error)
        self._arm(conn)  # failed: unregistered
        for sibling in self._connections_to(conn.peer) if not self._closed else []:
            if sibling.error is None:
                sibling.fail(cause, conn.error)  # before the hang-up, which a reader may see first
                self._arm(sibling)
                _hang_up(sibling)

    def evict(self, conn: Connection, reason: str, error: BaseException | None = None) -> None:
        """Declare ``conn``'s peer dead for ``reason`` (the heartbeat's, or ``error`` another rank
        reported): tell it (should it be only stopped, it learns on waking: EvictedError), fail
        what waits on it, hang up. The notice goes on each of its lanes: the one found silent
        may be the one lost. The reading thread only (see cut_off)."""
        for lane in self._lanes.get(conn.peer, [conn]):
            lane.notify(reason)
        self._drop(conn, None, error or PeerFailedError(reason, rank=conn.peer, host=conn.host))  # first: a
        _hang_up(conn)  # reader that sees the hang-up must find the connection failed with this reason

    def cut_off(self, peer: int, error: BaseException) -> None:
        """Another rank declared ``peer`` dead (``error``, its account): hang up on it too, with a
        notice, so that all ranks agree it is out (should it only be stopped, it learns on
        waking from every peer that it was declared dead). The notice goes now (this process
        may be about to end), the hang-up from the I/O thread."""
        lanes = self._lanes.get(peer, [])
        if lanes and lanes[0].error is None and not self._closed:
            reason = f"declared dead: {getattr(error, 'reason', None) or error}"
            for lane in lanes:
                lane.notify(reason)
            self._do_later(lambda: self.evict(lanes[0], reason, error))

    def io_thread_died(self, cause: BaseException) -> None:
        """The I/O thread raised ``cause`` (it runs this as it ends): logged once; every
        connection fails (its sends, the receive it was filling, its peer reported gone) and
        is hung up on, and every posted receive fails, all with an error that says so."""
        log.error("pydist rank %d: the tcp I/O thread died; every operation of this rank fails", self.rank,
                  exc_info=cause)
        error = DistBackendError(f"rank {self.rank}'s tcp I/O thread died ({type(cause).__name__}: {cause}): "
                                 "this rank can no longer reach its peers")
        error.__cause__ = cause
        for conn in self._every:
            if conn.error is None:
                conn.fail(cause, error)
                self._arm(conn)
            _hang_up(conn)
        self.matcher.fail_all(error)


def _hang_up(conn: Connection) -> None:
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
