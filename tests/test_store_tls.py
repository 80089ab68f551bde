"""Mutual TLS for TCPStore (PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA): every store
operation works over it, with or without the auth token; a client the CA did not sign, an
expired one, a plain or torch client, a TLS client of a plain store and a slow handshake are
each refused at once with words saying what to fix (and a warning on the server naming the
client)."""
from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from test_auth_tokens import FAST, _recv_all, _recv_exactly, _wait_for

from pydist.core.errors import DistNetworkError, DistStoreError
from pydist.net.auth import TOKEN_ENV, AuthenticationError
from pydist.net.tls import VARIABLES, contexts
from pydist.store import TCPStore, _tcp_server
from pydist.store._protocol import Message, encode_request, encode_response, hello
from pydist.testing.tls import Authority, Identity

FIVE = timedelta(seconds=5)
SLOW = timedelta(seconds=120)  # a refused client must fail long before this (FAST)
BIG = bytes(range(256)) * (6 << 12)  # 6 MiB: hundreds of TLS records each way


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (TOKEN_ENV, *VARIABLES):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ca(tmp_path) -> Authority:
    return Authority(str(tmp_path / "ca"))


@pytest.fixture
def use(monkeypatch):
    """``use(identity)``: the TLS settings of the stores made next (None: no TLS)."""
    def apply(identity: Identity | None) -> None:
        for name in VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in (identity.env() if identity else {}).items():
            monkeypatch.setenv(name, value)
    return apply


@pytest.fixture
def master(ca, use):
    use(ca.issue("store"))
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE)
    yield store
    store.close()


def _peers(store: TCPStore) -> int:
    return len(store._server._peers)


def _settle(store: TCPStore, count: int) -> None:
    """Wait until the server holds ``count`` connections (refused ones are closed)."""
    deadline = time.monotonic() + 5
    while _peers(store) != count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _peers(store) == count


def _refused(port: int, words: str, error: type[Exception] = DistNetworkError) -> str:
    """Connect a client with the current settings; it must fail at once with ``words``."""
    started = time.monotonic()
    with pytest.raises(error, match=words) as info:
        TCPStore("127.0.0.1", port, timeout=SLOW)
    assert time.monotonic() - started < FAST  # not retried until the timeout
    return str(info.value)


# -- working --------------------------------------------------------------------------------

@pytest.mark.parametrize("read_bytes", [_tcp_server.READ_BYTES, 1000], ids=["default", "partial-records"])
def test_every_operation_round_trips_over_tls(master, ca, use, monkeypatch, read_bytes):
    """With reads smaller than a TLS record, the rest of each record waits inside the server's SSL
    object, where no readiness event announces it (``pending()``)."""
    monkeypatch.setattr(_tcp_server, "READ_BYTES", read_bytes)
    use(ca.issue("client"))
    with TCPStore("127.0.0.1", master.port, timeout=FIVE) as client:
        client.set("a", "1")
        assert master.get("a") == b"1" and client.add("n", 5) == 5 and master.add("n", 1) == 6
        assert client.compare_set("a", "1", "2") == b"2" and client.compare_set("a", "x", "3") == b"2"
        client.set("big", BIG)
        assert master.get("big") == BIG and client.multi_get(["a", "big", "n"]) == [b"2", BIG, b"6"]
        client.wait(["a", "big"])
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(client.get("later")))  # answered by another client
        waiter.start()
        time.sleep(0.2)
        master.set("later", "x")
        waiter.join(5)
        assert got == [b"x"] and sorted(master.list_keys()) == ["a", "big", "later", "n"]


def test_pipelined_requests_over_one_tls_connection_are_all_answered(master, ca, use, monkeypatch):
    """Many requests in one burst of TLS records, read in pieces smaller than a record: none is
    left inside the server's SSL object."""
    monkeypatch.setattr(_tcp_server, "READ_BYTES", 1000)
    use(ca.issue("raw"))
    context = contexts().client
    requests = [encode_request(Message("set", (f"k{i}", bytes([i]) * 40000))) for i in range(200)]
    with context.wrap_socket(socket.create_connection(("127.0.0.1", master.port), timeout=10)) as sock:
        sock.sendall(hello() + b"".join(requests))
        ok = encode_response(Message("ok", ()))
        assert _recv_exactly(sock, 6 + 200 * len(ok)) == hello() + ok * 200
    assert master.num_keys() == 200 and master.get("k199") == bytes([199]) * 40000


def test_tls_with_the_auth_token(ca, use, monkeypatch, caplog):
    monkeypatch.setenv(TOKEN_ENV, "job-token")
    use(ca.issue("store"))
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE) as store:
        use(ca.issue("client"))
        with TCPStore("127.0.0.1", store.port, timeout=FIVE) as client:
            client.set("k", BIG)
            assert store.get("k") == BIG and client.auth_token == b"job-token"
        monkeypatch.setenv(TOKEN_ENV, "another-token")
        with caplog.at_level(logging.WARNING, logger="pydist.store"):
            _refused(store.port, "authentication with store server at .* failed: .*tokens differ", AuthenticationError)
            _wait_for(caplog, "authentication failed: wrong proof")
            use(None)  # no TLS: refused for that, before the token is looked at
            _refused(store.port, "requires TLS")
            _wait_for(caplog, "not TLS: a pydist client")


# -- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("client, words, logged", [
    ("stranger", r"the store at 127\.0\.0\.1:\d+ refused this client's certificate: tlsv1 alert unknown ca "
                 r"\(is PYDIST_TLS_CERT signed by the CA the store trusts", "unable to get local issuer certificate"),
    ("expired", r"refused this client's certificate: sslv3 alert certificate expired", "certificate has expired"),
    ("plain", r"store server at 127\.0\.0\.1:\d+ refused this client: this store requires TLS: "
              "set PYDIST_TLS_CERT, PYDIST_TLS_KEY and PYDIST_TLS_CA", "not TLS: a pydist client without PYDIST_TLS_*"),
    ("distrusting", r"this client refused the certificate of the store at 127\.0\.0\.1:\d+: certificate verify "
                    r"failed: .*\(is the store's PYDIST_TLS_CERT signed by this client's PYDIST_TLS_CA",
     "TLS handshake failed: tlsv1 alert unknown ca"),
], ids=["another-ca", "expired", "plain-client", "client-distrusts-store"])
def test_the_store_refuses_at_once_and_logs(master, ca, use, tmp_path, caplog, client, words, logged):
    other = Authority(str(tmp_path / "other"), "another CA")
    identities = {"stranger": replace(other.issue("stranger"), ca=ca.ca),  # trusts the store, but not trusted
                  "expired": ca.issue("late", expired=True),
                  "plain": None,
                  "distrusting": replace(ca.issue("client"), ca=other.ca)}  # trusted, but trusts another CA
    connections = _peers(master)
    use(identities[client])
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        _refused(master.port, words)
        _wait_for(caplog, logged)
    assert f"store server 127.0.0.1:{master.port}: dropping client ('127.0.0.1', " in caplog.text
    _settle(master, connections)
    assert master.num_keys() == 0


def test_a_tls_client_refuses_a_plain_store_at_once(ca, use, caplog):
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE) as plain:
        use(ca.issue("client"))
        with caplog.at_level(logging.WARNING, logger="pydist.store"):
            message = _refused(plain.port, r"the store at 127\.0\.0\.1:\d+ does not use TLS or refused it: ")
            _wait_for(caplog, "a TLS client (PYDIST_TLS_* set there) and this store does not use TLS")
    assert "PYDIST_TLS_* must be set for the store and its clients alike" in message


@pytest.mark.parametrize("client, logged", [
    (b"\x00" * 13, "not TLS: a torch TCPStore client, refused because this store requires TLS"),
    (b"GET / HTTP/1.1\r\n\r\n", "not TLS: its first byte b'G' does not start a TLS handshake"),
    pytest.param("torch", "not TLS: a torch TCPStore client, refused", marks=pytest.mark.slow),
], ids=["torch-query", "http", "torch"])
def test_non_tls_clients_are_closed_and_logged(master, caplog, client, logged):
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        if client == "torch":  # torch's own TCPStore client, which cannot do TLS
            tdist = pytest.importorskip("torch.distributed")
            with pytest.raises(RuntimeError):
                tdist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=1))
        else:
            with socket.create_connection(("127.0.0.1", master.port)) as raw:
                raw.sendall(client)
                assert _recv_all(raw) == b""
        _wait_for(caplog, logged)
    assert f"store server 127.0.0.1:{master.port}: dropping client ('127.0.0.1', " in caplog.text
    assert master.num_keys() == 0


@pytest.mark.slow
def test_silent_and_stalled_handshakes_neither_block_the_server_nor_keep_their_slot(ca, use, monkeypatch, caplog):
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", "1")
    use(ca.issue("store"))
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE) as store:
        connections = _peers(store)
        with caplog.at_level(logging.WARNING, logger="pydist.store"), \
                socket.create_connection(("127.0.0.1", store.port)) as silent, \
                socket.create_connection(("127.0.0.1", store.port)) as stalled:
            stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
            started = time.monotonic()
            with TCPStore("127.0.0.1", store.port, timeout=FIVE) as client:  # served meanwhile
                client.set("k", "v")
                assert store.get("k") == b"v"
            assert time.monotonic() - started < FAST
            assert _recv_all(silent) == b"" and _recv_all(stalled) == b""  # dropped by the server
            _wait_for(caplog, "no handshake within 1 s (PYDIST_HANDSHAKE_TIMEOUT)")
        assert caplog.text.count("no handshake within 1 s (PYDIST_HANDSHAKE_TIMEOUT)") == 2
        _settle(store, connections)


# -- settings ----------------------------------------------------------------------------------

def test_partial_settings_fail_at_store_creation(ca, monkeypatch):
    monkeypatch.setenv("PYDIST_TLS_CERT", ca.issue("store").cert)
    with pytest.raises(ValueError, match="PYDIST_TLS_KEY, PYDIST_TLS_CA are not set"):
        TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE)
    with pytest.raises(ValueError, match="PYDIST_TLS_KEY, PYDIST_TLS_CA are not set"):
        TCPStore("127.0.0.1", 1, timeout=FIVE)


def test_multi_tenant_servers_must_share_the_tls_settings(ca, use):
    use(ca.issue("store"))
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, multi_tenant=True) as store:
        with TCPStore("127.0.0.1", store.port, is_master=True, timeout=FIVE, multi_tenant=True) as same:
            assert same.port == store.port
        for other in (ca.issue("another"), None):
            use(other)
            with pytest.raises(DistStoreError, match="already serves it with other TLS settings"):
                TCPStore("127.0.0.1", store.port, is_master=True, timeout=FIVE, multi_tenant=True)
    use(None)
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, multi_tenant=True) as plain:
        use(ca.issue("store"))
        with pytest.raises(DistStoreError, match="already serves it without TLS"):
            TCPStore("127.0.0.1", plain.port, is_master=True, timeout=FIVE, multi_tenant=True)
