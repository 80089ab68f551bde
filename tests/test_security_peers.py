"""Issue 39, "nobody gets in by default": attacks on a job's peer connections at startup and
later, each against live ranks (threads running the real connection setup over 127.0.0.1),
each refused and logged while the real ranks connect and exchange the right bytes.

- a stray plain HELLO, and a TLS hello without a client certificate, at a TLS rank before
  the real rank dials: dropped, logged; the real rank connects (it used to abort rank 0,
  blaming rank 1, and leave the real rank 1 hanging);
- an impostor claiming rank 1 with the world token read from the store, before the real rank
  1: without a token it lacks rank 1's published claim, with one it lacks the token;
- a second claim of a rank already connected (lazy connections' listener, no secret);
- idle connections ahead of the real rank: handshakes run side by side (the real rank is
  accepted while they are still open), are cut after PYDIST_HANDSHAKE_TIMEOUT, and at most
  the admission's cap (net.admission.MAX_UNPROVEN here) are held.
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import threading

import pytest

from pydist.core.deadline import Deadline
from pydist.net import admission as policy
from pydist.net.auth import AuthenticationError
from pydist.store.hash import HashStore
from pydist.transport.tcp.hello import hello_frame
from pydist.transport.tcp.joining import JoinListener
from pydist.transport.tcp.mesh import PeerRecord, build_mesh, connect_to, own_record

SECONDS = 60  # every wait's bound: generous (a loaded machine), never reached by a passing test
PAYLOAD = bytes(range(256)) * 64


def _run(target, *args) -> tuple[threading.Thread, dict]:
    """``target(*args)`` in a thread: its result (``value``) or exception (``error``)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = target(*args)
        except BaseException as error:  # noqa: BLE001 - checked by the test
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _rank(store, rank: int):
    """One rank of a 2-rank job's eager connection setup (build_mesh)."""
    return build_mesh(store, rank, 2, "127.0.0.1", f"host{rank}", f"id{rank}", Deadline.after(SECONDS))[0]


def _record(store, rank: int) -> PeerRecord:
    store.wait([f"tcp/{rank}"])
    return PeerRecord(**json.loads(store.get(f"tcp/{rank}")))


def _world(store) -> str:
    store.wait(["tcp/token"])
    return store.get("tcp/token").decode()


def _send(sock, data: bytes) -> None:
    view = memoryview(data)
    while view.nbytes:
        view = view[sock.sendmsg([view]):]


def _recv(sock, n: int) -> bytes:
    buffer = bytearray(n)
    got = 0
    while got < n:
        step = sock.recv_into(memoryview(buffer)[got:])
        assert step, "the connection closed"
        got += step
    return bytes(buffer)


class _Gated:
    """A store whose ``multi_get`` (a rank's last step before it dials) waits for ``opened``."""

    def __init__(self, store, opened: threading.Event):
        self._store, self._opened = store, opened

    def __getattr__(self, name):
        return getattr(self._store, name)

    def multi_get(self, keys):
        assert self._opened.wait(SECONDS)
        return self._store.multi_get(keys)


def _job_with(store, *attacks, settle: bool = True) -> tuple[dict, dict]:
    """Rank 0 listens; each attack (a callable of the store, run in a thread) dials it before
    rank 1 starts; then rank 1 joins, dialling once the attacks ended (``settle``: each was
    refused before rank 1 connects) or at once. Both ranks' connections, checked to be the
    real pair by the bytes rank 1 sends arriving whole at rank 0 and back."""
    thread0, result0 = _run(_rank, store, 0)
    _record(store, 0)  # rank 0 listens (its accepts wait for rank 1's record: attacks queue first)
    attackers = [_run(attack, store) for attack in attacks]
    _wait_dialled(attackers)  # the kernel's accept queue keeps them ahead of rank 1
    opened = threading.Event()
    thread1, result1 = _run(_rank, _Gated(store, opened), 1)
    if settle:
        for attack, _ in attackers:
            attack.join(SECONDS)
    opened.set()
    for thread in (thread0, thread1, *(a for a, _ in attackers)):
        thread.join(SECONDS)
    assert "error" not in result0 and "error" not in result1, (result0, result1)
    sockets0, sockets1 = result0["value"], result1["value"]
    _send(sockets1[0][0], PAYLOAD)
    assert _recv(sockets0[1][0], len(PAYLOAD)) == PAYLOAD
    _send(sockets0[1][0], PAYLOAD[::-1])
    assert _recv(sockets1[0][0], len(PAYLOAD)) == PAYLOAD[::-1]
    for sock in (sockets0[1][0], sockets1[0][0]):
        sock.close()
    return dict(attackers[0][1]) if attackers else {}, {k: r for k, (_, r) in enumerate(attackers)}


_dialled = threading.Event()
_dialled_count = [0]
_dialled_lock = threading.Lock()


def _mark_dialled() -> None:
    with _dialled_lock:
        _dialled_count[0] += 1
        _dialled.set()


def _wait_dialled(attackers) -> None:
    """Until every attack has connected (it marks it before its first read)."""
    while True:
        with _dialled_lock:
            if _dialled_count[0] >= len(attackers):
                _dialled_count[0] = 0
                _dialled.clear()
                return
        assert _dialled.wait(SECONDS)
        _dialled.clear()


def _dial(store) -> socket.socket:
    record = _record(store, 0)
    sock = socket.create_connection((record.address, record.port), timeout=SECONDS)
    _mark_dialled()
    return sock


def _until_closed(sock) -> bytes:
    """What the listener sends before it closes the connection."""
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except OSError:
        pass
    return got


# ---------------------------------------------------------------------------------------------
# a stray at a TLS rank at startup
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography")
    from pydist.testing.tls import Authority
    return Authority(str(tmp_path_factory.mktemp("ca"))).issue("rank").env()


def _plain_hello_claiming_rank_1(store) -> bytes:
    world = _world(store)
    with _dial(store) as sock:
        sock.sendall(hello_frame({"rank": 1, "token": world}))
        return _until_closed(sock)


def _tls_hello_without_a_certificate(ca: str):
    def attack(store) -> bytes:
        world = _world(store)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(ca)
        context.check_hostname = False
        with _dial(store) as raw:
            try:
                with context.wrap_socket(raw) as sock:
                    sock.sendall(hello_frame({"rank": 1, "token": world}))
                    return _until_closed(sock)
            except OSError:  # the listener refused it during or right after the TLS handshake
                return b""
    return attack


def test_strays_at_a_tls_rank_at_startup_are_dropped_and_the_real_rank_connects(certs, monkeypatch, caplog):
    for name, value in certs.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        _, attacks = _job_with(HashStore(), _plain_hello_claiming_rank_1,
                               _tls_hello_without_a_certificate(certs["PYDIST_TLS_CA"]))
    assert b"it requires TLS" in attacks[0]["value"]  # the plain one is told why
    assert "it does not use TLS and this rank does (its HELLO claims rank 1)" in caplog.text
    assert "its TLS failed" in caplog.text and "certificate" in caplog.text
    assert "TlsRefused" not in caplog.text


# ---------------------------------------------------------------------------------------------
# an impostor claiming rank 1 at startup
# ---------------------------------------------------------------------------------------------
def _impostor(auth_token: bytes | None):
    """Dials rank 0 as rank 1 with the world token read from the store (and ``auth_token``)."""
    def attack(store):
        record, world = _record(store, 0), _world(store)
        _mark_dialled()
        return connect_to(record, 1, world, Deadline.after(SECONDS), auth_token)
    return attack


def test_an_impostor_without_the_claim_is_refused_at_startup_without_a_token(monkeypatch, caplog):
    monkeypatch.delenv("PYDIST_AUTH_TOKEN", raising=False)
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        first, _ = _job_with(HashStore(), _impostor(None))
    assert isinstance(first["error"], AuthenticationError)
    assert "does not carry rank 1's claim" in str(first["error"])
    assert "without its published claim" in caplog.text


def test_an_impostor_without_the_token_is_refused_at_startup(monkeypatch, caplog):
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", "the job's secret")
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        first, _ = _job_with(HashStore(), _impostor(b"a guess"))
    assert isinstance(first["error"], AuthenticationError)
    assert "authentication failed" in caplog.text and "wrong proof" in caplog.text


# ---------------------------------------------------------------------------------------------
# a second claim of a connected rank (lazy connections: the listener stays open)
# ---------------------------------------------------------------------------------------------
def test_a_second_claim_of_a_connected_rank_is_refused_without_a_secret(caplog):
    claim = "rank 1's published claim"
    mine, joined, delivered, arrived = _listening_rank_0(lambda peer: claim)
    try:
        real = connect_to(mine, 1, "world", Deadline.after(SECONDS), None, claim=claim)
        _send(real, PAYLOAD)  # buffered by the kernel until rank 0 reads it from the delivered socket
        with caplog.at_level(logging.WARNING, logger="pydist.transport"):
            with pytest.raises(AuthenticationError, match="it refused this rank: it does not carry rank 1's claim"):
                connect_to(mine, 1, "world", Deadline.after(SECONDS), None, claim="a guess")
            assert arrived.wait(SECONDS)  # rank 1 delivered (installed)
            (peer, [accepted]), = delivered
            assert peer == 1 and _recv(accepted, len(PAYLOAD)) == PAYLOAD
            with pytest.raises(AuthenticationError, match="rank 1 is connected to rank 0 already"):
                connect_to(mine, 1, "world", Deadline.after(SECONDS), None, claim=claim)  # a copied claim
        assert "a second connection claiming rank 1" in caplog.text
        assert len(delivered) == 1
        _send(real, PAYLOAD[::-1])  # the real pair still works
        assert _recv(accepted, len(PAYLOAD)) == PAYLOAD[::-1]
        real.close()
        accepted.close()
    finally:
        joined.close()


# ---------------------------------------------------------------------------------------------
# idle connections ahead of the real rank
# ---------------------------------------------------------------------------------------------
def _idle(store) -> socket.socket:
    return _dial(store)


def test_idle_connections_do_not_hold_up_a_token_protected_startup(monkeypatch, caplog):
    """Six idle connections ahead of rank 1 at a token-protected rank 0, handshake timeout
    600 s: rank 1 is accepted while the six are still in their handshakes (side by side;
    they used to be handshaken one at a time, 10 s each), which rank 0 then cuts."""
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", "the job's secret")
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", str(SECONDS * 10))
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        _, attacks = _job_with(HashStore(), *[_idle] * 6, settle=False)
    idle = [result["value"] for result in attacks.values()]
    assert "no handshake within" not in caplog.text and "waiting to prove themselves" not in caplog.text
    for sock in idle:
        sock.settimeout(SECONDS)
        assert _until_closed(sock) == b""  # cut once rank 0 had its ranks
        sock.close()


def _listening_rank_0(claim_of=lambda peer: None):
    """A listener that stays open (lazy connections' JoinListener): (record, joined,
    delivered, an event set once a peer was delivered)."""
    listener = socket.create_server(("127.0.0.1", 0))
    mine = own_record(0, "host0", "id0", ["127.0.0.1"], [listener])
    delivered: list = []
    arrived = threading.Event()

    def deliver(*got) -> None:
        delivered.append(got)
        arrived.set()

    joined = JoinListener(mine, [listener], "world", 0.0, None, None, {1}, deliver, claim_of=claim_of)
    return mine, joined, delivered, arrived


def test_an_idle_connection_is_cut_after_the_handshake_timeout(monkeypatch, caplog):
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", "0.5")
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        mine, joined, _, _ = _listening_rank_0()
        try:
            with socket.create_connection((mine.address, mine.port), timeout=SECONDS) as idle:
                assert _until_closed(idle) == b""
            real = connect_to(mine, 1, "world", Deadline.after(SECONDS), None)
            real.close()
        finally:
            joined.close()
    assert "no handshake within 0.5 s (PYDIST_HANDSHAKE_TIMEOUT)" in caplog.text


def test_at_most_max_unproven_are_held(monkeypatch, caplog):
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 3)
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", str(SECONDS * 10))
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        _, attacks = _job_with(HashStore(), *[_idle] * 8, settle=False)
    for result in attacks.values():
        result["value"].close()
    assert caplog.text.count("3 connections were waiting to prove themselves") >= 5  # the oldest, cut for newer ones
