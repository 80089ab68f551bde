"""The store wire protocol: round trips, byte-by-byte parsing, garbage detection."""
from __future__ import annotations

import struct

import pytest

from pydist.store._protocol import (
    CHANGES,
    FILE_MAGIC,
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    REQUESTS,
    RESPONSES,
    ChangeParser,
    Message,
    Op,
    Parser,
    ProtocolError,
    RequestParser,
    ResponseParser,
    encode_change,
    encode_request,
    encode_response,
    hello,
    wire_fields,
)

# One sample value per field kind, including the awkward ones (empty, non-ASCII, negative).
_SAMPLES = {
    "s": "kéy/☃",
    "b": b"\x00\xffvalue",
    "q": -(1 << 63),
    "S": ["a", "", "ünï"],
    "B": [b"", b"\x00", b"x" * 300],
}


def _sample(name: str, fields: str) -> Message:
    return Message(name, tuple(_SAMPLES[kind] for kind in fields))


REQUEST_MESSAGES = [_sample(name, wire_fields(op)) for name, op in REQUESTS.items()]
RESPONSE_MESSAGES = [_sample(name, op.fields) for name, op in RESPONSES.items()]
CHANGE_MESSAGES = [_sample(name, op.fields) for name, op in CHANGES.items()]

CASES = [
    (RequestParser, encode_request, hello(), REQUEST_MESSAGES),
    (ResponseParser, encode_response, hello(), RESPONSE_MESSAGES),
    (ChangeParser, encode_change, hello(FILE_MAGIC), CHANGE_MESSAGES),
]
CASE_IDS = ["requests", "responses", "changes"]


def _parse_all(parser: Parser) -> list[Message]:
    out = []
    while (msg := parser.next()) is not None:
        out.append(msg)
    return out


@pytest.mark.parametrize("make_parser, encode, opening, messages", CASES, ids=CASE_IDS)
def test_every_message_type_round_trips(make_parser, encode, opening, messages):
    parser = make_parser()
    parser.feed(opening + b"".join(encode(m) for m in messages))
    assert _parse_all(parser) == messages
    assert parser.pending == 0


@pytest.mark.parametrize("make_parser, encode, opening, messages", CASES, ids=CASE_IDS)
def test_byte_by_byte_feeding_gives_the_same_messages(make_parser, encode, opening, messages):
    parser = make_parser()
    got = []
    for byte in opening + b"".join(encode(m) for m in messages):
        parser.feed(bytes([byte]))
        got.extend(_parse_all(parser))
    assert got == messages
    assert parser.handshaken and parser.pending == 0


def test_nothing_is_returned_before_the_hello_and_a_whole_message():
    parser = RequestParser()
    data = hello() + encode_request(Message("set", ("k", b"v")))
    parser.feed(data[:-1])
    assert parser.next() is None
    assert parser.pending > 0
    parser.feed(data[-1:])
    assert parser.next() == Message("set", ("k", b"v"))


def test_every_type_has_a_distinct_code():
    for table in (REQUESTS, RESPONSES, CHANGES):
        codes = [op.code for op in table.values()]
        assert len(set(codes)) == len(codes)


def _garbage_error(parser: Parser, data: bytes) -> ProtocolError:
    parser.feed(data)
    with pytest.raises(ProtocolError) as info:
        _parse_all(parser)
    with pytest.raises(ProtocolError):  # stays broken
        parser.next()
    return info.value


def _framed(code: int, body: bytes) -> bytes:
    return struct.pack("<BI", code, len(body)) + body


@pytest.mark.parametrize(
    "data, words",
    [
        (b"GET / HTTP/1.1\r\n", "magic"),
        (b"P\x00", "magic"),
        (b"PDST" + struct.pack("<H", 99), "version"),
        (hello() + bytes([250]), "unknown message type"),
        (hello() + struct.pack("<BI", REQUESTS["set"].code, MAX_MESSAGE_BYTES + 1), "length"),
        (hello() + _framed(REQUESTS["set"].code, struct.pack("<I", 0xFFFFFFF0)), "limit"),
        (hello() + _framed(REQUESTS["set"].code, struct.pack("<I", MAX_KEY_BYTES + 1)), "limit"),
        (hello() + _framed(REQUESTS["set"].code, struct.pack("<I", 10) + b"abc"), "past the end"),
        (hello() + _framed(REQUESTS["num_keys"].code, b"extra"), "unexpected bytes"),
        (hello() + _framed(REQUESTS["delete_key"].code, struct.pack("<I", 2) + b"\xff\xfe"), "UTF-8"),
        (hello() + _framed(REQUESTS["check"].code, struct.pack("<I", 1 << 30)), "past the end"),
    ],
    ids=["http", "bad-magic-prefix", "version", "opcode", "oversized-message", "oversized-field",
         "oversized-key", "truncated-field", "trailing-bytes", "bad-utf8", "huge-list-count"],
)
def test_garbage_raises_protocol_error(data, words):
    assert words in str(_garbage_error(RequestParser(), data))


def test_garbage_is_detected_byte_by_byte_without_waiting_for_more():
    parser = RequestParser()
    parser.feed(b"X")
    with pytest.raises(ProtocolError):
        parser.next()


def test_file_and_wire_streams_are_not_confused():
    _garbage_error(ChangeParser(), hello())
    _garbage_error(ResponseParser(), hello(FILE_MAGIC))


def test_encoding_refuses_what_the_parser_would_refuse():
    with pytest.raises(ValueError, match="key of"):
        encode_request(Message("set", ("k" * (MAX_KEY_BYTES + 1), b"")))
    with pytest.raises(ValueError, match="fields"):
        encode_request(Message("set", ("k",)))
    with pytest.raises(KeyError):
        encode_request(Message("no_such_op", ()))


def test_blocking_requests_carry_a_timeout_field():
    assert wire_fields(Op(1, "S", blocking=True)) == "Sq"
    assert all(wire_fields(op).endswith("q") for op in REQUESTS.values() if op.blocking)
