"""Authentication with a shared token (PYDIST_AUTH_TOKEN / TCPStore(auth_token=)): the
store and the tcp mesh require a mutual HMAC challenge–response, refuse (and log) anyone
else, and behave byte for byte as before without a token. The store binds only its address."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DistNetworkError, DistStoreError
from pydist.net.auth import CLIENT, SERVER, TOKEN_ENV, AuthenticationError, Transcript, resolve_token, token_of
from pydist.store import HashStore, PrefixStore, TCPStore
from pydist.store._auth_opening import ClientOpening, ServerOpening
from pydist.store._protocol import (
    AUTH_ACCEPTED,
    AUTH_REFUSED,
    Message,
    auth_hello,
    encode_request,
    encode_response,
    hello,
)
from pydist.store._service import StoreService
from pydist.testing import run_processes
from pydist.testing.threads import RankFailed
from pydist.transport.framing import HEADER_SIZE, Kind, decode_header, encode_frame
from pydist.transport.tcp.hello import Acceptor, Connector, Refused
from pydist.transport.tcp.mesh import PeerRecord, accept_from, connect_to

TOKEN = b"correct horse battery staple"
FIVE = timedelta(seconds=5)
#: Seconds: a refused client must fail at once, not at its timeout (SLOW: 120 s); generous,
#: because a loaded machine can stall a thread for seconds.
FAST = 30.0
SLOW = 120.0


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@pytest.fixture
def master():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, auth_token=TOKEN)
    yield store
    store.close()


def _recv_all(sock: socket.socket) -> bytes:
    """Everything until the peer closes (a refused connection must be closed)."""
    sock.settimeout(5)
    data = bytearray()
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:  # closed with our unread bytes in its buffer
        pass
    return bytes(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(5)
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed early"
        data += chunk
    return bytes(data)


def _wait_for(caplog, text: str) -> None:
    deadline = time.monotonic() + 5
    while text not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert text in caplog.text


# -- the proofs and the store's opening, sans-IO -----------------------------------------

def test_token_from_argument_env_and_store_chain(monkeypatch):
    assert resolve_token(None) is None and resolve_token("") is None
    assert resolve_token("abc") == b"abc" == resolve_token(b"abc")
    with pytest.raises(TypeError, match="auth_token"):
        resolve_token(3)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert resolve_token(None) == b"from-env" and resolve_token("") is None
    assert token_of(HashStore()) == b"from-env"
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, auth_token="mine") as store:
        assert token_of(PrefixStore("a", PrefixStore("b", store))) == b"mine"
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, auth_token="") as store:
        assert token_of(PrefixStore("a", store)) is None  # the store's choice wins over the env


def test_proofs_bind_role_token_purpose_and_every_message():
    def transcript(token=TOKEN, purpose="store", messages=(b"one", b"two")):
        t = Transcript(token, purpose)
        for message in messages:
            t.add(message)
        return t

    proof = transcript().proof(CLIENT)
    assert len(proof) == 32 and transcript().check(CLIENT, proof)
    assert not transcript().check(SERVER, proof)  # reflection: a client proof is no server proof
    for other in (transcript(token=b"other"), transcript(purpose="mesh"), transcript(messages=(b"one", b"twO")),
                  transcript(messages=(b"onet", b"wo"))):
        assert not other.check(CLIENT, proof)
    assert not transcript().check(CLIENT, b"") and not transcript().check(CLIENT, proof[:-1] + b"\0")


def _open_in_memory(client: ClientOpening, server: ServerOpening) -> list[bytes]:
    """Run the opening byte by byte; the messages the client sent."""
    sent = [client.start()]
    while not client.done:
        reply = b"".join(server.feed(bytes([b])) for b in sent[-1])
        sent.append(b"".join(client.feed(bytes([b])) for b in reply))
    return sent


def test_store_opening_round_trip_byte_by_byte():
    client, server = ClientOpening(TOKEN), ServerOpening(TOKEN)
    sent = _open_in_memory(client, server)
    assert client.done and server.done and sent[-1] == b""
    assert len(sent[0]) == 38 and sent[0].startswith(b"PDST") and len(sent[1]) == 32
    server.feed(b"next request")
    assert server.leftover() == b"next request"


def test_store_opening_fails_on_wrong_token_and_on_a_server_without_proof():
    client, server = ClientOpening(TOKEN), ServerOpening(b"another token")
    answer = server.feed(client.start())
    with pytest.raises(Exception, match="wrong proof") as refused:
        server.feed(client.feed(answer))
    with pytest.raises(AuthenticationError, match="tokens differ"):
        client.feed(refused.value.reply)
    rogue = ClientOpening(TOKEN)  # a server that accepts anyone cannot fake its proof
    rogue.start()
    rogue.feed(auth_hello(bytes(32)))
    with pytest.raises(AuthenticationError, match="did not prove"):
        rogue.feed(bytes([AUTH_ACCEPTED]) + bytes(32))


def _service_run(service: StoreService, cid: int, data: bytes) -> tuple[bytes, str | None]:
    service.open(cid)
    service.receive(cid, data, 0.0)
    return bytes(service.take_output().get(cid, b"")), service.take_dropped().get(cid)


def test_service_refuses_a_replayed_handshake_and_runs_none_of_its_requests():
    service = StoreService(TOKEN)
    client = ClientOpening(TOKEN)
    service.open(1)
    first = client.start()
    service.receive(1, first, 0.0)
    proof = client.feed(bytes(service.take_output()[1]))
    request = encode_request(Message("set", ("k", b"legit")))
    service.receive(1, proof + request, 0.0)
    assert bytes(service.take_output()[1])[33:] == encode_response(Message("ok", ()))
    assert service.state.data == {"k": b"legit"}
    # An eavesdropper replays the client's bytes, with a request of its own.
    forged = encode_request(Message("set", ("k", b"forged")))
    output, reason = _service_run(service, 2, first + proof + forged)
    assert reason.startswith("authentication failed: wrong proof")
    assert output[:6] == first[:6] and output[38:] == bytes([AUTH_REFUSED])  # fresh nonce, then refusal
    assert service.state.data == {"k": b"legit"}


@pytest.mark.parametrize(
    "data, reply, words",
    [
        (hello() + encode_request(Message("set", ("k", b"v"))), auth_hello(), "did not authenticate"),
        (b"\x00" + b"\x00" * 12, b"", "torch TCPStore client"),
        (auth_hello(bytes(32)) + bytes(32) + encode_request(Message("num_keys", ())), None, "wrong proof"),
        (b"PDST" + bytes([0x01, 0x90]) + bytes(32), b"", "version"),
        (b"GET / HTTP/1.1\r\n\r\n", b"", "magic"),
    ],
    ids=["no-token", "torch", "guessed-proof", "other-version", "http"],
)
def test_service_with_a_token_refuses_before_reading_a_key(data, reply, words):
    service = StoreService(TOKEN)
    service.state.set("secret", b"x")
    output, reason = _service_run(service, 1, data)
    assert words in reason and (reason.startswith("authentication failed") or words == "magic")
    if reply is not None:
        assert output == reply
    else:  # the server's nonce, then the refusal: never a key or a value
        assert len(output) == 39 and output[-1] == AUTH_REFUSED
    assert service.state.data == {"secret": b"x"} and service.state.take_changes() == [Message("set", ("secret", b"x"))]


def test_service_without_a_token_is_unchanged_and_tells_an_authenticating_client():
    output, reason = _service_run(StoreService(), 1, hello() + encode_request(Message("num_keys", ())))
    assert reason is None and output == hello() + encode_response(Message("int", (0,)))
    output, reason = _service_run(StoreService(), 2, auth_hello(bytes(32)))
    assert output == hello() and "this side has none" in reason


# -- the store over sockets -------------------------------------------------------------

def test_store_with_the_right_token_works(master, monkeypatch):
    client = TCPStore("127.0.0.1", master.port, timeout=FIVE, auth_token=TOKEN.decode())
    client.set("a", "1")
    assert master.get("a") == b"1" and client.add("n", 2) == 2
    waiter = threading.Thread(target=lambda: got.append(client.get("later")))
    got: list[bytes] = []
    waiter.start()
    master.set("later", "x")
    waiter.join(5)
    assert got == [b"x"] and sorted(master.list_keys()) == ["a", "later", "n"]
    monkeypatch.setenv(TOKEN_ENV, TOKEN.decode())
    with TCPStore("127.0.0.1", master.port, timeout=FIVE) as from_env:
        assert from_env.auth_token == TOKEN and from_env.multi_get(["a", "n"]) == [b"1", b"2"]
    client.close()


@pytest.mark.parametrize("token, words", [(b"wrong", "tokens differ"), ("", "requires a token")],
                         ids=["wrong-token", "no-token"])
def test_store_refuses_a_client_without_the_token_at_once(master, caplog, token, words):
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with pytest.raises(AuthenticationError,
                           match="authentication with store server at 127.0.0.1:.* failed") as info:
            TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=SLOW), auth_token=token)
        assert time.monotonic() - started < FAST  # not retried until the timeout
        _wait_for(caplog, "authentication failed")
    assert words in str(info.value)
    assert isinstance(info.value, DistStoreError) and isinstance(info.value, DistNetworkError)
    assert f"store server 127.0.0.1:{master.port}: dropping client ('127.0.0.1', " in caplog.text


def test_a_client_with_a_token_refuses_a_server_without_one():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE) as plain:
        with pytest.raises(AuthenticationError, match="server has no token"):
            TCPStore("127.0.0.1", plain.port, timeout=FIVE, auth_token=TOKEN)


def test_a_client_sends_nothing_to_a_server_that_cannot_prove_the_token():
    """A rogue server that accepts any proof never gets a request (mutual authentication)."""
    received = bytearray()

    def rogue(listener: socket.socket) -> None:
        sock, _ = listener.accept()
        with sock:
            received.extend(_recv_exactly(sock, 38))
            sock.sendall(auth_hello(bytes(32)))
            received.extend(_recv_exactly(sock, 32))
            sock.sendall(bytes([AUTH_ACCEPTED]) + bytes(32))
            received.extend(_recv_all(sock))

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=rogue, args=(listener,))
        thread.start()
        with pytest.raises(AuthenticationError, match="did not prove that it holds the token"):
            TCPStore("127.0.0.1", listener.getsockname()[1], timeout=FIVE, auth_token=TOKEN)
        thread.join(5)
    assert len(received) == 38 + 32  # hello and proof, no request


def test_a_rogue_raw_client_can_neither_write_nor_read(master, caplog):
    master.set("secret", "s")
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with socket.create_connection(("127.0.0.1", master.port)) as rogue:
            rogue.sendall(hello() + encode_request(Message("set", ("injected", b"x")))
                          + encode_request(Message("multi_get", (["secret"], 100))))
            assert _recv_all(rogue) == auth_hello()  # "authentication required", then closed
            where = rogue.getsockname()
        _wait_for(caplog, f"dropping client {where!r}: authentication failed")
        with socket.create_connection(("127.0.0.1", master.port)) as rogue:
            rogue.sendall(auth_hello(bytes(32)))
            server_hello = _recv_exactly(rogue, 38)
            rogue.sendall(bytes(32) + encode_request(Message("set", ("injected", b"x"))))
            assert _recv_all(rogue) == bytes([AUTH_REFUSED])
            assert server_hello.startswith(b"PDST")
            where = rogue.getsockname()
        _wait_for(caplog, f"dropping client {where!r}: authentication failed: wrong proof")
    assert not master.check(["injected"]) and master.get("secret") == b"s"


def test_a_replayed_store_handshake_is_refused(master, caplog):
    with socket.create_connection(("127.0.0.1", master.port)) as legit:  # the capture
        client = ClientOpening(TOKEN)
        sent = client.start()
        legit.sendall(sent)
        first_answer = _recv_exactly(legit, 38)
        proof = client.feed(first_answer)
        legit.sendall(proof)
        client.feed(_recv_exactly(legit, 33))
        assert client.done
        captured = sent + proof
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with socket.create_connection(("127.0.0.1", master.port)) as replay:
            replay.sendall(captured[:38])
            assert _recv_exactly(replay, 38) != first_answer  # a fresh nonce: the captured proof is stale
            replay.sendall(captured[38:] + encode_request(Message("set", ("replayed", b"x"))))
            assert _recv_all(replay) == bytes([AUTH_REFUSED])
        _wait_for(caplog, "replayed handshake")
    assert not master.check(["replayed"])


@pytest.mark.slow
def test_torch_clients_are_refused_when_a_token_is_set(master, caplog):
    tdist = pytest.importorskip("torch.distributed")
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with pytest.raises(RuntimeError):
            tdist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=1))
    assert "a torch TCPStore client, refused" in caplog.text
    assert master.num_keys() == 0


def test_without_a_token_the_wire_is_unchanged():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE) as store:
        assert store.auth_token is None
        with socket.create_connection(("127.0.0.1", store.port)) as raw:
            raw.sendall(hello() + encode_request(Message("set", ("k", b"v"))))
            assert _recv_exactly(raw, 6 + 5) == hello() + encode_response(Message("ok", ()))
        assert store.get("k") == b"v"
    first = Connector(1, "world", 0, None).first
    assert first == encode_frame(Kind.HELLO, 0, 0, 0, json.dumps({"rank": 1, "token": "world"}).encode())


def test_multi_tenant_servers_must_share_the_token():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=FIVE, multi_tenant=True, auth_token=TOKEN) as store:
        with TCPStore("127.0.0.1", store.port, is_master=True, timeout=FIVE, multi_tenant=True,
                      auth_token=TOKEN) as same:
            assert same.port == store.port
        with pytest.raises(DistStoreError, match="another auth token"):
            TCPStore("127.0.0.1", store.port, is_master=True, timeout=FIVE, multi_tenant=True, auth_token=b"x")


def test_the_store_binds_only_the_address_it_is_given():
    try:
        store = TCPStore("127.0.0.2", 0, is_master=True, timeout=FIVE, auth_token=TOKEN)
    except DistNetworkError:
        pytest.skip("127.0.0.2 is not a local address here")
    with store:
        assert store._server._listener.getsockname()[0] == "127.0.0.2"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", store.port), timeout=5).close()
        store.set("k", "v")
        assert store.get("k") == b"v"


# -- the tcp mesh ---------------------------------------------------------------------------

def _handshake_in_memory(connector: Connector, acceptor: Acceptor) -> list[bytes]:
    """Frames each way until both are done; what the connector sent."""
    sent, frame = [connector.first], connector.first
    while not connector.done:
        reply = acceptor.on_hello(frame)
        frame = connector.on_hello(reply)
        if frame:
            sent.append(frame)
    return sent


def test_mesh_handshake_sans_io():
    connector, acceptor = Connector(2, "world", 0, TOKEN), Acceptor(0, "world", {1, 2}, TOKEN)
    sent = _handshake_in_memory(connector, acceptor)
    assert acceptor.done and acceptor.peer == 2 and len(sent) == 2
    assert all(decode_header(frame[:HEADER_SIZE]).kind == Kind.HELLO for frame in sent)
    plain_c, plain_a = Connector(2, "world", 0, None), Acceptor(0, "world", {2}, None)
    assert _handshake_in_memory(plain_c, plain_a) == [plain_c.first] and plain_a.peer == 2


@pytest.mark.parametrize(
    "connector_token, acceptor_token, words",
    [(b"other", TOKEN, "tokens differ"), (None, TOKEN, "requires a token"), (TOKEN, None, "has no token")],
    ids=["wrong-token", "no-token", "acceptor-without-token"],
)
def test_mesh_handshake_refusals_sans_io(connector_token, acceptor_token, words):
    connector, acceptor = Connector(1, "world", 0, connector_token), Acceptor(0, "world", {1}, acceptor_token)
    with pytest.raises(Refused) as refused:
        _handshake_in_memory(connector, acceptor)
    assert not acceptor.done
    with pytest.raises(AuthenticationError, match=words):
        connector.on_hello(refused.value.reply)


def test_mesh_refuses_a_replayed_handshake_sans_io():
    sent = _handshake_in_memory(Connector(1, "world", 0, TOKEN), Acceptor(0, "world", {1}, TOKEN))
    replayed = Acceptor(0, "world", {1}, TOKEN)
    replayed.on_hello(sent[0])
    with pytest.raises(Refused, match="replayed"):
        replayed.on_hello(sent[1])


def _accept_in_thread(listener: socket.socket, token: bytes | None, seconds: float = 10.0):
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["sockets"] = accept_from(listener, {1}, 0, "world", Deadline.after(seconds), token)
        except Exception as error:  # noqa: BLE001 - checked by the test
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_mesh_rank_refuses_garbage_replays_and_impostors_then_accepts_its_peer(caplog):
    sent = _handshake_in_memory(Connector(1, "world", 0, TOKEN), Acceptor(0, "world", {1}, TOKEN))
    data_frame = encode_frame(Kind.DATA, 0, 0, 0, b"injected")
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            thread, result = _accept_in_thread(listener, TOKEN)
            with socket.create_connection(("127.0.0.1", port)) as garbage:
                garbage.sendall(b"\xff" * 64 + data_frame)
                assert _recv_all(garbage) == b""
                where_garbage = garbage.getsockname()
            with socket.create_connection(("127.0.0.1", port)) as replay:  # a captured handshake
                replay.sendall(sent[0])
                header = decode_header(_recv_exactly(replay, HEADER_SIZE))
                assert b"nonce" in _recv_exactly(replay, header.nbytes)
                replay.sendall(sent[1])
                assert b"refused" in _recv_all(replay)
                where_replay = replay.getsockname()
            with socket.create_connection(("127.0.0.1", port)) as plain:  # no token: a plain HELLO
                plain.sendall(Connector(1, "world", 0, None).first)
                assert b"requires a token" in _recv_all(plain)
            record = PeerRecord(0, "127.0.0.1", port, "localhost", "h0")
            with pytest.raises(AuthenticationError, match="authentication failed: it refused this rank: wrong proof"):
                connect_to(record, 1, "world", Deadline.after(10), b"wrong token")
            sock = connect_to(record, 1, "world", Deadline.after(10), TOKEN)
            thread.join(10)
    assert sorted(result["sockets"]) == [1]
    result["sockets"][1].close()
    sock.close()
    assert f"pydist rank 0 dropped a connection from {where_garbage!r}" in caplog.text
    assert f"pydist rank 0 refused a connection from {where_replay!r}: authentication failed" in caplog.text
    assert caplog.text.count("refused a connection") == 3


@pytest.mark.slow
def test_mesh_connector_with_a_token_refuses_an_acceptor_without_one():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread, result = _accept_in_thread(listener, None, seconds=1.0)
        record = PeerRecord(0, "127.0.0.1", listener.getsockname()[1], "localhost", "h0")
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match="rank 1 could not authenticate with rank 0 .*has no token"):
            connect_to(record, 1, "world", Deadline.after(SLOW), TOKEN)
        assert time.monotonic() - started < FAST  # not retried until the deadline
        thread.join(10)
    assert isinstance(result["error"], DistNetworkError)  # the acceptor timed out waiting for rank 1


# -- whole jobs --------------------------------------------------------------------------

def _all_reduce(rank: int, size: int) -> list[float]:
    import pydist as dist
    t = np.arange(4, dtype=np.float32) + rank
    dist.all_reduce(t)
    return t.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("init, env", [("env", {}), ("file", {"PYDIST_SHM": "0"})], ids=["env-store", "file-store-tcp"])
def test_a_job_with_a_token_runs(init, env):
    """env://: the store and the mesh authenticate; file://: the mesh takes the token from
    the environment, and without shared memory every byte crosses authenticated sockets."""
    results = run_processes(3, _all_reduce, init=init, env={TOKEN_ENV: "job-token", **env}, timeout=60)
    assert results == [[3.0, 6.0, 9.0, 12.0]] * 3


@pytest.mark.slow
def test_a_rank_with_another_token_is_refused_by_its_peers():
    with pytest.raises(RankFailed, match="authentication failed"):
        run_processes(3, _all_reduce, init="file", env={TOKEN_ENV: "job-token"},
                      rank_env={2: {TOKEN_ENV: "other-token"}}, pg_timeout=5, timeout=60)
