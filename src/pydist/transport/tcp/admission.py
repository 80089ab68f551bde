"""Admission at a rank's listener: a connection is proven before it is a rank.

Every accepted connection runs its handshake (TLS when the job uses it, then the HELLOs of
:mod:`.hello`) in a thread of its own, side by side with the others, within
PYDIST_HANDSHAKE_TIMEOUT of its arrival, on pydist's clock (``reap`` cuts the late ones). At
most ``max(MAX_HANDSHAKES, 2 * peers)`` run at once (``peers``: the ranks the listener
expects, so a burst of every rank at once always fits); one more cuts the oldest connection
that has not sent a byte yet, else the oldest. So idle or trickling connections cost a
thread and a socket each for a few seconds, and never hold up a rank's own connection. A
connection that cannot get its thread or socket (out of threads or file descriptors) is
dropped and logged, never raised: its rank retries.

Without a secret a rank is reserved for the first HELLO that claims it, before the HELLO is
answered, for as long as the Admission lives (released if that handshake fails): a second
claim gets the ``refused`` HELLO, even while the first is still in flight.

A connection that does not prove it belongs (another job's world token, a rank not
expected, garbage, a failed TLS handshake, TLS when this rank uses none or the reverse,
a failed token proof, without a secret a HELLO not carrying the claimed rank's published
claim or claiming a rank already connected) is dropped and logged with its address (the first few of each
listener in full, then one summary line per interval: :class:`~pydist.net.log_limit.LogLimit`,
so a flood of connections cannot flood the job's log), and noted in ``refusals`` for the
caller's timeout error: it never takes a rank's place, never
raises and never names the rank it claimed as at fault. A real rank refused this way learns
why on its own side (the acceptor's ``refused`` HELLO, or the TLS alert; see connect_to).
"""
from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable

from ...core import deadline as _deadline
from ...net.log_limit import LogLimit
from ...net.tls import Contexts, reason
from .hello import Acceptor, Refused, fields_of, hello_frame, rank_of, read_frame
from .mesh_tls import REQUIRES_TLS, peer_uses_tls

log = logging.getLogger("pydist.transport")
#: handshakes run at once at one listener at least (more when more ranks are expected); one
#: more cuts the oldest silent one
MAX_HANDSHAKES = 64
#: seconds a refused TLS connection is read until its peer closes it (see _close_after_reply)
LINGER_SECONDS = 1.0
#: refusals kept for the caller's timeout error
_KEPT_REFUSALS = 8


class Admission:
    """The handshakes in flight at one listener of rank ``rank`` (``token``: the lane's world
    token; ``auth_token``, ``tls``: the job's secrets; ``claim_of(peer)``: the claim peer's
    record publishes, None: not checked; ``timeout``: seconds each may take, 0: no limit;
    ``peers``: how many ranks may dial this listener, which scales the cap).
    ``start`` one per accepted connection; ``take`` the proven ones; ``wake_fd`` turns
    readable when one is; ``close`` cuts those left."""

    def __init__(self, rank: int, token: str, auth_token: bytes | None, tls: Contexts | None,
                 claim_of: Callable[[int], str | None], timeout: float, peers: int = 0):
        self.rank, self._token, self._auth_token, self._tls = rank, token, auth_token, tls
        self._claim_of, self._timeout, self._peers = claim_of, timeout, peers
        self.secret = auth_token is not None or tls is not None
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}  # id -> the handshake in flight, oldest first
        self._claimed: dict[int, int | None] = {}  # peer -> the handshake holding it (None: proven)
        self._proven: list[tuple[int, socket.socket, object]] = []
        self._ids = itertools.count()
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.refusals: deque[str] = deque(maxlen=_KEPT_REFUSALS)
        self._warnings = LogLimit(log, f"pydist rank {rank}: connections refused or dropped")

    @property
    def wake_fd(self) -> int:
        return self._wake_r.fileno()

    def start(self, sock: socket.socket, where, expected: set[int], taken: Callable[[int], bool]) -> None:
        """Handshake ``sock`` (from ``where``) in a thread: a rank of ``expected`` that proves
        it belongs becomes ``take``'s; ``taken(peer)``: whether ``peer`` is connected already
        (without a secret a second claim is refused, see the module docstring). Never raises:
        a connection whose handshake cannot start is dropped, logged."""
        key = next(self._ids)
        try:
            with self._lock:
                limit = max(MAX_HANDSHAKES, 2 * self._peers)
                if len(self._pending) >= limit:
                    silent = [k for k, each in self._pending.items() if not each.heard]
                    self._cut(silent[0] if silent else next(iter(self._pending)),
                              f"{limit} handshakes were in flight")
                due = _deadline.now() + self._timeout if self._timeout > 0 else float("inf")
                self._pending[key] = _Pending(due, sock.dup(), where)
            threading.Thread(target=self._run, args=(key, sock, where, set(expected), taken),
                             name=f"pydist-tcp-handshake-{self.rank}", daemon=True).start()
        except (OSError, RuntimeError) as error:  # out of file descriptors or threads
            with self._lock:
                if key in self._pending:
                    self._pending.pop(key).cut.close()
            sock.close()
            self.refused(where, f"its handshake could not start: {error}")

    def take(self) -> list[tuple[int, socket.socket, object]]:
        """The connections proven since the last call: (peer, socket, where) each."""
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            proven, self._proven = self._proven, []
        return proven

    def due(self) -> float | None:
        """Seconds until the oldest handshake in flight is late (None: none is timed)."""
        with self._lock:
            first = min((each.due for each in self._pending.values()), default=float("inf"))
        return None if first == float("inf") else max(0.0, first - _deadline.now())

    def reap(self) -> None:
        """Cut the handshakes past PYDIST_HANDSHAKE_TIMEOUT (their threads drop them, logged)."""
        now = _deadline.now()
        with self._lock:
            for key in [k for k, each in self._pending.items() if each.due <= now]:
                self._cut(key, self._late)

    @property
    def _late(self) -> str:
        return f"no handshake within {self._timeout:g} s (PYDIST_HANDSHAKE_TIMEOUT)"

    def refused(self, where, why: str, done: str = "dropped") -> None:
        """Log a connection ``done`` (dropped, refused) and why (rate limited); note it for
        the caller's timeout error."""
        self._warnings.warning("pydist rank %d %s a connection from %s: %s", self.rank, done, where, why)
        self.refusals.append(f"{_address(where)}: {why}")

    def close(self) -> None:
        """Cut every handshake in flight; what they prove later is closed, not taken."""
        with self._lock:
            self._closed = True
            for key in list(self._pending):
                self._cut(key, None)
            for _, sock, _ in self._proven:
                sock.close()
            self._proven = []
        self._wake_r.close()
        self._wake_w.close()
        self._warnings.flush()

    def _cut(self, key: int, why: str | None) -> None:
        """Shut a handshake's connection down (its thread's blocked read returns); lock held."""
        pending = self._pending.pop(key)
        try:
            pending.cut.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        pending.cut.close()
        if why is not None:
            self.refused(pending.where, why)

    def _reserve(self, key: int, taken: Callable[[int], bool]) -> Callable[[int], bool]:
        """The ``taken`` the Acceptor of handshake ``key`` asks: True if ``peer`` is connected
        or claimed by another handshake, else False, and ``peer`` is now claimed by this one."""
        def claim(peer: int) -> bool:
            with self._lock:
                if taken(peer) or self._claimed.get(peer, key) != key:
                    return True
                self._claimed[peer] = key
                return False
        return claim

    def _release(self, key: int) -> None:
        """Free the rank handshake ``key`` claimed (it failed); lock held."""
        for peer in [p for p, k in self._claimed.items() if k == key]:
            del self._claimed[peer]

    def _heard(self, key: int) -> None:
        """Handshake ``key``'s connection sent its first byte (it is no longer silent)."""
        with self._lock:
            if key in self._pending:
                self._pending[key].heard = True

    def _note(self, key: int, where, why: str, done: str = "dropped") -> None:
        """``refused``, unless the handshake was cut (its cut was logged)."""
        with self._lock:
            cut = key not in self._pending
        if not cut:
            self.refused(where, why, done)

    def _run(self, key: int, sock: socket.socket, where, expected: set[int], taken: Callable[[int], bool]) -> None:
        proven = self._handshake(key, sock, where, expected, self._reserve(key, taken))
        with self._lock:
            entry = self._pending.pop(key, None)
            if entry is not None:
                entry.cut.close()
            if proven is None or entry is None or self._closed:  # dropped, cut (logged), or too late
                self._release(key)
                if proven is not None:
                    proven[1].close()
                return
            if not self.secret:
                self._claimed[proven[0]] = None
            self._proven.append((proven[0], proven[1], where))
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _handshake(self, key: int, sock: socket.socket, where, expected: set[int],
                   taken: Callable[[int], bool]) -> tuple[int, socket.socket] | None:
        """(peer, socket) after this rank's side of TLS and HELLOs, or None (dropped, logged)."""
        exclusive = not self.secret
        handshake = Acceptor(self.rank, self._token, expected, self._auth_token,
                             self._claim_of if exclusive else None, taken if exclusive else None)
        try:
            sock.settimeout(self._timeout or None)
            uses_tls = peer_uses_tls(sock)
            self._heard(key)
            if uses_tls != (self._tls is not None):
                self._mismatched(key, sock, where)
                return None
            if self._tls is not None:
                sock = self._tls.server.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                try:
                    sock.do_handshake()
                except ssl.SSLError as error:
                    self._note(key, where, f"its TLS failed: {reason(error)}")
                    _close_after_reply(sock)
                    return None
            while not handshake.done:
                sock.sendall(handshake.on_hello(read_frame(sock)))
        except Refused as error:
            self._note(key, where, f"authentication failed: {error}", "refused")
            with self._lock:
                self._release(key)  # before the reply: the rank is free once the refused one knows
            try:
                sock.sendall(error.reply)
            except OSError:
                pass
            sock.close()
            return None
        except TimeoutError:
            self._note(key, where, self._late)
            sock.close()
            return None
        except Exception as error:  # noqa: BLE001 - whatever fails, the connection is not a rank
            self._note(key, where, str(error) or type(error).__name__)
            sock.close()
            return None
        except BaseException:
            sock.close()
            raise
        assert handshake.peer is not None  # done: it names the connector
        return handshake.peer, sock

    def _mismatched(self, key: int, sock: socket.socket, where) -> None:
        """A connection using TLS when this rank does not, or the reverse: tell it (a plain
        HELLO ``refused``, which a real rank reports on its side), drop it."""
        this_uses_tls = self._tls is not None
        claimed = ""
        if this_uses_tls:  # a plain connection: its HELLO says which rank it claims to be
            try:
                claimed = f" (its HELLO claims rank {rank_of(fields_of(read_frame(sock)))})"
            except (OSError, ValueError):
                pass
        try:
            sock.sendall(hello_frame({"refused": REQUIRES_TLS if this_uses_tls else "it does not use TLS"}))
        except OSError:
            pass
        sock.close()
        self._note(key, where, ("it does not use TLS and this rank does" if this_uses_tls
                             else "it uses TLS and this rank does not") + claimed)


class _Pending:
    """A handshake in flight: when it is late, a dup of its socket to cut it, its peer's
    address, whether a byte came from it."""

    __slots__ = ("due", "cut", "where", "heard")

    def __init__(self, due: float, cut: socket.socket, where):
        self.due, self.cut, self.where, self.heard = due, cut, where, False


def _close_after_reply(sock: socket.socket) -> None:
    """Close ``sock`` after what was sent on it (a TLS alert) reached the peer: the peer's
    unread bytes are read first, so that the close does not reset the connection (a reset
    may reach the peer before it read the alert, which would make it retry instead of
    reporting the refusal); for at most ``LINGER_SECONDS``."""
    try:
        sock.settimeout(LINGER_SECONDS)  # real time: a bound on a courtesy, not a timeout
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    except OSError:
        pass
    sock.close()


def _address(where) -> str:
    """``host:port`` of an accepted connection's peer address."""
    try:
        host, port = where[0], where[1]
    except (TypeError, IndexError):
        return str(where)
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
