"""Admission at a rank's listener: a connection is proven before it is a rank.

Every accepted connection runs its handshake (TLS when the job uses it, then the HELLOs of
:mod:`.hello`; :class:`~.handshake.Handshake`) side by side with the others, non-blocking,
driven by the listener's selector (no thread per connection), under the one admission
policy of :mod:`pydist.net.admission` that the store server follows too: each connection
is dropped PYDIST_HANDSHAKE_TIMEOUT after its arrival unless proven by then, talking or not,
on pydist's clock (``reap``); past the cap (:func:`~pydist.net.admission.cap`: at least
twice the ranks the listener expects, so a burst of every rank at once always fits) one
more drops the connection with the least progress, the oldest of those; out of file
descriptors, the listener drops that one and accepts again (:mod:`pydist.net.accepting`).
A handshake leaves the policy's reach before its last HELLO is sent, in the same thread,
so it is never cut after its peer took it as established.

Without a secret a rank is reserved for the first HELLO that claims it, before the HELLO is
answered, for as long as the Admission lives (released if that handshake fails): a second
claim gets the ``refused`` HELLO, even while the first is still in flight.

A connection that does not prove it belongs (another job's world token, a rank not
expected, garbage, a failed TLS handshake, TLS when this rank uses none or the reverse,
a failed token proof, without a secret a HELLO not carrying the claimed rank's published
claim or claiming a rank already connected) is dropped and logged with its address (the
first few of each listener in full, then one summary line per interval:
:class:`~pydist.net.log_limit.LogLimit`, so a flood of connections cannot flood the job's
log), and noted in ``refusals`` for the caller's timeout error: it never takes a rank's
place, never raises and never names the rank it claimed as at fault. A real rank refused
this way learns why on its own side (the acceptor's ``refused`` HELLO, or the TLS alert;
see connect_to).
"""
from __future__ import annotations

import logging
import selectors
import socket
from collections import deque
from collections.abc import Callable

from ...core import deadline as _deadline
from ...net.accepting import accept_ready
from ...net.admission import Gate
from ...net.log_limit import LogLimit
from ...net.tls import Contexts
from .handshake import Handshake, Outcome, Refusal
from .hello import Acceptor

log = logging.getLogger("pydist.transport")
#: seconds a refused connection may linger over its farewell (see handshake.py)
LINGER_SECONDS = 1.0
#: refusals kept for the caller's timeout error
_KEPT_REFUSALS = 8


def serve(selector: selectors.BaseSelector, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds for the sockets of ``selector`` (each registered with
    its callback as data, called with the events ready); whether any was ready."""
    ready = selector.select(timeout)
    for key, events in ready:
        key.data(events)
    return bool(ready)


class Admission:
    """The handshakes in flight at one listener of rank ``rank`` (``token``: the lane's world
    token; ``auth_token``, ``tls``: the job's secrets; ``claim_of(peer)``: the claim peer's
    record publishes, None: not checked; ``timeout``: seconds each may take, 0: no limit;
    ``peers``: how many ranks may dial this listener, which scales the cap; ``selector``:
    the loop's, which ``serve`` drives, else its own, which ``poll`` drives). ``listen``
    accepts on a listener, ``start`` handshakes one connection; ``take`` the proven ones;
    ``reap`` drops the late; ``close`` cuts those left. One thread drives it."""

    def __init__(self, rank: int, token: str, auth_token: bytes | None, tls: Contexts | None,
                 claim_of: Callable[[int], str | None], timeout: float, peers: int = 0,
                 selector: selectors.BaseSelector | None = None):
        self.rank, self._token, self._auth_token, self._tls = rank, token, auth_token, tls
        self._claim_of = claim_of
        self.secret = auth_token is not None or tls is not None
        self._own_selector = selector is None
        self._selector = selectors.DefaultSelector() if selector is None else selector
        self._gate: Gate[Handshake] = Gate(timeout, peers)
        self._handshakes: dict[int, Handshake] = {}  # fd -> the handshake on it
        self._claimed: dict[int, int | None] = {}  # peer -> the fd of the handshake holding it (None: proven)
        self._proven: list[tuple[int, socket.socket, object]] = []
        self._listeners: list[socket.socket] = []
        self._closed = False
        self.refusals: deque[str] = deque(maxlen=_KEPT_REFUSALS)
        self.accept_error: OSError | None = None  # the last failed accept (for the caller's timeout error)
        self._warnings = LogLimit(log, f"pydist rank {rank}: connections refused or dropped")

    # -- the loop's side -------------------------------------------------------------------
    def listen(self, listener: socket.socket, expected: Callable[[], set[int]], taken: Callable[[int], bool],
               accepting: Callable[[], bool] = lambda: True) -> None:
        """Accept on ``listener`` whenever it is ready and the caller is ``accepting()``;
        each connection's HELLO must claim a rank of ``expected()`` (see ``start``)."""
        listener.setblocking(False)
        self._listeners.append(listener)

        def ready(_events: int) -> None:
            if accepting():
                accept_ready(listener, lambda sock, where: self.start(sock, where, expected(), taken),
                             self._gate, self._cut, lambda error: self._accept_failed(listener, error, accepting))

        self._selector.register(listener, selectors.EVENT_READ, ready)

    def poll(self, timeout: float | None) -> bool:
        """Serve its own selector for up to ``timeout`` seconds (less when a handshake is due
        sooner), then reap; whether anything happened."""
        due = self.due()
        limit = due if timeout is None else timeout if due is None else min(timeout, due)
        busy = serve(self._selector, limit)
        return self.reap() or busy

    def start(self, sock: socket.socket, where, expected: set[int], taken: Callable[[int], bool]) -> None:
        """Handshake ``sock`` (from ``where``) alongside the others: a rank of ``expected``
        that proves it belongs becomes ``take``'s; ``taken(peer)``: whether ``peer`` is
        connected already (without a secret a second claim is refused, see the module).
        Never raises: a connection whose handshake cannot start is dropped, logged."""
        if self._closed:
            sock.close()
            return
        exclusive = not self.secret
        try:
            sock.setblocking(False)
            acceptor = Acceptor(self.rank, self._token, set(expected), self._auth_token,
                                self._claim_of if exclusive else None,
                                self._reserve(sock.fileno(), taken) if exclusive else None)
            handshake = Handshake(sock, where, acceptor, self._tls.server if self._tls else None,
                                  self._gate.progress, self._gate.prove)
            self._selector.register(handshake.fd, handshake.events, lambda _events: self._advance(handshake))
        except (OSError, ValueError) as error:  # e.g. out of memory for the selector
            sock.close()
            self.refused(where, f"its handshake could not start: {error}")
            return
        self._handshakes[handshake.fd] = handshake
        for victim in self._gate.admit(handshake, _deadline.now()):
            self._cut(victim, self._gate.cap_reason())

    def take(self) -> list[tuple[int, socket.socket, object]]:
        """The connections proven since the last call: (peer, socket in blocking mode, where) each."""
        proven, self._proven = self._proven, []
        return proven

    def due(self) -> float | None:
        """Seconds until the oldest handshake in flight is late (None: none is timed)."""
        due = self._gate.due()
        return None if due is None else max(0.0, due - _deadline.now())

    def reap(self) -> bool:
        """Drop the handshakes past PYDIST_HANDSHAKE_TIMEOUT (logged); whether there were any."""
        late = self._gate.late(_deadline.now())
        for handshake in late:
            self._cut(handshake, self._gate.late_reason())
        return bool(late)

    def refused(self, where, why: str, done: str = "dropped") -> None:
        """Log a connection ``done`` (dropped, refused) and why (rate limited); note it for
        the caller's timeout error."""
        self._warnings.warning("pydist rank %d %s a connection from %s: %s", self.rank, done, where, why)
        self.refusals.append(f"{_address(where)}: {why}")

    def close(self) -> None:
        """Cut every handshake in flight and close what was proven and not taken; stop
        listening (the listeners stay open, in blocking mode, for their owner to close)."""
        self._closed = True
        for handshake in list(self._handshakes.values()):
            self._close(handshake)
        for _, sock, _ in self._proven:
            sock.close()
        self._proven = []
        for listener in self._listeners:
            if listener.fileno() >= 0:
                self._selector.unregister(listener)
                listener.setblocking(True)
        if self._own_selector:
            self._selector.close()
        self._warnings.flush()

    # -- one handshake ---------------------------------------------------------------------
    def _advance(self, handshake: Handshake) -> None:
        """Move ``handshake`` on as its socket allows; hand it over, drop it or wait."""
        try:
            outcome = handshake.advance()
        except Refusal as refusal:
            outcome = self._refuse(handshake, refusal)
        except Exception as error:  # noqa: BLE001 - whatever fails (a reset, garbage), the connection is not a rank
            outcome = Outcome.CLOSED if handshake.closing else self._refuse(handshake, Refusal(
                str(error) or type(error).__name__))
        if outcome is Outcome.PROVEN:
            self._hand_over(handshake)
        elif outcome is Outcome.CLOSED:
            self._close(handshake)
        elif handshake.fd in self._handshakes:
            self._selector.modify(handshake.fd, handshake.events, self._selector.get_key(handshake.fd).data)

    def _refuse(self, handshake: Handshake, refusal: Refusal) -> Outcome:
        """Log ``refusal``, free the rank the handshake claimed, send the refusal's farewell."""
        self.refused(handshake.where, refusal.why, refusal.done)
        self._release(handshake)
        if handshake in self._gate:
            self._gate.shorten(handshake, _deadline.now() + LINGER_SECONDS)
        return handshake.refuse(refusal)

    def _hand_over(self, handshake: Handshake) -> None:
        peer = handshake.acceptor.peer
        assert peer is not None  # proven: the acceptor named the connector
        self._forget(handshake)
        if not self.secret:
            self._claimed[peer] = None
        sock = handshake.sock
        sock.setblocking(True)
        self._proven.append((peer, sock, handshake.where))

    def _cut(self, handshake: Handshake, why: str) -> None:
        """Drop a handshake the policy names (late, or past the cap); logged unless it was
        refused already."""
        if not handshake.closing:
            self.refused(handshake.where, why)
        self._close(handshake)

    def _close(self, handshake: Handshake) -> None:
        self._forget(handshake)
        self._release(handshake)
        handshake.sock.close()

    def _forget(self, handshake: Handshake) -> None:
        """Take ``handshake`` out of the loop and the policy."""
        if self._handshakes.pop(handshake.fd, None) is not None:
            self._selector.unregister(handshake.fd)
        self._gate.discard(handshake)

    def _accept_failed(self, listener: socket.socket, error: OSError, accepting: Callable[[], bool]) -> None:
        if accepting():  # else its owner shut the listener down
            self.accept_error = error
            self._warnings.warning("pydist rank %d could not accept a connection on %s: %s (out of file "
                                   "descriptors? see ulimit -n)", self.rank, listening_at(listener), error)

    # -- claims (without a secret) ---------------------------------------------------------
    def _reserve(self, fd: int, taken: Callable[[int], bool]) -> Callable[[int], bool]:
        """The ``taken`` the Acceptor of the handshake on ``fd`` asks: True if ``peer`` is
        connected or claimed by another handshake, else False, and ``peer`` is now claimed
        by this one (until it fails: ``_release``, before its descriptor is closed)."""
        def claim(peer: int) -> bool:
            if taken(peer) or self._claimed.get(peer, fd) != fd:
                return True
            self._claimed[peer] = fd
            return False
        return claim

    def _release(self, handshake: Handshake) -> None:
        """Free the rank ``handshake`` claimed (it failed)."""
        for peer in [p for p, holder in self._claimed.items() if holder == handshake.fd]:
            del self._claimed[peer]


def _address(where) -> str:
    """``host:port`` of an accepted connection's peer address."""
    try:
        host, port = where[0], where[1]
    except (TypeError, IndexError):
        return str(where)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def listening_at(listener: socket.socket) -> str:
    """``host:port`` of a listening socket, for errors."""
    try:
        return _address(listener.getsockname())
    except OSError:
        return "its listener"
