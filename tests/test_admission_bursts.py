"""Admission at a rank's listener under legitimate bursts and resource exhaustion (review
findings 1, 4, 5, 12): a burst of real ranks is never cut, a connection cut after its TLS
handshake is retried (not blamed on a certificate), two claims of one rank cannot both
finish, running out of file descriptors neither spins, kills the listener nor escapes init
as a raw OSError, and the handshake timeout runs on pydist's injectable clock.

Ranks are threads of this process over 127.0.0.1; every wait is bounded by SECONDS, a
generous bound (a loaded 2-core machine) that a passing test never reaches.
"""
from __future__ import annotations

import errno
import logging
import queue
import socket
import ssl
import threading
import time

import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DistNetworkError
from pydist.net import accepting
from pydist.net import admission as policy
from pydist.net.auth import AuthenticationError
from pydist.testing.clock import MockClock
from pydist.transport.tcp.admission import Admission
from pydist.transport.tcp.hello import Connector, hello_frame, read_frame
from pydist.transport.tcp.joining import JoinListener
from pydist.transport.tcp.mesh import accept_from, connect_to, own_record

SECONDS = 60
CLAIM = "the published claim"


class _Counted:
    """Counts ``Admission.start`` calls; ``reached(n)`` waits until n were made."""

    def __init__(self, monkeypatch):
        self._started = 0
        self._changed = threading.Condition()
        original = Admission.start

        def start(admission_, *args, **kwargs):
            original(admission_, *args, **kwargs)
            with self._changed:
                self._started += 1
                self._changed.notify_all()

        monkeypatch.setattr(Admission, "start", start)

    def reached(self, n: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self._started >= n, SECONDS)


def _listening(expected: set[int], listener: socket.socket | None = None, claim_of=lambda peer: CLAIM, tls=None):
    """A JoinListener of rank 0 (lazy connections' acceptor) expecting ``expected`` (with
    ``tls``: over TLS): (its record, the listener, what it delivered, an event set at each
    delivery)."""
    listener = listener or socket.create_server(("127.0.0.1", 0))
    mine = own_record(0, "host0", "id0", ["127.0.0.1"], [listener])
    delivered: list = []
    arrived = threading.Event()

    def deliver(peer, connections) -> None:
        delivered.append((peer, connections))
        arrived.set()

    joined = JoinListener(mine, [listener], "world", 0.0, None, tls, expected, deliver, claim_of=claim_of)
    return mine, joined, delivered, arrived


def _tls(monkeypatch, tmp_path):
    """Set PYDIST_TLS_* (a certificate of a fresh CA); the job's TLS contexts."""
    pytest.importorskip("cryptography")
    from pydist.net.tls import contexts
    from pydist.testing.tls import Authority
    for name, value in Authority(str(tmp_path / "ca")).issue("rank").env().items():
        monkeypatch.setenv(name, value)
    tls = contexts()
    assert tls is not None
    return tls


def _until_closed(sock: socket.socket) -> bytes:
    """What the listener sends before it closes ``sock`` (TimeoutError: it never does)."""
    got = b""
    sock.settimeout(SECONDS)
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def _wait_delivered(delivered: list, arrived: threading.Event, n: int) -> None:
    """Until ``n`` peers were delivered (each delivery appends, then sets ``arrived``)."""
    while len(delivered) < n:
        assert arrived.wait(SECONDS)
        arrived.clear()


# -- finding 1: a legitimate burst is not cut ----------------------------------------------------
def test_a_burst_of_ranks_larger_than_max_unproven_is_not_cut(monkeypatch, caplog):
    """Eight ranks in their handshakes at once, MAX_UNPROVEN 3: the cap scales with the
    ranks expected, so none is cut and all eight are delivered."""
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 3)
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", str(SECONDS * 10))
    ranks = range(1, 9)
    started = _Counted(monkeypatch)
    mine, joined, delivered, arrived = _listening(set(ranks))
    try:
        with caplog.at_level(logging.WARNING, logger="pydist.transport"):
            dialled = [socket.create_connection((mine.address, mine.port), timeout=SECONDS) for _ in ranks]
            started.reached(len(dialled))  # every one is in its handshake: then they all speak
            for rank, sock in zip(ranks, dialled):
                handshake = Connector(rank, "world", 0, None, CLAIM)
                sock.sendall(handshake.first)
                handshake.on_hello(read_frame(sock))
                assert handshake.done
            _wait_delivered(delivered, arrived, len(dialled))
        assert "waiting to prove themselves" not in caplog.text
    finally:
        joined.close()
        for sock in dialled:
            sock.close()
    assert sorted(peer for peer, _ in delivered) == list(ranks)


def _cutting_proxy(target: tuple[str, int], server: ssl.SSLContext,
                   during: bool = False) -> tuple[socket.socket, list]:
    """A listener whose first connection is cut right after its TLS handshake (``during``:
    once its ClientHello came, unanswered) -- what an acceptor cutting a handshake for its
    cap or deadline looks like to the connector -- and whose later ones are piped to
    ``target``: (the listener, the connections it took)."""
    listener = socket.create_server(("127.0.0.1", 0))
    taken: list = []

    def pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            taken.append(sock)
            if len(taken) == 1:
                if during:
                    sock.recv(65536)  # the ClientHello (or its start), never answered
                    sock.close()
                    continue
                with server.wrap_socket(sock, server_side=True):
                    pass  # handshaken, then closed without a word
                continue
            upstream = socket.create_connection(target, timeout=SECONDS)
            taken.append(upstream)
            for ends in ((sock, upstream), (upstream, sock)):
                threading.Thread(target=pipe, args=ends, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, taken


def test_a_connection_cut_after_its_tls_handshake_is_retried_not_blamed_on_a_certificate(monkeypatch, tmp_path):
    tls = _tls(monkeypatch, tmp_path)
    mine, joined, delivered, arrived = _listening({1}, claim_of=lambda peer: None, tls=tls)
    proxy, taken = _cutting_proxy((mine.address, mine.port), tls.server)
    try:
        via = own_record(0, "host0", "id0", ["127.0.0.1"], [proxy])
        connection = connect_to(via, 1, "world", Deadline.after(SECONDS), None, tls)
        assert arrived.wait(SECONDS)
        (peer, [accepted]), = delivered
        assert peer == 1
        assert connection.sendmsg([memoryview(b"real bytes")]) == 10
        got = bytearray(10)
        assert accepted.recv_into(got) == 10 and got == b"real bytes"  # one TLS record
        connection.close()
        accepted.close()
    finally:
        proxy.close()
        joined.close()
        for sock in taken:
            sock.close()


# -- finding 4: two claims of one rank -----------------------------------------------------------
class _Driven:
    """An Admission of rank 0 (no secret, ``claim_of``: CLAIM) listening for rank 1 on
    ``listener`` (a fresh one by default), driven by a thread of its own, its only user:
    ``proven`` gets the (peer, socket, where) it hands over; ``dial()`` connects to it."""

    def __init__(self, taken=lambda peer: False, listener: socket.socket | None = None, timeout: float = SECONDS * 10):
        self.listener = listener or socket.create_server(("127.0.0.1", 0))
        self.gate = Admission(0, "world", None, None, lambda peer: CLAIM, timeout, peers=1)
        self.gate.listen(self.listener, lambda: {1}, taken)
        self.proven: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.gate.poll(0.01)
                for each in self.gate.take():
                    self.proven.put(each)
        finally:
            self.gate.close()

    def dial(self) -> socket.socket:
        return socket.create_connection(self.listener.getsockname(), timeout=SECONDS)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(SECONDS)
        self.listener.close()
        while not self.proven.empty():
            self.proven.get()[1].close()


def _hello(sock: socket.socket, fields: dict) -> dict:
    """Send a HELLO claiming rank 1; the acceptor's answer (a refusal raises)."""
    handshake = Connector(1, "world", 0, None, CLAIM)
    sock.sendall(hello_frame({"rank": 1, "token": "world", "claim": CLAIM, **fields}) if fields else handshake.first)
    handshake.on_hello(read_frame(sock))
    return {"done": handshake.done}


def test_the_second_of_two_concurrent_claims_gets_the_refusal():
    """The first claim's handshake is done but not taken yet (the caller has not marked the
    rank connected: ``taken`` is still False): a second claim is refused in its HELLO, and
    only the first is handed over."""
    driven = _Driven()
    first, second = driven.dial(), driven.dial()
    try:
        assert _hello(first, {})["done"]
        with pytest.raises(AuthenticationError, match="rank 1 is connected to rank 0 already"):
            _hello(second, {})
        peer, sock, _ = driven.proven.get(timeout=SECONDS)
        sock.close()
        assert peer == 1 and driven.proven.empty()
    finally:
        driven.close()
        for sock in (first, second):
            sock.close()


def test_a_claim_refused_after_its_reservation_frees_the_rank():
    """A HELLO carrying rank 1's claim but a nonce (it authenticates; this rank has no
    token) is refused after the rank was reserved for it: the real rank 1 then gets in."""
    driven = _Driven()
    stray, real = driven.dial(), driven.dial()
    try:
        with pytest.raises(AuthenticationError, match="it has no token"):
            _hello(stray, {"nonce": "00"})
        assert _hello(real, {})["done"]
    finally:
        driven.close()
        for sock in (stray, real):
            sock.close()


# -- finding 5 and issue 46: out of file descriptors ---------------------------------------------
class _FailingListener(socket.socket):
    """A listening socket whose ``accept`` fails with ``error`` the first ``times`` calls
    (each noted with its time), then works."""

    def __init__(self, error: BaseException, times: int):
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.bind(("127.0.0.1", 0))
        self.listen(16)
        self.error, self.times, self.calls = error, times, []

    def accept(self):
        if len(self.calls) < self.times:
            self.calls.append(time.monotonic())
            raise self.error
        return super().accept()


def test_out_of_descriptors_the_listener_drops_the_least_advanced_unproven_connection(monkeypatch, caplog):
    """An idle connection in its handshake, then accept fails with EMFILE: the idle one is
    dropped (logged, saying why) and accept is retried at once, so rank 1 gets in."""
    failing = _FailingListener(OSError(errno.EMFILE, "Too many open files"), 0)
    started = _Counted(monkeypatch)
    driven = _Driven(listener=failing)
    try:
        with caplog.at_level(logging.WARNING, logger="pydist.transport"):
            with driven.dial() as idle:
                started.reached(1)
                failing.times = 1  # the next accept fails, once
                with driven.dial() as real:
                    assert _until_closed(idle) == b""  # dropped for the newcomer
                    assert _hello(real, {})["done"]
                    driven.proven.get(timeout=SECONDS)[1].close()
        assert "out of descriptors ([Errno 24] Too many open files)" in caplog.text
        assert "could not accept" not in caplog.text  # a connection was dropped instead
    finally:
        driven.close()


def test_the_lazy_listener_backs_off_after_accept_errors_and_keeps_accepting(caplog):
    """With nothing to drop, a failed accept pauses the listener (no spin) and is logged,
    rate limited, and the listener keeps accepting."""
    failing = _FailingListener(OSError(errno.EMFILE, "Too many open files"), 4)
    mine, joined, delivered, arrived = _listening({1}, failing)
    try:
        with caplog.at_level(logging.WARNING, logger="pydist.transport"):
            connection = connect_to(mine, 1, "world", Deadline.after(SECONDS), None, claim=CLAIM)
            assert arrived.wait(SECONDS)
        connection.close()
    finally:
        joined.close()
    gaps = [later - earlier for earlier, later in zip(failing.calls, failing.calls[1:])]
    assert len(gaps) == 3 and min(gaps) >= accepting.BACKOFF_SECONDS * 0.9  # time.sleep's lower bound
    assert caplog.text.count("could not accept a connection") == 4  # each in full: fewer than LogLimit's burst
    assert [peer for peer, _ in delivered] == [1]


def test_the_lazy_listener_closes_its_handshakes_when_it_stops_on_an_error(monkeypatch, caplog):
    """An error that ends the listener's thread still cuts the handshakes in flight, and is logged."""
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", str(SECONDS * 10))
    failing = _FailingListener(RuntimeError("a bug"), 0)
    started = _Counted(monkeypatch)
    mine, joined, _, _ = _listening({1}, failing)
    try:
        with caplog.at_level(logging.ERROR, logger="pydist.transport"):
            with socket.create_connection((mine.address, mine.port), timeout=SECONDS) as idle:
                started.reached(1)
                failing.times = len(failing.calls) + 1  # the next accept fails with a bug
                with socket.create_connection((mine.address, mine.port), timeout=SECONDS):
                    assert _until_closed(idle) == b""
        assert "a bug" in caplog.text
    finally:
        joined.close()


def test_accept_errors_at_init_end_in_a_dist_network_error_naming_the_rank():
    """Accept failing until the deadline: the error names the rank, its listener and the cause."""
    failing = _FailingListener(OSError(errno.EMFILE, "Too many open files"), 10 ** 6)
    try:
        with socket.create_connection(failing.getsockname(), timeout=SECONDS):
            with pytest.raises(DistNetworkError, match=r"rank 0 .*accepting on 127.0.0.1:\d+ failed: "
                                                       r".*Too many open files") as info:
                accept_from(failing, {1}, 0, "world", Deadline.after(0.3))  # real time: the accept pauses are
        assert isinstance(info.value.__cause__, OSError)
    finally:
        failing.close()


# -- finding 12: the handshake timeout on the injectable clock -----------------------------------
def test_the_handshake_timeout_runs_on_the_injected_clock(monkeypatch, caplog):
    """PYDIST_HANDSHAKE_TIMEOUT 600 s: an idle connection is cut once the fake clock passed
    it, without 600 real seconds."""
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", "600")
    started = _Counted(monkeypatch)
    with MockClock().installed() as clock:
        mine, joined, _, _ = _listening({1})
        try:
            with caplog.at_level(logging.WARNING, logger="pydist.transport"):
                with socket.create_connection((mine.address, mine.port), timeout=SECONDS) as idle:
                    started.reached(1)
                    clock.advance(601)
                    assert _until_closed(idle) == b""
        finally:
            joined.close()
    assert "no handshake within 600 s (PYDIST_HANDSHAKE_TIMEOUT)" in caplog.text


# -- finding 1, the store: a TLS client cut during or after its TLS handshake --------------------
@pytest.mark.parametrize("during", [False, True], ids=["after", "during"])
def test_a_store_client_cut_in_its_tls_opening_retries(monkeypatch, tmp_path, during):
    """Cut after its TLS handshake, or during it (the store's cap or PYDIST_HANDSHAKE_TIMEOUT
    cuts a handshake without a word): the client dials again within its timeout. It used to
    take a cut during the handshake for a store that does not use TLS and give up at once."""
    from datetime import timedelta

    from pydist.store import TCPStore
    tls = _tls(monkeypatch, tmp_path)
    wait = timedelta(seconds=SECONDS)
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=wait) as master:
        proxy, taken = _cutting_proxy(("127.0.0.1", master.port), tls.server, during)
        try:
            with TCPStore("127.0.0.1", proxy.getsockname()[1], timeout=wait) as client:
                client.set("k", "v")
                assert master.get("k") == b"v"
            assert len(taken) >= 2  # the cut one, then the retry
        finally:
            proxy.close()
            for sock in taken:
                sock.close()
