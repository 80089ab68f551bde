"""Model-based fuzz of the store server: a rule-based state machine drives good pydist and
torch connections with random valid requests (blocking ones included, answered or timed
out as time is advanced) next to garbage connections, and every answer is compared with a
dict model. Helpers and strategies: tests/store_fuzz.py; long runs: tests/test_robustness_soak.py.
"""
from __future__ import annotations

import re
from collections import deque

import pytest

pytest.importorskip("hypothesis", reason="the store fuzz needs hypothesis (test extras)")
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from store_fuzz import (  # noqa: E402
    _I64,
    _TORCH_VALIDATE,
    COUNTS,
    DATA_KEYS,
    QUEUE_KEYS,
    _chunks,
    _fuzz_settings,
    _Loop,
    _report,
    garbage_stream,
)

from pydist.store._protocol import REQUESTS, Message, ResponseParser, encode_request, hello  # noqa: E402
from pydist.store._state import INTERNAL_PREFIX  # noqa: E402
from pydist.store._torch_protocol import QUERIES, TorchReplyParser, encode_reply  # noqa: E402
from pydist.store._torch_protocol import encode_request as torch_request
from pydist.store._torch_service import wire_key  # noqa: E402

# =============================================================================================
# 1b. Model-based: good pydist and torch connections, random valid requests, next to garbage
# =============================================================================================
_VALUES = st.sampled_from([b"", b"1", b"-7", b" 42", b"+3x", b"abc", b"9223372036854775807",
                           b"-9223372036854775808", b"\x00\xff"]) | st.binary(max_size=6)
_AMOUNTS = st.integers(-3, 3) | _I64
_TIMEOUTS = st.sampled_from([-1, 0, 10, 250, 1000, 60_000])
_POSITIVE_TIMEOUTS = st.sampled_from([10, 250, 1000, 60_000])
_STOLL = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_WIRE_DATA = tuple("/" + k for k in DATA_KEYS)
_WIRE_QUEUES = tuple("/" + k for k in QUEUE_KEYS)
_NOT_READY = object()
_DROP = object()


def _wrap(v: int) -> int:
    return (v + (1 << 63)) % (1 << 64) - (1 << 63)


def _msg(name: str, *fields: st.SearchStrategy) -> st.SearchStrategy[Message]:
    return st.tuples(*fields).map(lambda args: Message(name, args))


def pydist_requests() -> st.SearchStrategy[Message]:
    data, queue = st.sampled_from(DATA_KEYS), st.sampled_from(QUEUE_KEYS)
    keys = st.lists(data, max_size=3)
    pairs = st.lists(st.tuples(data, _VALUES), max_size=3)
    return st.one_of(
        _msg("set", data, _VALUES), _msg("add", data, _AMOUNTS), _msg("compare_set", data, _VALUES, _VALUES),
        _msg("append", data, _VALUES), _msg("delete_key", data),
        pairs.map(lambda kv: Message("multi_set", ([k for k, _ in kv], [v for _, v in kv]))),
        _msg("multi_set", keys, st.lists(_VALUES, max_size=3)),  # lengths may differ: an error answer
        _msg("check", st.lists(st.sampled_from(DATA_KEYS + QUEUE_KEYS), max_size=3)),
        _msg("num_keys"), _msg("list_keys"), _msg("queue_push", queue, _VALUES), _msg("queue_len", queue),
        _msg("multi_get", keys, _TIMEOUTS), _msg("wait", keys, _TIMEOUTS), _msg("queue_pop", queue, _TIMEOUTS))


def torch_requests() -> st.SearchStrategy[Message]:
    data, queue = st.sampled_from(_WIRE_DATA), st.sampled_from(_WIRE_QUEUES)
    keys = st.lists(data, max_size=3)
    return st.one_of(
        _msg("set", data, _VALUES), _msg("compare_set", data, _VALUES, _VALUES), _msg("get", data),
        _msg("add", data, _AMOUNTS), _msg("check", st.lists(st.sampled_from(_WIRE_DATA + _WIRE_QUEUES), max_size=3)),
        _msg("wait", keys), _msg("num_keys"), _msg("delete_key", data), _msg("append", data, _VALUES),
        _msg("multi_get", keys),
        st.lists(st.tuples(data, _VALUES), max_size=3).map(
            lambda kv: Message("multi_set", ([k for k, _ in kv], [v for _, v in kv]))),
        _msg("ping", st.integers(0, (1 << 32) - 1)), _msg("queue_push", queue, _VALUES), _msg("queue_pop", queue),
        _msg("queue_len", queue), _msg("list_keys"))


class KVModel:
    """The store as clients see it (torch HashStore's semantics): values and FIFO queues."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.queues: dict[str, deque[bytes]] = {k: deque() for k in QUEUE_KEYS}

    def exists(self, key: str) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def add(self, key: str, amount: int) -> int:
        """Raises ValueError if the value is not an integer (read like C's stoll) in int64."""
        current = self.data.get(key)
        number = 0
        if current is not None:
            match = _STOLL.match(current)
            if match is None or int(match.group(1)) != _wrap(int(match.group(1))):
                raise ValueError(key)
            number = int(match.group(1))
        self.data[key] = str(_wrap(number + amount)).encode()
        return _wrap(number + amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.data.get(key)
        if (current is None and not expected) or (current is not None and current == expected):
            self.data[key] = desired
            return desired
        return expected if current is None else current

    def missing(self, name: str, keys: list[str]) -> list[str]:
        """The keys a blocking request still waits for (in its order)."""
        if name == "multi_get":
            return [k for k in keys if k not in self.data]
        if name == "queue_pop":
            return [] if self.queues[keys[0]] else list(keys)
        return [k for k in keys if not self.exists(k)]

    def pydist(self, msg: Message, extra_keys: int) -> Message | object:
        """A pydist request's answer (errors as ("error", (code,))), or _NOT_READY."""
        name, a = msg
        if name in ("multi_get", "wait", "queue_pop"):
            keys = [a[0]] if name == "queue_pop" else a[0]
            if self.missing(name, keys):
                return _NOT_READY
            if name == "multi_get":
                return Message("values", ([self.data[k] for k in keys],))
            return Message("bytes", (self.queues[a[0]].popleft(),)) if name == "queue_pop" else Message("ok", ())
        if name == "add":
            try:
                return Message("int", (self.add(*a),))
            except ValueError:
                return Message("error", (1,))
        if name == "multi_set" and len(a[0]) != len(a[1]):
            return Message("error", (1,))
        simple = self._common(name, a, extra_keys)
        kind = REQUESTS[name].result
        if kind == "ok":
            return Message("ok", ())
        if kind == "int":
            return Message("int", (int(simple),))
        return Message(kind, (simple,))

    def torch(self, msg: Message, extra_keys: int) -> object:
        """A torch query's result as encode_reply takes it; None: no reply; _NOT_READY; _DROP."""
        name, a = msg
        local = lambda wire: wire[1:]  # noqa: E731 - "/k0" is state key "k0"
        if name == "get":
            return self.data.get(local(a[0]), b"")
        if name == "multi_get":
            return [self.data.get(local(k), b"") for k in a[0]]
        if name == "wait":
            return _NOT_READY if self.missing("wait", [local(k) for k in a[0]]) else 0
        if name == "ping":
            return a[0]
        if name == "queue_pop":
            queue = self.queues[local(a[0])]
            return (len(queue), queue.popleft() if queue else None)
        if name == "add":
            try:
                return self.add(local(a[0]), a[1])
            except ValueError:
                return _DROP
        args = ([local(k) for k in a[0]], a[1]) if name == "multi_set" else \
            ([local(k) for k in a[0]],) if name == "check" else (local(a[0]), *a[1:]) if a else ()
        result = self._common(name, args, extra_keys)
        if name == "list_keys":
            return ["/" + k for k in result]
        return None if QUERIES[name].reply == "none" else result

    def _common(self, name: str, a: tuple, extra_keys: int):
        if name == "set":
            self.data[a[0]] = a[1]
        elif name == "compare_set":
            return self.compare_set(*a)
        elif name == "append":
            self.data[a[0]] = self.data.get(a[0], b"") + a[1]
        elif name == "delete_key":
            return int(self.data.pop(a[0], None) is not None)
        elif name == "multi_set":
            self.data.update(zip(a[0], a[1]))
        elif name == "check":
            return all(self.exists(k) for k in a[0])
        elif name == "num_keys":
            return len(self.data) + extra_keys
        elif name == "list_keys":
            return sorted(self.data)
        elif name == "queue_push":
            self.queues[a[0]].append(a[1])
        elif name == "queue_len":
            return len(self.queues[a[0]])
        else:
            raise AssertionError(name)
        return None


class _Good:
    """A well-behaved client connection: one request at a time; the answers it expects."""

    def __init__(self, cid: int, kind: str):
        self.cid, self.kind = cid, kind
        self.parser = ResponseParser() if kind == "pydist" else TorchReplyParser()
        self.expected: deque = deque()
        self.waiter: _Waiter | None = None
        self.expect_drop = False


class _Waiter:
    def __init__(self, conn: _Good, msg: Message, deadline: float | None):
        self.conn, self.msg, self.deadline = conn, msg, deadline


def _normal(msg: Message) -> Message:
    """An answer as the model states it: error text and listed non-model keys ignored."""
    if msg.name == "error":
        return Message("error", (msg.args[0],))
    if msg.name == "strs":
        return Message("strs", (sorted(k for k in msg.args[0] if k in DATA_KEYS),))
    return msg


class StoreMachine(RuleBasedStateMachine):
    """Good pydist and torch connections send random valid requests (one outstanding each,
    as real clients do), split at random points; garbage connections send random and
    mutated streams in between; time advances so blocking requests time out. Every answer
    is checked against :class:`KVModel`, and the server's state for the model's keys must
    equal the model after every step."""

    def __init__(self) -> None:
        super().__init__()
        COUNTS["machine:examples"] += 1
        self.loop = _Loop()
        self.model = KVModel()
        self.cids = iter(range(1_000_000))
        self.good: dict[int, _Good] = {}
        self.waiters: list[_Waiter] = []
        self.garbage: list[int | None] = [None, None, None]

    # -- helpers ----------------------------------------------------------------------------
    def _open(self, kind: str) -> _Good:
        conn = _Good(next(self.cids), kind)
        self.good[conn.cid] = conn
        self.loop.open(conn.cid)
        self.loop.feed(conn.cid, hello() if kind == "pydist" else _TORCH_VALIDATE)
        return conn

    def _extra(self, kind: str) -> int:
        """Keys garbage connections created, as ``kind``'s num_keys counts them."""
        keys = self.loop.service.state.data
        if kind == "pydist":
            return sum(1 for k in keys if k not in DATA_KEYS and not k.startswith(INTERNAL_PREFIX))
        return sum(1 for k in keys if k not in DATA_KEYS and wire_key(k) is not None)

    def _send(self, conn: _Good, data: bytes, draw) -> None:
        for chunk in _chunks(draw, data):
            self.loop.feed(conn.cid, chunk)

    def _expect(self, conn: _Good, request: Message, result) -> None:
        if conn.kind == "pydist":
            conn.expected.append(result)
        elif encode_reply(request.name, result):  # a zero-byte reply (multi_get of no keys): nothing to read
            conn.parser.expect(request)
            conn.expected.append(result)

    def _settle(self) -> None:
        """Answer the parked requests that are ready now, oldest first (the server re-runs
        them on every change of a key they wait for)."""
        for waiter in list(self.waiters):
            conn, (name, a) = waiter.conn, waiter.msg
            if conn.kind == "pydist":
                result = self.model.pydist(Message(name, a[:-1]), 0)
            else:
                result = self.model.torch(waiter.msg, 0)
            if result is not _NOT_READY:
                COUNTS[f"machine:woken-{name}"] += 1
                self.waiters.remove(waiter)
                conn.waiter = None
                self._expect(conn, waiter.msg, result)

    def _park(self, conn: _Good, msg: Message, deadline: float | None) -> None:
        COUNTS["machine:parked"] += 1
        conn.waiter = _Waiter(conn, msg, deadline)
        self.waiters.append(conn.waiter)

    def _forget(self, conn: _Good) -> None:
        if conn.waiter is not None:
            self.waiters.remove(conn.waiter)
        del self.good[conn.cid]

    def _check_outputs(self) -> None:
        COUNTS["machine:steps"] += 1
        for cid, reason in list(self.loop.dropped.items()):
            conn = self.good.get(cid)
            if conn is not None:
                assert conn.expect_drop, f"good {conn.kind} connection {cid} dropped: {reason}"
                self._forget(conn)
                self._open(conn.kind)
        for conn in self.good.values():
            assert not conn.expect_drop, f"connection {conn.cid} should have been dropped"
            conn.parser.feed(bytes(self.loop.output.pop(conn.cid, b"")))
            while conn.expected:
                got = conn.parser.next()
                assert got is not None, f"{conn.kind} connection {conn.cid}: missing answer {conn.expected[0]!r}"
                want = conn.expected.popleft()
                if conn.kind == "pydist":
                    assert _normal(got) == want
                else:
                    result = got.args[0]
                    if got.name == "list_keys":
                        result = sorted(k for k in result if k in _WIRE_DATA)
                    assert result == want, f"torch {got.name}: got {result!r}, expected {want!r}"
            assert conn.parser.next() is None and conn.parser.pending == 0, f"unexpected bytes for {conn.cid}"
        self.loop.dropped.clear()

    # -- rules --------------------------------------------------------------------------------
    @initialize()
    def connect(self) -> None:
        for kind in ("pydist", "pydist", "pydist", "torch"):
            self._open(kind)
        self._check_outputs()

    def _idle(self, kind: str) -> list[_Good]:
        return [c for c in self.good.values() if c.kind == kind and c.waiter is None]

    def _pydist(self, conn: _Good, msg: Message, draw) -> None:
        """``conn`` sends pydist request ``msg``; the model says what it must get back."""
        COUNTS["machine:pydist-requests"] += 1
        result = self.model.pydist(Message(msg.name, msg.args[:-1]) if REQUESTS[msg.name].blocking else msg,
                                   self._extra("pydist"))
        if result is _NOT_READY:
            timeout_ms = msg.args[-1]
            if timeout_ms <= 0:
                keys = [msg.args[0]] if msg.name == "queue_pop" else msg.args[0]
                result = Message("timeout", (self.model.missing(msg.name, keys), 0))
            else:
                self._park(conn, msg, self.loop.now + timeout_ms / 1000)
        if result is not _NOT_READY:
            self._expect(conn, msg, _normal(result) if result.name == "strs" else result)
        self._send(conn, encode_request(msg), draw)
        self._settle()
        self._check_outputs()

    def _torch(self, conn: _Good, msg: Message, draw) -> None:
        """``conn`` sends torch query ``msg``; the model says what it must get back."""
        COUNTS["machine:torch-queries"] += 1
        result = self.model.torch(msg, self._extra("torch"))
        if result is _DROP:
            COUNTS["machine:torch-add-error-drop"] += 1
            conn.expect_drop = True
        elif result is _NOT_READY:
            self._park(conn, msg, None)
        else:
            self._expect(conn, msg, result)
        self._send(conn, torch_request(msg), draw)
        self._settle()
        self._check_outputs()

    @precondition(lambda self: self._idle("pydist"))
    @rule(data=st.data(), msg=pydist_requests())
    def pydist_request(self, data, msg: Message) -> None:
        self._pydist(data.draw(st.sampled_from(self._idle("pydist"))), msg, data.draw)

    @precondition(lambda self: self._idle("pydist"))
    @rule(data=st.data(), msg=st.one_of(
        _msg("multi_get", st.lists(st.sampled_from(DATA_KEYS), min_size=1, max_size=3), _POSITIVE_TIMEOUTS),
        _msg("wait", st.lists(st.sampled_from(DATA_KEYS), min_size=1, max_size=3), _POSITIVE_TIMEOUTS),
        _msg("queue_pop", st.sampled_from(QUEUE_KEYS), _POSITIVE_TIMEOUTS)))
    def pydist_blocking_request(self, data, msg: Message) -> None:
        """A blocking request with a timeout (they park when their keys are missing)."""
        self._pydist(data.draw(st.sampled_from(self._idle("pydist"))), msg, data.draw)

    @precondition(lambda self: self._idle("torch"))
    @rule(data=st.data(), msg=torch_requests())
    def torch_query(self, data, msg: Message) -> None:
        self._torch(data.draw(st.sampled_from(self._idle("torch"))), msg, data.draw)

    @precondition(lambda self: self.waiters and (self._idle("pydist") or self._idle("torch")))
    @rule(data=st.data(), value=_VALUES)
    def satisfy_a_waiter(self, data, value: bytes) -> None:
        """An idle client writes one key a parked request waits for (so wake-ups are common)."""
        waiter = data.draw(st.sampled_from(self.waiters))
        name, args = waiter.msg
        if waiter.conn.kind == "torch":
            missing = self.model.missing("wait", [k[1:] for k in args[0]])
        else:
            missing = self.model.missing(name, [args[0]] if name == "queue_pop" else args[0])
        key = data.draw(st.sampled_from(missing))
        conn = data.draw(st.sampled_from(self._idle("pydist") + self._idle("torch")))
        op = "queue_push" if key in QUEUE_KEYS else "set"
        if conn.kind == "pydist":
            self._pydist(conn, Message(op, (key, value)), data.draw)
        else:
            self._torch(conn, Message(op, ("/" + key, value)), data.draw)

    @precondition(lambda self: any(c.kind == "torch" for c in self.good.values()))
    @rule(data=st.data())
    def torch_cancel_wait(self, data) -> None:
        """What a torch client does when its own wait timeout passes."""
        conn = data.draw(st.sampled_from([c for c in self.good.values() if c.kind == "torch"]))
        if conn.waiter is not None:
            COUNTS["machine:canceled"] += 1
            self.waiters.remove(conn.waiter)
            conn.waiter = None
        msg = Message("cancel_wait", ())
        self._expect(conn, msg, 1)
        self._send(conn, torch_request(msg), data.draw)
        self._check_outputs()

    @rule(seconds=st.sampled_from([0.001, 0.01, 0.1, 0.3, 1.0, 5.0, 100.0]))
    def advance_time(self, seconds: float) -> None:
        self.loop.advance(seconds)
        for waiter in list(self.waiters):
            if waiter.deadline is not None and waiter.deadline <= self.loop.now:
                COUNTS["machine:timed-out"] += 1
                self.waiters.remove(waiter)
                waiter.conn.waiter = None
                name, a = waiter.msg
                keys = [a[0]] if name == "queue_pop" else a[0]
                self._expect(waiter.conn, waiter.msg, Message("timeout", (self.model.missing(name, keys), a[-1])))
        self._check_outputs()

    @rule(data=st.data(), what=st.sampled_from(["nothing"] * 3 + ["disconnect", "disconnect-mid", "corrupt"]))
    def misbehave(self, data, what: str) -> None:
        """Now and then a good client goes away (maybe in the middle of a request, which
        must not apply) or sends a malformed request (it alone is dropped)."""
        if what == "corrupt":
            idle = self._idle("pydist") + self._idle("torch")
            if not idle:
                return
            conn = data.draw(st.sampled_from(idle))
            conn.expect_drop = True
            COUNTS["machine:good-corrupted"] += 1
            self.loop.feed(conn.cid, data.draw(st.sampled_from([b"\x00", b"\xf0", b"\x63"]) if conn.kind == "pydist"
                                               else st.sampled_from([b"\x13", b"\xf0", b"\xff"])))
        elif what.startswith("disconnect"):
            conn = data.draw(st.sampled_from(sorted(self.good.values(), key=lambda c: c.cid)))
            request = encode_request(Message("set", ("k0", b"half"))) if conn.kind == "pydist" else \
                torch_request(Message("set", ("/k0", b"half")))
            cut = data.draw(st.integers(1, len(request) - 1)) if what == "disconnect-mid" else 0
            if cut:
                COUNTS["machine:closed-mid-message"] += 1
                self.loop.feed(conn.cid, request[:cut])
            COUNTS["machine:closed-while-parked"] += conn.waiter is not None
            assert self.loop.close(conn.cid) == bool(cut)
            self.loop.output.pop(conn.cid, None)
            self._forget(conn)
            self._open(conn.kind)
        self._check_outputs()

    @rule(data=st.data(), slot=st.integers(0, 2), stream=garbage_stream(), close=st.booleans())
    def garbage(self, data, slot: int, stream: bytes, close: bool) -> None:
        cid = self.garbage[slot]
        if cid is None or cid in self.loop.dropped:
            cid = self.garbage[slot] = next(self.cids)
            self.loop.open(cid)
        COUNTS["machine:bytes"] += len(stream)
        COUNTS["machine:garbage-streams"] += 1
        for chunk in _chunks(data.draw, stream):
            self.loop.feed(cid, chunk)
        COUNTS["machine:garbage-dropped"] += cid in self.loop.dropped
        if close or cid in self.loop.dropped:
            if cid not in self.loop.dropped:
                self.loop.close(cid)
            self.loop.dropped.pop(cid, None)
            self.loop.output.pop(cid, None)
            self.garbage[slot] = None
        self._check_outputs()

    @invariant()
    def state_matches_model(self) -> None:
        state = self.loop.service.state
        assert {k: v for k, v in state.data.items() if k in DATA_KEYS} == self.model.data
        for key in QUEUE_KEYS:
            assert list(state.queues.get(key, ())) == list(self.model.queues[key])
        assert key not in state.data


@pytest.mark.slow
def test_store_service_against_a_model_with_garbage_connections():
    before = COUNTS.copy()
    run_state_machine_as_test(StoreMachine, settings=_fuzz_settings(80, stateful_step_count=60))
    _report("machine", before)
