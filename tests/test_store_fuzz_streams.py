"""The sans-IO store server (``StoreService``) fuzzed with hypothesis: random and mutated byte
streams on many connections never make it raise; streams that are malformed for sure are
dropped; with a token, garbage and replayed handshakes can neither read nor write a key.
Helpers and strategies: tests/store_fuzz.py; long runs: tests/test_robustness_soak.py.
"""
from __future__ import annotations

import struct

import pytest

pytest.importorskip("hypothesis", reason="the store fuzz needs hypothesis (test extras)")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st
from store_fuzz import (  # noqa: E402
    _TORCH_VALIDATE,
    COUNTS,
    _chunks,
    _fuzz_settings,
    _Loop,
    _pydist_garbage_requests,
    _report,
    garbage_stream,
)

from pydist.store import _protocol  # noqa: E402
from pydist.store._auth_opening import ClientOpening  # noqa: E402
from pydist.store._protocol import (  # noqa: E402
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    REQUESTS,
    Message,
    ResponseParser,
    auth_hello,
    encode_request,
    hello,
)
from pydist.store._service import StoreService  # noqa: E402
from pydist.store._torch_protocol import MAX_KEY_COUNT, QUERIES, VALIDATION_MAGIC  # noqa: E402


@given(st.data())
def _random_streams(data):
    """Several garbage connections, interleaved chunk by chunk with one good pydist client
    whose requests must all be answered right."""
    COUNTS["random-streams:examples"] += 1
    loop = _Loop()
    streams = data.draw(st.lists(garbage_stream(), min_size=1, max_size=6))
    pieces = [(cid, chunk) for cid, stream in enumerate(streams, start=1) for chunk in _chunks(data.draw, stream)]
    good = 0
    loop.open(good)
    script = [Message("set", ("k0", b"v")), Message("add", ("k1", 5)), Message("multi_get", (["k0", "k1"], 0)),
              Message("queue_push", ("q0", b"x")), Message("queue_pop", ("q0", 0)), Message("check", (["k0", "q0"],))]
    good_bytes = [hello()] + [encode_request(m) for m in script]
    for cid in range(1, len(streams) + 1):
        loop.open(cid)
    order = data.draw(st.permutations(pieces + [(good, b) for b in good_bytes]))
    # the good client's own bytes must stay in order: re-sort them among their slots
    good_slots = [i for i, (cid, _) in enumerate(order) if cid == good]
    order = list(order)
    for slot, chunk in zip(good_slots, good_bytes):
        order[slot] = (good, chunk)
    for cid, chunk in order:
        COUNTS["random-streams:steps"] += 1
        COUNTS["random-streams:bytes"] += len(chunk)
        loop.feed(cid, chunk)
        if data.draw(st.booleans(), label="advance"):
            loop.advance(data.draw(st.floats(0, 2)))
    for cid in range(1, len(streams) + 1):
        if cid not in loop.dropped:
            loop.close(cid)
    assert good not in loop.dropped
    parser = ResponseParser()
    parser.feed(bytes(loop.output[good]))
    answers = []
    while (msg := parser.next()) is not None:
        answers.append(msg)
    assert answers == [Message("ok", ()), Message("int", (5,)), Message("values", ([b"v", b"5"],)),
                       Message("ok", ()), Message("bytes", (b"x",)), Message("int", (0,))]
    assert loop.service.state.data.get("k0") == b"v" and loop.service.state.data.get("k1") == b"5"


@pytest.mark.slow
def test_service_never_raises_on_random_and_mutated_streams():
    before = COUNTS.copy()
    _fuzz_settings(150)(_random_streams)()
    _report("random-streams", before)


def _malformed_pydist() -> st.SearchStrategy[bytes]:
    """pydist streams that are malformed for sure, whatever follows them."""
    set_code = REQUESTS["set"].code
    framed = lambda code, body: struct.pack("<BI", code, len(body)) + body  # noqa: E731
    valid_codes = {op.code for op in REQUESTS.values()}
    return st.one_of(
        st.binary(min_size=1, max_size=3).filter(lambda b: b[:1] not in (b"P", b"\x00")),
        st.sampled_from([b"PX", b"PDX", b"PDSX"]),
        st.integers(0, 0xFFFF).filter(lambda v: v != _protocol.VERSION).map(lambda v: b"PDST" + struct.pack("<H", v)),
        st.integers(0, 255).filter(lambda c: c not in valid_codes).map(lambda c: hello() + bytes([c])),
        st.integers(MAX_MESSAGE_BYTES + 1, 0xFFFFFFFF).map(lambda n: hello() + struct.pack("<BI", set_code, n)),
        st.integers(MAX_KEY_BYTES + 1, 0xFFFFFFFF).map(
            lambda n: hello() + framed(set_code, struct.pack("<I", n) + b"\0" * 8)),
        st.binary(min_size=1, max_size=8).map(lambda b: hello() + framed(REQUESTS["num_keys"].code, b)),
        st.just(hello() + framed(REQUESTS["delete_key"].code, struct.pack("<I", 2) + b"\xff\xfe")),
        st.integers(1, 20).map(lambda n: hello() + framed(set_code, struct.pack("<I", n + 4) + b"a" * n)),
    )


def _malformed_torch() -> st.SearchStrategy[bytes]:
    """torch streams that are malformed for sure."""
    codes = {q.code for q in QUERIES.values()}
    return st.one_of(
        st.integers(0, (1 << 32) - 1).filter(lambda m: m != VALIDATION_MAGIC).map(
            lambda m: b"\x00" + struct.pack("<I", m)),
        st.integers(0, 255).filter(lambda c: c not in codes).map(lambda c: _TORCH_VALIDATE + bytes([c])),
        st.sampled_from(["get", "set", "add", "delete_key", "queue_push"]).map(
            lambda name: _TORCH_VALIDATE + bytes([QUERIES[name].code]) + struct.pack("<Q", MAX_KEY_BYTES + 1)),
        st.integers(MAX_KEY_COUNT + 1, (1 << 64) - 1).map(
            lambda n: _TORCH_VALIDATE + bytes([QUERIES["check"].code]) + struct.pack("<Q", n)),
        st.just(_TORCH_VALIDATE + bytes([QUERIES["get"].code]) + struct.pack("<Q", 2) + b"\xff\xfe"),
    )


@given(st.data())
def _malformed_streams(data):
    COUNTS["malformed:examples"] += 1
    loop = _Loop()
    loop.open(1)
    loop.open(2)
    loop.feed(2, hello() + encode_request(Message("set", ("k0", b"before"))))
    stream = data.draw(_malformed_pydist() | _malformed_torch()) + data.draw(st.binary(max_size=16))
    for chunk in _chunks(data.draw, stream):
        COUNTS["malformed:steps"] += 1
        COUNTS["malformed:bytes"] += len(chunk)
        loop.feed(1, chunk)
    assert 1 in loop.dropped, f"{stream!r} was not dropped"
    loop.feed(2, encode_request(Message("multi_get", (["k0"], 0))))
    assert 2 not in loop.dropped
    assert loop.output[2].endswith(_protocol.encode_response(Message("values", ([b"before"],))))


@pytest.mark.slow
def test_streams_that_are_malformed_for_sure_are_dropped_and_others_unaffected():
    before = COUNTS.copy()
    _fuzz_settings(150)(_malformed_streams)()
    _report("malformed", before)


# =============================================================================================
# 1e. With a token: garbage (and replayed handshakes) can neither read nor write a key
# =============================================================================================
_TOKEN = b"robustness-token"


def _authenticated(loop: _Loop, cid: int, client_opening) -> list[bytes]:
    """Open ``cid`` as a client holding the token; the bytes it sent (for replays)."""
    opening = client_opening(_TOKEN)
    loop.open(cid)
    sent = [opening.start()]
    loop.feed(cid, sent[0])
    while not opening.done:
        reply = opening.feed(bytes(loop.output.pop(cid, b"")))
        assert reply or opening.done, "the opening stalled"
        if reply:
            sent.append(reply)
            loop.feed(cid, reply)
    loop.output.pop(cid, None)
    return sent


@given(st.data())
def _authenticated_streams(data):
    COUNTS["auth:examples"] += 1
    loop = _Loop()
    loop.service = StoreService(auth_token=_TOKEN)
    replay = _authenticated(loop, 0, ClientOpening)
    loop.feed(0, encode_request(Message("set", ("k0", b"mine"))))
    garbage = data.draw(st.lists(st.one_of(
        garbage_stream(),
        st.binary(min_size=32, max_size=32).map(lambda nonce: auth_hello(nonce)),          # a hello, no proof
        st.tuples(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32),
                  st.lists(_pydist_garbage_requests(), max_size=3)).map(
            lambda t: auth_hello(t[0]) + t[1] + b"".join(t[2])),                            # a forged proof
        st.lists(_pydist_garbage_requests(), max_size=3).map(
            lambda reqs: b"".join(replay) + b"".join(reqs)),                                 # a replay
    ), min_size=1, max_size=5))
    for cid, stream in enumerate(garbage, start=1):
        loop.open(cid)
        for chunk in _chunks(data.draw, stream):
            COUNTS["auth:steps"] += 1
            COUNTS["auth:bytes"] += len(chunk)
            loop.feed(cid, chunk)
        if data.draw(st.booleans()):
            loop.advance(1.0)
    for cid in range(1, len(garbage) + 1):
        out = bytes(loop.output.get(cid, b""))
        # at most the server's hello + nonce and a refusal byte: never an answer, never a proof
        assert len(out) <= len(auth_hello(b"\0" * 32)) + 1, f"garbage connection {cid} got {out!r}"
        if cid not in loop.dropped:
            loop.close(cid)
    assert 0 not in loop.dropped
    assert loop.service.state.data == {"k0": b"mine"}  # garbage wrote nothing
    loop.feed(0, encode_request(Message("multi_get", (["k0"], 0))))
    assert bytes(loop.output[0]).endswith(_protocol.encode_response(Message("values", ([b"mine"],))))


@pytest.mark.slow
def test_with_a_token_garbage_and_replayed_handshakes_can_neither_read_nor_write():
    before = COUNTS.copy()
    _fuzz_settings(80)(_authenticated_streams)()
    _report("auth", before)
