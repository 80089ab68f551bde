"""One conformance suite for every store, then what is specific to TCPStore and FileStore."""
from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

from pydist.core.errors import DistNetworkError, DistStoreError, QueueEmptyError
from pydist.store import FileStore, HashStore, PrefixStore, Store, TCPStore
from pydist.store import tcp as tcp_module
from pydist.store._protocol import Message, encode_request, hello

SHORT = timedelta(seconds=0.2)
#: Upper bound (s) on calls that must end by their short timeout or by an event. It only has to
#: tell them apart from a call that ignores both and waits out the store's default timeout
#: (300 s) or blocks for good; a loaded machine can stall a thread for seconds, so it is generous.
NOT_HUNG = 30.0


def _socket_fds() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.exists(f"/proc/self/fd/{fd}") and "socket" in _readlink(fd))


def _readlink(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pydist-store-server")]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test must stop its server threads and close its sockets."""
    sockets = _socket_fds()
    yield
    assert _server_threads() == []
    assert _socket_fds() <= sockets


def _tcp_pair():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=SHORT)
    return TCPStore("127.0.0.1", master.port, timeout=SHORT), master


def _make_pair(kind: str, tmp_path):
    """(store under test, another handle on the same data, everything to close)."""
    if kind == "hash":
        store = HashStore()
        return store, store, [store]
    if kind == "file":
        a, b = FileStore(str(tmp_path / "store")), FileStore(tmp_path / "store")
        return a, b, [a, b]
    if kind == "tcp":
        client, master = _tcp_pair()
        return client, master, [client, master]
    base, other, owned = _make_pair(kind.removeprefix("prefix-"), tmp_path)
    return PrefixStore("pre", base), PrefixStore("pre", other), owned


KINDS = ["hash", "file", "tcp", "prefix-hash", "prefix-tcp"]
#: The suite over PrefixStore (a key prefix on the stores above, which the fast tier runs it on)
#: is slow-tier only: it would double the suite's time, most of it waiting out the short
#: timeouts. PrefixStore's own behaviour (namespaces, nesting) is tested below in either tier.
SLOW_KINDS = {"prefix-hash", "prefix-tcp"}


@pytest.fixture(params=[pytest.param(kind, marks=pytest.mark.slow) if kind in SLOW_KINDS else kind for kind in KINDS])
def pair(request, tmp_path):
    store, other, owned = _make_pair(request.param, tmp_path)
    store.set_timeout(SHORT)
    other.set_timeout(SHORT)
    yield store, other
    for s in owned:
        s.close()


@pytest.fixture
def store(pair):
    return pair[0]


def _later(seconds: float, fn, *args) -> threading.Thread:
    def run():
        time.sleep(seconds)
        fn(*args)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# -- the conformance suite ---------------------------------------------------------------
def test_set_get_str_and_bytes(pair):
    store, other = pair
    store.set("a", "text")
    store.set("b", b"\x00\xff")
    store.set("c", bytearray(b"ba"))
    store.set("empty", "")
    assert other.get("a") == b"text" and isinstance(other.get("a"), bytes)
    assert other.get("b") == b"\x00\xff"
    assert other.get("c") == b"ba"
    assert other.get("empty") == b""
    other.set("a", "replaced")
    assert store.get("a") == b"replaced"


def test_add(pair):
    store, other = pair
    assert store.add("n", 5) == 5
    assert other.add("n", -7) == -2
    assert store.get("n") == b"-2"
    assert store.add("zero", 0) == 0 and store.get("zero") == b"0"
    store.set("spaced", " 7")
    assert store.add("spaced", 3) == 10  # read as std::stoll reads it, like torch
    assert store.add("big", 2**63 - 1) == 2**63 - 1
    assert store.add("big", 1) == -(2**63)  # int64 wrap-around, like torch


def test_add_on_a_non_integer_is_a_clear_error_and_the_store_stays_usable(store):
    store.set("word", "hello")
    with pytest.raises(ValueError, match="word.*not an integer"):
        store.add("word", 1)
    assert store.get("word") == b"hello"
    assert store.add("n", 1) == 1


def test_compare_set(pair):
    store, other = pair
    assert store.compare_set("k", "", "first") == b"first"  # missing + empty expected: set
    assert other.get("k") == b"first"
    assert store.compare_set("absent", "x", "y") == b"x"  # missing + expected: not set
    assert not store.check(["absent"])
    assert store.compare_set("k", "wrong", "second") == b"first"  # mismatch: current
    assert store.compare_set("k", "first", b"second") == b"second"  # match: set
    assert other.get("k") == b"second"


def test_wait_and_check(pair):
    store, other = pair
    other.set("a", "1")
    store.wait(["a"])
    store.wait([])
    assert store.check(["a"]) and store.check([])
    assert not store.check(["a", "b"])
    started = time.monotonic()
    with pytest.raises(DistStoreError, match=r"wait timeout after 200ms, keys: (pre/)?b") as info:
        store.wait(["a", "b"])
    assert "a," not in str(info.value)  # only the missing keys are named
    assert 0.15 < time.monotonic() - started < NOT_HUNG
    with pytest.raises(DistStoreError, match=r"wait timeout after 50ms, keys: (pre/)?x, (pre/)?y"):
        store.wait(["x", "y"], timedelta(milliseconds=50))


def test_get_times_out_naming_the_key(store):
    started = time.monotonic()
    with pytest.raises(DistStoreError, match="wait timeout after 200ms, keys: (pre/)?nokey"):
        store.get("nokey")
    assert 0.15 < time.monotonic() - started < NOT_HUNG


def test_zero_timeout_does_not_wait(store):
    with pytest.raises(DistStoreError, match="after 0ms"):
        store.wait(["nokey"], timedelta(0))


@pytest.mark.parametrize(
    "writer, write, read",
    [("other", "set", "get"), ("same", "set", "get"), ("other", "queue_push", "queue_pop")],
    ids=["get", "get-same-object", "queue_pop"],
)
def test_blocking_call_released_from_another_thread(pair, writer, write, read):
    """Also from a thread sharing the same store object: no call waits behind another."""
    store, other = pair
    store.set_timeout(timedelta(seconds=NOT_HUNG))
    thread = _later(0.05, getattr(other if writer == "other" else store, write), "late", "v")
    assert getattr(store, read)("late") == b"v"  # released by the write: the timeout would raise
    thread.join()


def test_delete_key(pair):
    store, other = pair
    store.set("a", "1")
    assert other.delete_key("a") is True
    assert store.delete_key("a") is False
    assert not store.check(["a"])


def test_num_keys_and_list_keys(pair):
    store, other = pair
    assert store.num_keys() == 0 and store.list_keys() == []
    store.set("a", "1")
    other.add("b", 1)
    store.queue_push("q", "x")  # queues are neither counted nor listed
    assert store.num_keys() == 2
    assert sorted(other.list_keys()) == ["a", "b"]


def test_multi_get_and_multi_set(pair):
    store, other = pair
    store.multi_set(["a", "b"], ["1", b"2"])
    assert other.multi_get(["b", "a"]) == [b"2", b"1"]
    assert other.multi_get([]) == []
    with pytest.raises(DistStoreError, match="keys: (pre/)?c$|keys: (pre/)?c \\("):
        store.multi_get(["a", "c"])
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        store.multi_set(["a", "b"], ["1"])


def test_multi_get_waits_for_every_key(pair):
    store, other = pair
    store.set_timeout(timedelta(seconds=5))
    store.set("a", "1")
    thread = _later(0.05, other.set, "b", "2")
    assert store.multi_get(["a", "b"]) == [b"1", b"2"]
    thread.join()


def test_append(pair):
    store, other = pair
    store.append("log", "a")
    other.append("log", b"b")
    assert store.get("log") == b"ab"


def test_queues(pair):
    store, other = pair
    assert store.queue_len("q") == 0
    store.queue_push("q", "1")
    other.queue_push("q", b"2")
    assert store.queue_len("q") == 2
    assert store.check(["q"])
    store.wait(["q"])  # wait and check see queues, as in torch's HashStore
    assert other.queue_pop("q") == b"1"
    assert store.queue_pop("q", block=False) == b"2"
    with pytest.raises(QueueEmptyError, match="q"):
        store.queue_pop("q", block=False)
    with pytest.raises(DistStoreError, match="wait timeout after 200ms, keys: (pre/)?q"):
        store.queue_pop("q")
    assert not store.check(["q"])


def test_timeout_property(pair):
    store, other = pair
    assert store.timeout == SHORT
    store.set_timeout(timedelta(seconds=3))
    assert store.timeout == timedelta(seconds=3)
    with pytest.raises(ValueError, match="timeout"):
        store.set_timeout(timedelta(seconds=-1))


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda s: s.set(1, "v"), "key"),
        (lambda s: s.set("k", 1), "value"),
        (lambda s: s.get(None), "key"),
        (lambda s: s.add("k", "1"), "amount"),
        (lambda s: s.compare_set("k", 1, "v"), "expected_value"),
        (lambda s: s.wait("abc"), "keys"),
        (lambda s: s.check(["a", 2]), r"keys\[1\]"),
        (lambda s: s.multi_set(["a"], [None]), r"values\[0\]"),
        (lambda s: s.queue_push("q", object()), "value"),
        (lambda s: s.set_timeout("soon"), "timeout"),
    ],
)
def test_bad_argument_types_raise_type_error_naming_the_argument(store, call, argument):
    with pytest.raises(TypeError, match=argument):
        call(store)


def test_size_bounds_are_checked_before_anything_changes(store, monkeypatch):
    from pydist.store import _base

    monkeypatch.setattr(_base, "MAX_VALUE_BYTES", 8)
    with pytest.raises(ValueError, match="value: 9 bytes is over the limit"):
        store.set("k", b"x" * 9)
    with pytest.raises(ValueError, match="key: .* over the limit"):
        store.set("k" * (64 * 1024 + 1), b"")
    assert store.num_keys() == 0


def test_context_manager(tmp_path):
    with HashStore() as h, FileStore(tmp_path / "f") as f, TCPStore("127.0.0.1", 0, is_master=True) as t:
        with PrefixStore("p", t) as p:
            for s in (h, f, t, p):
                s.set("k", "v")
                assert s.get("k") == b"v"
    with pytest.raises(DistStoreError, match="closed"):
        t.set("k", "v")


def test_prefix_store_namespaces_like_torch():
    base = HashStore()
    a, b = PrefixStore("a", base), PrefixStore("b", base)
    a.set("k", "1")
    b.set("k", "2")
    nested = PrefixStore("c", a)
    nested.set("x", "y")
    assert base.get("a/k") == b"1" and b.get("k") == b"2" and base.get("a/c/x") == b"y"
    assert sorted(a.list_keys()) == ["c/x", "k"] and nested.list_keys() == ["x"]
    assert a.num_keys() == 3  # torch's PrefixStore counts the underlying store's keys
    assert a.underlying_store is base and isinstance(a, Store)
    a.set_timeout(timedelta(seconds=7))
    assert base.timeout == timedelta(seconds=7) == nested.timeout
    with pytest.raises(TypeError, match="store"):
        PrefixStore("p", object())


# -- against torch ------------------------------------------------------------------------
def _outcome(store: object, method: str, args: tuple) -> object:
    try:
        result = getattr(store, method)(*args)
    except Exception as e:  # compare by kind: the same names exist in torch and pydist
        kinds = [c.__name__ for c in type(e).__mro__]
        return next(k for k in ("QueueEmptyError", "DistStoreError", "ValueError") if k in kinds)
    return sorted(result) if method == "list_keys" else result


def test_semantics_match_torch_hashstore():
    dist = pytest.importorskip("torch.distributed")
    script = [
        ("set", ("a", "x")), ("get", ("a",)), ("set", ("b", b"\x00\x01")), ("get", ("b",)),
        ("add", ("c", 5)), ("add", ("c", -2)), ("get", ("c",)), ("add", ("a", 1)),
        ("set", ("sp", " 7")), ("add", ("sp", 3)), ("set", ("fl", "1.5")), ("add", ("fl", 3)),
        ("add", ("big", 2**63 - 1)), ("add", ("big", 1)),
        ("compare_set", ("m", "", "v")), ("compare_set", ("m2", "e", "v")), ("check", (["m2"],)),
        ("compare_set", ("m", "zz", "w")), ("compare_set", ("m", "v", "w")), ("get", ("m",)),
        ("compare_set", ("e", "", "")), ("check", (["e"],)),
        ("get", ("nokey",)), ("wait", (["nokey", "a"],)), ("check", (["a", "c"],)), ("check", (["a", "z"],)),
        ("num_keys", ()), ("delete_key", ("a",)), ("delete_key", ("a",)), ("num_keys", ()),
        ("multi_set", (["p", "q"], ["1", b"2"])), ("multi_get", (["p", "q"],)), ("multi_get", (["p", "zz"],)),
        ("append", ("ap", "x")), ("append", ("ap", b"y")), ("get", ("ap",)),
        ("queue_push", ("qq", "1")), ("queue_push", ("qq", "2")), ("queue_len", ("qq",)), ("check", (["qq"],)),
        ("wait", (["qq"],)), ("get", ("qq",)), ("delete_key", ("qq",)), ("num_keys", ()),
        ("queue_pop", ("qq",)), ("queue_pop", ("qq", False)), ("queue_pop", ("qq", False)),
        ("queue_pop", ("qq",)), ("queue_len", ("qq",)), ("check", (["qq"],)), ("queue_len", ("nope",)),
        ("set", ("k", "v")), ("queue_pop", ("k", False)), ("queue_len", ("k",)), ("list_keys", ()),
    ]
    theirs, ours = dist.HashStore(), HashStore()
    theirs.set_timeout(timedelta(milliseconds=50))
    ours.set_timeout(timedelta(milliseconds=50))
    for method, args in script:
        assert _outcome(ours, method, args) == _outcome(theirs, method, args), (method, args)


# -- TCPStore -----------------------------------------------------------------------------
@pytest.fixture
def master():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5)) as store:
        yield store


def _raw_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(hello())
    assert sock.recv(6) == hello()
    return sock


@pytest.mark.parametrize(
    "payload",
    [b"GET / HTTP/1.1\r\n\r\n", hello() + b"\xfa\x00\x00\x00\x00", hello() + struct.pack("<BI", 1, 0xFFFFFFFF)],
    ids=["http", "opcode", "huge-length"],
)
def test_garbage_client_is_dropped_without_disturbing_others(master, caplog, payload):
    other = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=5))
    master.set("kept", "yes")
    waiter = threading.Thread(target=lambda: results.append(other.get("later")))
    results: list[bytes] = []
    waiter.start()  # a parked blocking request must survive the garbage
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        with socket.create_connection(("127.0.0.1", master.port), timeout=5) as bad:
            bad.sendall(payload)
            bad.settimeout(5)
            while bad.recv(4096):  # the server closes the connection
                pass
    master.set("later", "ok")
    waiter.join(5)
    assert results == [b"ok"]
    assert master.get("kept") == b"yes" and other.add("n", 1) == 1
    assert "dropping client" in caplog.text
    other.close()


def test_client_disconnecting_mid_message_is_dropped(master, caplog):
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        sock = _raw_client(master.port)
        sock.sendall(encode_request(Message("set", ("k", b"v" * 100)))[:20])
        sock.close()
        deadline = time.monotonic() + 5
        while "middle of a message" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "middle of a message" in caplog.text
    assert not master.check(["k"])
    master.set("k", "fine")
    assert master.get("k") == b"fine"


def test_server_closing_raises_a_clear_network_error():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    client = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=5))
    client.set("k", "v")
    client.set_timeout(timedelta(seconds=10 * NOT_HUNG))  # the blocked get's: only the close can end it in time
    blocked: list[BaseException] = []

    def blocked_get():
        try:
            client.get("never")
        except BaseException as e:
            blocked.append(e)

    thread = threading.Thread(target=blocked_get)
    thread.start()
    time.sleep(0.1)
    master.close()
    thread.join(NOT_HUNG)
    assert not thread.is_alive(), "the server's close did not wake the blocked get"
    where = f"127.0.0.1:{master.port}"
    assert (isinstance(blocked[0], DistNetworkError)
            and f"store server at {where} closed the connection" in str(blocked[0]))
    with pytest.raises(DistNetworkError, match=where):
        client.set("k", "v2")
    client.close()


def test_a_silent_server_does_not_hang_a_call(monkeypatch):
    """A server that accepts and greets but never answers: the safety deadline fires."""
    monkeypatch.setattr(tcp_module, "SAFETY_MARGIN_S", 0.1)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def greet():
            conn, _ = listener.accept()
            conn.sendall(hello())
            done.wait(5)
            conn.close()

        done = threading.Event()
        thread = threading.Thread(target=greet)
        thread.start()
        client = TCPStore("127.0.0.1", listener.getsockname()[1], timeout=SHORT)
        started = time.monotonic()
        with pytest.raises(DistNetworkError, match="did not answer set"):
            client.set("k", "v")
        assert time.monotonic() - started < NOT_HUNG
        client.close()
        done.set()
        thread.join()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def test_client_retries_until_the_server_appears():
    port = _free_port()
    clients: list[TCPStore] = []
    thread = threading.Thread(target=lambda: clients.append(TCPStore("127.0.0.1", port, timeout=timedelta(seconds=5))))
    thread.start()
    time.sleep(0.3)
    with TCPStore("127.0.0.1", port, is_master=True) as master:
        thread.join(5)
        clients[0].set("k", "v")
        assert master.get("k") == b"v"
        clients[0].close()


def test_connect_timeout_names_the_address():
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(DistNetworkError, match=rf"127.0.0.1:{port} \(tried for 0.[2-9]s\)"):
        TCPStore("127.0.0.1", port, timeout=timedelta(seconds=0.3))
    assert time.monotonic() - started < NOT_HUNG


def test_wait_for_workers():
    port = _free_port()
    worker = threading.Thread(
        target=lambda: TCPStore("127.0.0.1", port, world_size=2, timeout=timedelta(seconds=5)).close())
    worker.start()
    with TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=timedelta(seconds=5)) as master:
        worker.join(5)
        assert master.num_keys() == 0 and master.list_keys() == []  # bookkeeping stays hidden


def test_wait_for_workers_timeout_says_how_many_arrived():
    started = time.monotonic()
    with pytest.raises(DistStoreError, match="only 1 of 3 workers connected"):
        TCPStore("127.0.0.1", 0, world_size=3, is_master=True, timeout=timedelta(seconds=0.3))
    assert time.monotonic() - started < NOT_HUNG


def test_multi_tenant_masters_share_one_server():
    first = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)
    second = TCPStore("127.0.0.1", first.port, is_master=True, multi_tenant=True)
    first.set("k", "v")
    assert second.get("k") == b"v"
    first.close()
    second.set("k2", "v2")  # the server lives while one tenant remains
    assert second.get("k2") == b"v2"
    second.close()
    assert _server_threads() == []


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(host_name=1, port=1), TypeError, "host_name"),
        (dict(host_name="127.0.0.1", port="1"), TypeError, "port"),
        (dict(host_name="127.0.0.1", port=0), ValueError, "port"),
        (dict(host_name="127.0.0.1", port=1, world_size=0), ValueError, "world_size"),
        (dict(host_name="127.0.0.1", port=1, timeout=None), ValueError, "timeout"),
    ],
)
def test_tcpstore_constructor_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        TCPStore(**kwargs)


def test_client_address_and_bind_address(master):
    assert master.client_address() == "127.0.0.1"
    assert master.host == "127.0.0.1" and master.port > 0
    assert master._server._listener.getsockname()[0] == "127.0.0.1"  # not every interface
    with pytest.raises(DistNetworkError, match="cannot listen"):
        TCPStore("127.0.0.1", master.port, is_master=True)
    with TCPStore("localhost", 0, is_master=True) as local:
        assert local._server._listener.getsockname()[0] == "127.0.0.1"
        assert local.client_address() == "127.0.0.1"


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        store = TCPStore("::1", 0, is_master=True, timeout=SHORT)
    except DistNetworkError:
        pytest.skip("no IPv6 loopback")
    with store:
        store.set("k", "v")
        assert store.get("k") == b"v" and store.client_address() == "::1"


# -- FileStore ----------------------------------------------------------------------------
def _file_child(path: str) -> None:
    store = FileStore(path)
    store.set_timeout(timedelta(seconds=10))
    store.wait(["parent"])
    store.set("child", b"hi")
    for _ in range(50):
        store.add("counter", 1)
    store.queue_push("q", "from child")
    store.close()


@pytest.mark.slow
def test_filestore_across_processes(tmp_path):
    path = str(tmp_path / "shared")
    store = FileStore(path)
    store.set_timeout(timedelta(seconds=10))
    child = multiprocessing.get_context("spawn").Process(target=_file_child, args=(path,))
    child.start()
    store.set("parent", "1")
    for _ in range(50):
        store.add("counter", 1)
    assert store.queue_pop("q") == b"from child"
    assert store.get("child") == b"hi"
    child.join(20)
    assert child.exitcode == 0
    assert store.get("counter") == b"100"
    store.close()


def test_filestore_deletes_the_file_after_world_size_closes(tmp_path):
    path = tmp_path / "job"
    a, b = FileStore(path, world_size=2), FileStore(path, world_size=2)
    a.set("k", "v")
    a.close()
    assert path.exists() and b.get("k") == b"v"
    b.close()
    assert not path.exists()
    with FileStore(path) as unbounded:  # world_size unknown: the file stays
        assert unbounded.num_keys() == 0
    assert path.exists()


def test_filestore_whose_file_was_deleted_says_so(tmp_path):
    store = FileStore(tmp_path / "gone")
    os.unlink(tmp_path / "gone")
    with pytest.raises(DistStoreError, match="gone was deleted"):
        store.set("k", "v")
    store.close()
    with FileStore(tmp_path / "gone") as fresh:  # a new instance starts a new file
        fresh.set("k", "v")


def test_filestore_state_never_disagrees_with_the_file(tmp_path, monkeypatch):
    from pydist.store import _protocol

    with FileStore(tmp_path / "f") as store:
        store.set("a", "1")
        monkeypatch.setattr(_protocol, "MAX_VALUE_BYTES", 4)  # records over 4 bytes cannot be written
        with pytest.raises(ValueError, match="over the limit"):
            store.append("a", "2345")
        monkeypatch.undo()
        assert store.get("a") == b"1" and store.list_keys() == ["a"]


def test_filestore_accepts_an_empty_file_and_refuses_a_foreign_one(tmp_path):
    empty = tmp_path / "empty"
    empty.touch()
    with FileStore(empty) as store:
        store.set("k", "v")
        assert store.get("k") == b"v"
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"not a store log")
    with pytest.raises(DistStoreError, match="foreign"):
        FileStore(foreign)
