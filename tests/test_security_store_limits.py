"""Issue 39, "nobody gets in by default": what clients that prove nothing can make a live
TCPStore server hold is bounded, measured with the server's own counters (``stats()``), and
the good clients keep working. The limits are lowered here (module constants read at each
use) so that a few connections reach them.

- with a token: bytes one connection sends before authenticating, the bytes of all such
  connections together, and how many may wait to prove themselves (the admission policy's
  cap, issue 46: past it the oldest of the least advanced are dropped, with TLS too; clients
  that talk go after the silent ones);
- token or not: the bytes of unfinished messages held for all connections together (they
  were 512 MiB per connection, with no total).
"""
from __future__ import annotations

import logging
import select
import socket
import struct
from datetime import timedelta

import pytest

from pydist import TCPStore
from pydist.core.deadline import Deadline, poll_until
from pydist.net import admission as policy
from pydist.store import _limits
from pydist.store._protocol import REQUESTS, WIRE_MAGIC, auth_hello, hello
from pydist.store._tcp_server import READ_BYTES

SECONDS = 60  # every wait's bound: generous, never reached by a passing test
TOKEN = "the job's secret"


@pytest.fixture
def store(request):
    token = getattr(request, "param", None)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=SECONDS), auth_token=token)
    yield master
    master.close()


def _stats(master) -> dict:
    return master._server.stats()


def _raw(master, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", master.port), timeout=SECONDS)
    if data:
        try:
            sock.sendall(data)
        except OSError:  # dropped while sending: what the test checks
            pass
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Waits (up to SECONDS) for the server to close ``sock``; True once it has."""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _works(master, token: str | None) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=SECONDS), auth_token=token)
    try:
        client.set("good", "value")
        assert client.get("good") == b"value" and master.add("n", 1) >= 1
    finally:
        client.close()


def _partial_auth_hello() -> bytes:
    """An authenticating hello but its last byte: the server waits for the rest."""
    return auth_hello(b"\0" * 32)[:-1]


@pytest.mark.parametrize("store", [TOKEN], indirect=True)
def test_bytes_sent_before_authenticating_are_capped_per_connection(store, monkeypatch, caplog):
    monkeypatch.setattr(_limits, "UNAUTHENTICATED_BYTES", 16)
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with _raw(store, _partial_auth_hello()) as attacker:
            assert _closed_by_server(attacker)
    stats = _stats(store)
    assert stats["dropped_for_limits"] == 1 and stats["unauthenticated_bytes"] == 0
    assert "it sent 37 bytes before authenticating (limit 16)" in caplog.text
    _works(store, TOKEN)


@pytest.mark.parametrize("store", [TOKEN], indirect=True)
def test_bytes_of_all_unauthenticated_connections_are_capped(store, monkeypatch):
    monkeypatch.setattr(_limits, "UNAUTHENTICATED_TOTAL", 100)  # two partial hellos (37 bytes each) fit, not three
    attackers = [_raw(store, _partial_auth_hello()) for _ in range(5)]
    try:
        ready, _, _ = select.select(attackers, [], [], SECONDS)
        assert ready and all(_closed_by_server(sock) for sock in ready)
        _works(store, TOKEN)
        stats = _stats(store)
        assert stats["peak_unauthenticated_bytes"] <= 100 + 37 and stats["dropped_for_limits"] >= 1
        assert stats["unauthenticated_bytes"] <= 100
    finally:
        for sock in attackers:
            sock.close()


@pytest.mark.parametrize("store", [TOKEN], indirect=True)
def test_idle_unauthenticated_connections_are_capped_oldest_first(store, monkeypatch, caplog):
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 5)
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        idle = [_raw(store) for _ in range(12)]
        try:
            assert all(_closed_by_server(sock) for sock in idle[:7])  # the oldest, dropped for newer ones
            stats = _stats(store)
            assert stats["unauthenticated"] == 5 and stats["dropped_for_limits"] == 7
            _works(store, TOKEN)  # the good client's connection drops one more idle one
        finally:
            for sock in idle:
                sock.close()
    assert "5 connections were waiting to prove themselves; the oldest of those with the least progress" in caplog.text


@pytest.fixture
def tls_store(tmp_path, monkeypatch):
    """A TLS store (no token) and its clients' settings."""
    pytest.importorskip("cryptography")
    from pydist.testing.tls import Authority
    for name, value in Authority(str(tmp_path / "ca")).issue("store").env().items():
        monkeypatch.setenv(name, value)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=SECONDS))
    yield master
    master.close()


def test_idle_connections_in_their_tls_handshake_are_capped_oldest_first(tls_store, monkeypatch, caplog):
    """The cap holds connections in their TLS handshake too."""
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 5)
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        idle = [_raw(tls_store) for _ in range(12)]
        try:
            assert all(_closed_by_server(sock) for sock in idle[:7])  # the oldest, dropped for newer ones
            assert _stats(tls_store)["dropped_for_limits"] == 7
            _works(tls_store, None)
        finally:
            for sock in idle:
                sock.close()
    assert "5 connections were waiting to prove themselves; the oldest of those with the least progress" in caplog.text


@pytest.mark.parametrize("store", [TOKEN], indirect=True)
def test_clients_that_talk_are_cut_after_the_silent_ones(store, monkeypatch):
    """Cap 5: three connections in the middle of their opening (real clients on a busy host),
    then three silent ones: the oldest silent one is dropped for the third, the next for a
    good client (never the newcomer itself), which works; none that talks is dropped."""
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 5)
    talking = [_raw(store, _partial_auth_hello()) for _ in range(3)]
    silent: list[socket.socket] = []
    try:
        poll_until(lambda: _stats(store)["unauthenticated_bytes"] == 3 * 37, Deadline.after(SECONDS))
        silent = [_raw(store) for _ in range(3)]
        assert _closed_by_server(silent[0])
        _works(store, TOKEN)
        assert _closed_by_server(silent[1])
        stats = _stats(store)
        assert stats["dropped_for_limits"] == 2
        assert not select.select(talking + silent[2:], [], [], 0)[0]  # none of them was closed (nothing to read)
    finally:
        for sock in talking + silent:
            sock.close()


@pytest.mark.parametrize("store", [None, TOKEN], indirect=True, ids=["no-token", "token"])
def test_bytes_of_unfinished_messages_are_capped_in_total(store, monkeypatch, caplog):
    """Three clients each send 2 MiB of a 100 MiB set (authenticated, with the token): the
    store holds at most BUFFERED_TOTAL (4 MiB here) and one read more."""
    monkeypatch.setattr(_limits, "BUFFERED_TOTAL", 4 << 20)
    token = store.auth_token
    start = (_authenticated(store, token) if token else _greeted(store) for _ in range(3))
    attackers = []
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        for sock in start:
            attackers.append(sock)
            try:
                sock.sendall(struct.pack("<BI", REQUESTS["set"].code, 100 << 20) + b"x" * (2 << 20))
            except OSError:
                pass
        try:
            ready, _, _ = select.select(attackers, [], [], SECONDS)
            assert ready and any(_closed_by_server(sock) for sock in ready)
            _works(store, token.decode() if token else None)
            stats = _stats(store)
            assert stats["dropped_for_limits"] >= 1
            assert stats["peak_buffered_bytes"] <= (4 << 20) + READ_BYTES
            assert stats["buffered_bytes"] <= 4 << 20
        finally:
            for sock in attackers:
                sock.close()
    assert "unfinished messages hold" in caplog.text


def _greeted(master) -> socket.socket:
    """A raw connection past the hellos (no token)."""
    sock = _raw(master, hello())
    got = b""
    while len(got) < len(hello()):
        chunk = sock.recv(len(hello()) - len(got))
        assert chunk, "the server closed the connection during the hellos"
        got += chunk
    return sock


def _authenticated(master, token: bytes) -> socket.socket:
    """A raw connection past the authenticated opening (client side of _auth_opening)."""
    from pydist.store._auth_opening import ClientOpening
    sock = _raw(master)
    opening = ClientOpening(token)
    sock.sendall(opening.start())
    while not opening.done:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection during the opening"
        reply = opening.feed(chunk)
        if reply:
            sock.sendall(reply)
    greeting = opening.leftover()
    assert not greeting or greeting.startswith(WIRE_MAGIC)
    return sock
