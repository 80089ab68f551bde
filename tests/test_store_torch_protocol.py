"""pydist's TCPStore server speaking torch's TCPStore client protocol.

First the sans-IO parsers (``_torch_protocol``) byte by byte, against bytes captured from
torch 2.13's client, and the server logic (``_service``) without sockets; then real
``torch.distributed.TCPStore`` clients against a real pydist server: every method compared
with torch's own master, timeouts, keys shared with pydist clients, many clients, and
torch's rendezvous (``init_process_group``, and env:// under ``pydist-run``) through it.

torch's ``list_keys`` and ``queue_len`` bindings keep the GIL while they wait for the
answer, so they would deadlock against a server thread in the same interpreter: the
method-by-method comparison runs its torch client in a subprocess
(``run_scripts/torch_store_sequence.py``); in-process tests avoid those two methods.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from pydist.store import PrefixStore, TCPStore
from pydist.store._protocol import MAX_KEY_BYTES, MAX_VALUE_BYTES, Message, ProtocolError, encode_response, hello
from pydist.store._protocol import encode_request as pydist_request
from pydist.store._service import StoreService
from pydist.store._torch_protocol import (
    MAX_KEY_COUNT,
    QUERIES,
    STOP_WAITING,
    VALIDATION_MAGIC,
    WAIT_CANCELED,
    TorchReplyParser,
    TorchRequestParser,
    encode_reply,
    encode_request,
)
from pydist.testing.commands import finish, run_command, start_command

SCRIPTS = Path(__file__).parent / "run_scripts"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

VALIDATE = Message("validate", (VALIDATION_MAGIC,))
REQUESTS = [
    VALIDATE,
    Message("ping", (0x4149,)),
    Message("set", ("/k", b"v\x00\xff")),
    Message("compare_set", ("/k", b"", b"new")),
    Message("get", ("/ключ",)),
    Message("add", ("init/", -(1 << 63))),
    Message("check", (["/a", "/b"],)),
    Message("wait", ([],)),
    Message("num_keys", ()),
    Message("delete_key", ("/k",)),
    Message("append", ("/log", b"x" * 3000)),
    Message("multi_get", (["/a", "/b", "/c"],)),
    Message("multi_set", (["/a", "/b"], [b"1", b""])),
    Message("cancel_wait", ()),
    Message("queue_push", ("/q", b"item")),
    Message("queue_pop", ("/q",)),
    Message("queue_len", ("/q",)),
    Message("list_keys", ()),
    Message("barrier", ("/bar", 4)),
]
#: (request, result) for every kind of reply.
REPLIES = [
    (Message("ping", (7,)), 7),
    (Message("compare_set", ("/k", b"", b"v")), b"v"),
    (Message("get", ("/k",)), b""),
    (Message("add", ("/n", 1)), -5),
    (Message("check", (["/a"],)), True),
    (Message("check", (["/a"],)), False),
    (Message("wait", (["/a"],)), STOP_WAITING),
    (Message("num_keys", ()), 3),
    (Message("delete_key", ("/k",)), 1),
    (Message("multi_get", (["/a", "/b"],)), [b"1", b"\x00" * 2000]),
    (Message("multi_get", ([],)), []),
    (Message("cancel_wait", ()), WAIT_CANCELED),
    (Message("queue_pop", ("/q",)), (2, b"item")),
    (Message("queue_pop", ("/q",)), (0, None)),
    (Message("queue_len", ("/q",)), 0),
    (Message("list_keys", ()), ["/a", "init/", "/λ"]),
    (Message("barrier", ("/b", 2)), STOP_WAITING),
]

# Bytes torch 2.13's client sent and its server answered, captured on the wire.
U64_1, U64_2 = struct.pack("<Q", 1), struct.pack("<Q", 2)
GOLDEN_REQUESTS = [
    (bytes.fromhex("00 ce f7 85 3c"), VALIDATE),
    (bytes.fromhex("0d 49 41 00 00"), Message("ping", (0x4149,))),
    (b"\x01" + U64_2 + b"/k" + U64_1 + b"v", Message("set", ("/k", b"v"))),
    (b"\x06" + U64_1 + U64_2 + b"/k", Message("wait", (["/k"],))),
    (b"\x04" + struct.pack("<Q", 5) + b"init/" + U64_1, Message("add", ("init/", 1))),
    (b"\x0b" + U64_2 + U64_2 + b"/a" + U64_1 + b"1" + U64_2 + b"/b" + U64_1 + b"2",
     Message("multi_set", (["/a", "/b"], [b"1", b"2"]))),
    (b"\x12" + struct.pack("<Q", 4) + b"/bar" + U64_1, Message("barrier", ("/bar", 1))),
    (b"\x0c", Message("cancel_wait", ())),
    (b"\x11", Message("list_keys", ())),
]
GOLDEN_REPLIES = [
    (bytes.fromhex("49 41 00 00"), Message("ping", (0x4149,)), 0x4149),
    (U64_1 + b"v", Message("get", ("/k",)), b"v"),
    (b"\x01", Message("check", (["/k", "/zz"],)), False),
    (b"\x00", Message("wait", (["/k"],)), STOP_WAITING),
    (b"\x01", Message("cancel_wait", ()), WAIT_CANCELED),
    (struct.pack("<q", 1) + struct.pack("<Q", 4) + b"item", Message("queue_pop", ("/q",)), (1, b"item")),
    (struct.pack("<q", 2) + U64_2 + b"/b" + U64_2 + b"/a", Message("list_keys", ()), ["/b", "/a"]),
]


# -- the sans-IO parsers ------------------------------------------------------------------
def test_every_query_is_exercised():
    assert {msg.name for msg in REQUESTS} == set(QUERIES)
    assert {request.name for request, _ in REPLIES} == {name for name, q in QUERIES.items() if q.reply != "none"}


def test_requests_parse_byte_by_byte():
    parser = TorchRequestParser()
    for msg in REQUESTS:
        data = encode_request(msg)
        for i in range(len(data) - 1):
            parser.feed(data[i:i + 1])
            assert parser.next() is None, (msg.name, i)
        parser.feed(data[-1:])
        assert parser.next() == msg
        assert parser.pending == 0 and parser.next() is None


def test_requests_parse_in_one_chunk():
    parser = TorchRequestParser()
    parser.feed(b"".join(map(encode_request, REQUESTS)))
    assert [parser.next() for _ in REQUESTS] == REQUESTS
    assert parser.next() is None


@pytest.mark.parametrize("data, msg", GOLDEN_REQUESTS, ids=[m.name for _, m in GOLDEN_REQUESTS])
def test_requests_match_torch_clients_bytes(data, msg):
    assert encode_request(msg) == data
    parser = TorchRequestParser()
    parser.feed(encode_request(VALIDATE) + data)
    assert parser.next() == VALIDATE and parser.next() == msg


def test_replies_parse_byte_by_byte():
    parser = TorchReplyParser()
    for request, result in REPLIES:
        parser.expect(request)
        data = encode_reply(request.name, result)
        for i in range(len(data) - 1):
            parser.feed(data[i:i + 1])
            assert parser.next() is None, (request.name, i)
        parser.feed(data[-1:])
        assert parser.next() == Message(request.name, (result,))
        assert parser.pending == 0


@pytest.mark.parametrize("data, query, result", GOLDEN_REPLIES, ids=[q.name for _, q, _ in GOLDEN_REPLIES])
def test_replies_match_torch_servers_bytes(data, query, result):
    assert encode_reply(query.name, result) == data
    parser = TorchReplyParser()
    parser.expect(query)
    parser.feed(data)
    assert parser.next() == Message(query.name, (result,))


def test_queries_without_a_reply_encode_to_nothing():
    silent = [name for name, query in QUERIES.items() if query.reply == "none"]
    assert sorted(silent) == ["append", "multi_set", "queue_push", "set", "validate"]
    parser = TorchReplyParser()
    for name in silent:
        assert encode_reply(name, None) == b""
        parser.expect(Message(name, ()))  # ignored: nothing will come
    parser.feed(b"\x00")
    with pytest.raises(ProtocolError, match="no request asked for"):
        parser.next()


_V = encode_request(VALIDATE)


@pytest.mark.parametrize(
    "data, error",
    [
        (encode_request(Message("set", ("/k", b"v"))), "before VALIDATE"),
        (b"\x00" + struct.pack("<I", 0xDEADBEEF), "validation magic"),
        (_V + b"\x63", "unknown torch TCPStore query type 99"),
        (_V + b"\x03" + struct.pack("<Q", MAX_KEY_BYTES + 1), "over the limit"),
        (_V + b"\x01" + U64_1 + b"k" + struct.pack("<Q", MAX_VALUE_BYTES + 1), "over the limit"),
        (_V + b"\x05" + struct.pack("<Q", MAX_KEY_COUNT + 1), "keys in one query"),
        (_V + b"\x0b" + struct.pack("<Q", 1 << 63), "keys in one query"),
        (_V + b"\x03" + U64_2 + b"\xff\xfe", "UTF-8"),
    ],
    ids=["no-validate", "magic", "query-type", "key-size", "value-size", "key-count", "pair-count", "utf8"],
)
def test_malformed_requests_break_the_parser(data, error):
    parser = TorchRequestParser()
    parser.feed(data)
    with pytest.raises(ProtocolError, match=error):
        while parser.next() is not None:
            pass
    with pytest.raises(ProtocolError, match=error):  # and it stays broken
        parser.next()


def test_bad_reply_codes_are_rejected():
    parser = TorchReplyParser()
    parser.expect(Message("check", (["/a"],)))
    parser.feed(b"\x07")
    with pytest.raises(ProtocolError, match="bad check response code 7"):
        parser.next()


# -- the server logic without sockets -------------------------------------------------------
def _torch(*msgs: Message) -> bytes:
    return b"".join(map(encode_request, msgs))


def _output(service: StoreService) -> dict[int, bytes]:
    return {cid: bytes(data) for cid, data in service.take_output().items()}


def test_service_tells_the_protocols_apart_by_the_first_byte():
    service = StoreService()
    for cid in (1, 2, 3):
        service.open(cid)
    service.receive(1, hello() + pydist_request(Message("set", ("k", b"v"))), 0.0)
    service.receive(2, _torch(VALIDATE, Message("ping", (9,)), Message("get", ("/k",))), 0.0)
    service.receive(3, b"GET / HTTP/1.1\r\n", 0.0)
    assert _output(service) == {1: hello() + encode_response(Message("ok", ())), 2: struct.pack("<I", 9) + U64_1 + b"v"}
    assert list(service.take_dropped()) == [3]


def test_service_torch_wait_ends_on_a_change_or_on_cancel():
    service = StoreService()
    service.open(1)
    service.open(2)
    service.receive(1, hello(), 0.0)
    service.receive(2, _torch(VALIDATE, Message("wait", (["/a", "/b"],))), 0.0)
    assert _output(service) == {1: hello()}
    service.receive(1, pydist_request(Message("set", ("a", b"1"))), 0.0)
    service.expire(1e9)  # torch's waits have no server deadline
    assert 2 not in _output(service) and service.next_deadline() is None
    service.receive(1, pydist_request(Message("set", ("b", b"2"))), 0.0)
    assert _output(service)[2] == bytes([STOP_WAITING])
    # The client timed out just as the key came: CANCEL_WAIT still gets its WAIT_CANCELED.
    service.receive(2, _torch(Message("cancel_wait", ())), 0.0)
    assert _output(service) == {2: bytes([WAIT_CANCELED])}
    # A canceled wait is forgotten: a later change sends nothing.
    service.receive(2, _torch(Message("wait", (["/c"],)), Message("cancel_wait", ())), 0.0)
    assert _output(service) == {2: bytes([WAIT_CANCELED])}
    service.receive(1, pydist_request(Message("set", ("c", b"3"))), 0.0)
    assert 2 not in _output(service)


def test_service_torch_barrier_releases_everyone_at_the_last_arrival():
    service = StoreService()
    for cid in (1, 2, 3):
        service.open(cid)
        service.receive(cid, _torch(VALIDATE, Message("barrier", ("/bar", 3))), 0.0)
        if cid < 3:
            assert _output(service) == {}
    assert _output(service) == {cid: bytes([STOP_WAITING]) for cid in (1, 2, 3)}
    assert service.state.data["bar"] == b"3"


def test_service_drops_a_torch_client_whose_add_fails():
    service = StoreService()
    service.open(1)
    service.receive(1, _torch(VALIDATE, Message("set", ("/k", b"text")), Message("add", ("/k", 1))), 0.0)
    assert "not an integer" in service.take_dropped()[1]


# -- real torch clients against a real pydist server --------------------------------------
@pytest.fixture
def tdist():
    torch = pytest.importorskip("torch")
    return torch.distributed


@pytest.fixture
def server():
    with TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)) as store:
        yield store


def _client(tdist, port: int, seconds: float = 10.0, **kwargs):
    return tdist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=seconds), **kwargs)


def _run(command: list[str], timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    """Run ``command`` in its own session; on timeout kill the whole session (run_command)."""
    return run_command(command, timeout, **kwargs)


def _sequence(port: int) -> subprocess.Popen:
    return start_command([sys.executable, str(SCRIPTS / "torch_store_sequence.py"), "127.0.0.1", str(port)])


@pytest.mark.slow
@needs_torch
def test_every_method_answers_as_torchs_own_master(tdist, server):
    master = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        procs = [_sequence(server.port), _sequence(master.port)]
        results = [(c.stdout, c.stderr) for c in finish(procs, 120)]
    finally:
        del master
    for proc, (_out, err) in zip(procs, results):
        assert proc.returncode == 0, err
    ours, theirs = (dict(json.loads(out)) for out, _ in results)
    assert ours == theirs
    barrier = hasattr(tdist.Store, "barrier")  # torch 2.11's client has no barrier: its 2 keys are missing
    assert ours["get"] == "v" and ours["get big"] is True and ours["num_keys with init/"] == (12 if barrier else 10)
    assert ours["get timeout"] == ["DistStoreError", "wait timeout after 1000ms, keys: /never"]
    assert ours["queue_pop empty"] == ["QueueEmptyError", "queue is empty"]
    # The pydist client sees the torch client's keys, without torch's bookkeeping "init/".
    assert server.get("log") == b"abc"
    if barrier:  # (on torch 2.11 its steps fail alike on both servers)
        assert server.get("bar2") == b"1"
    user_keys = sorted(ours["list_keys with init/"] + ["init/"])  # the last step's "/init/"
    assert sorted(server.list_keys()) == user_keys and server.num_keys() == len(user_keys)


@needs_torch
def test_blocking_calls_wake_when_a_pydist_client_sets_the_keys(tdist, server):
    client = _client(tdist, server.port)
    results: dict[str, object] = {}

    # The test ends with `del client` (drops the torch client on purpose); ruff then takes
    # `client` in these closures for an undefined name.
    def block() -> None:
        results["get"] = client.get("late")  # noqa: F821 - false positive: `del client` below
        client.wait(["w1", "w2"])  # noqa: F821 - false positive: `del client` below
        results["popped"] = client.queue_pop("q")  # noqa: F821 - false positive: `del client` below

    thread = threading.Thread(target=block)
    thread.start()
    time.sleep(0.2)
    server.set("late", "x")
    server.set("w1", "1")
    time.sleep(0.1)
    assert thread.is_alive()  # still waiting for w2
    server.set("w2", "2")
    server.queue_push("q", "item")
    thread.join(10)
    assert not thread.is_alive()
    assert results == {"get": b"x", "popped": b"item"}
    del client


@pytest.mark.slow
@needs_torch
def test_timeouts_raise_torchs_error_and_keep_the_connection_usable(tdist, server):
    client = _client(tdist, server.port, seconds=0.5)
    started = time.monotonic()
    with pytest.raises(tdist.DistStoreError, match="wait timeout after 500ms, keys: /never"):
        client.get("never")
    # at least its 0.5 s timeout (the message says which ended it); the upper bound only says
    # that it did not hang, generous for a loaded machine
    assert 0.45 <= time.monotonic() - started < 30
    with pytest.raises(tdist.DistStoreError, match="wait timeout after 200ms, keys: /a, /b"):
        client.wait(["a", "b"], timedelta(milliseconds=200))
    if hasattr(client, "barrier"):  # torch 2.11's client has no barrier
        with pytest.raises(tdist.DistStoreError, match="barrier timeout after 200ms"):
            client.barrier("bar", 2, timedelta(milliseconds=200))
    server.set("a", "late")  # the canceled wait must not answer now
    client.set("k", "v")
    assert client.get("k") == b"v" and client.get("a") == b"late" and client.add("n", 2) == 2
    del client


@needs_torch
def test_torch_and_pydist_clients_share_keys(tdist, server):
    client = _client(tdist, server.port)
    client.set("from-torch", "t")
    server.set("from-pydist", "p")
    assert server.get("from-torch") == b"t" and client.get("from-pydist") == b"p"
    assert client.add("counter", 2) == 2 and server.add("counter", 3) == 5 and client.add("counter", 0) == 5
    client.queue_push("q", "a")
    server.queue_push("q", "b")
    assert server.queue_pop("q") == b"a" and client.queue_pop("q") == b"b"
    assert client.compare_set("cs", "", "1") == b"1" and server.compare_set("cs", "1", "2") == b"2"
    client.append("cs", "+")  # unanswered: a query with an answer on the same connection orders it
    assert client.get("cs") == b"2+" and server.get("cs") == b"2+"
    assert client.delete_key("from-pydist") and not server.check(["from-pydist"])
    assert client.check(["from-torch", "counter"]) and not client.check(["from-pydist"])
    assert client.multi_get(["from-torch", "cs"]) == server.multi_get(["from-torch", "cs"]) == [b"t", b"2+"]
    tdist.PrefixStore("job", client).set("x", "1")
    assert PrefixStore("job", server).get("x") == b"1"
    counted = _client(tdist, server.port, world_size=2)  # counts itself in under torch's "init/"
    assert sorted(server.list_keys()) == ["counter", "cs", "from-torch", "job/x"]
    assert server.num_keys() == 4 and client.num_keys() == 5
    del client, counted


@needs_torch
def test_many_torch_clients_at_once(tdist, server):
    count = 32
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            client = _client(tdist, server.port)
            arrived = client.add("arrived", 1)
            client.set(f"rank/{i}", str(i))
            assert client.get(f"rank/{(i + 1) % count}") == str((i + 1) % count).encode()
            if hasattr(client, "barrier"):  # torch 2.11's client has no barrier
                client.barrier("all", count, timedelta(seconds=20))
            else:  # the last to arrive releases the others
                if arrived == count:
                    client.set("all", str(count))  # what torch's barrier leaves there
                client.wait(["all"], timedelta(seconds=20))
            assert client.add("arrived", 0) == count
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert server.get("all") == str(count).encode() and server.add("arrived", 0) == count


@needs_torch
def test_garbage_on_a_torch_connection_drops_only_that_connection(tdist, server, caplog):
    client = _client(tdist, server.port)
    results: list[bytes] = []
    # `del client` at the end drops the torch client on purpose; ruff then flags the closure.
    waiter = threading.Thread(
        target=lambda: results.append(client.get("later")))  # noqa: F821 - false positive: `del client` below
    waiter.start()  # a parked torch wait must survive the garbage
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as bad:
            bad.sendall(encode_request(VALIDATE) + b"\x63garbage")
            while bad.recv(4096):  # the server closes the connection
                pass
        failing = _client(tdist, server.port)
        failing.set("text", "not a number")
        with pytest.raises(tdist.DistNetworkError):
            failing.add("text", 1)  # no error reply in torch's protocol: dropped, as torch does
    server.set("later", "ok")
    waiter.join(10)
    assert results == [b"ok"] and client.add("n", 1) == 1 and server.get("text") == b"not a number"
    assert "unknown torch TCPStore query type 99" in caplog.text and "not an integer" in caplog.text
    del client, failing


@pytest.mark.slow
@needs_torch
def test_init_process_group_gloo_through_the_pydist_server(server):
    procs = [
        start_command([sys.executable, str(SCRIPTS / "torch_allreduce.py"), "gloo", f"127.0.0.1:{server.port}"],
                      env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2"))
        for rank in range(2)
    ]
    results = [(c.stdout, c.stderr) for c in finish(procs, 120)]
    for rank, (proc, (out, err)) in enumerate(zip(procs, results)):
        assert proc.returncode == 0, err
        assert f"RESULT {rank} 2 [3.0, 3.0, 3.0, 3.0]" in out


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("backend", ["gloo", "pydist"])
def test_pydist_run_env_rendezvous_with_torch(backend):
    """torchrun-style: the agent hosts the store, workers use env:// with
    TORCHELASTIC_USE_AGENT_STORE=True and connect torch TCPStore clients to it."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    done = _run([sys.executable, "-m", "pydist.run", "--nproc-per-node", "2",
                 str(SCRIPTS / "torch_allreduce.py"), backend], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"RESULT {rank} 2 [3.0, 3.0, 3.0, 3.0]" in done.stdout
