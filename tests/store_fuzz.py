"""Shared by the store fuzz tests (test_store_fuzz_*.py, test_robustness_soak.py): hypothesis settings
scaled by PYDIST_FUZZ_SCALE, the counters printed as ``FUZZ <test>: N examples, M steps``
(``pytest -s``), the garbage-stream strategies, and ``_Loop``: tcp.py's I/O loop around the
sans-IO StoreService, minus the sockets.

Fuzz example counts scale with PYDIST_FUZZ_SCALE (default 1; the soak run uses more: it
sets ``store_fuzz.SCALE``).
"""
from __future__ import annotations

import collections
import os
import struct

import pytest

pytest.importorskip("hypothesis", reason="the store fuzz needs hypothesis (test extras)")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st

from pydist.store import _protocol  # noqa: E402
from pydist.store._protocol import MAX_KEY_BYTES, MAX_MESSAGE_BYTES, REQUESTS, Message, encode_request, hello  # noqa: E402
from pydist.store._service import StoreService  # noqa: E402
from pydist.store._torch_protocol import QUERIES, VALIDATION_MAGIC  # noqa: E402
from pydist.store._torch_protocol import encode_request as torch_request

SCALE = float(os.environ.get("PYDIST_FUZZ_SCALE", "1"))
COUNTS: collections.Counter = collections.Counter()


SCALE = float(os.environ.get("PYDIST_FUZZ_SCALE", "1"))
COUNTS: collections.Counter = collections.Counter()


def _fuzz_settings(examples: int, **kwargs) -> settings:
    """No example database (nothing written into the repo), no per-example deadline (CI
    machines stall), and the example count scaled by PYDIST_FUZZ_SCALE."""
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), **kwargs)


def _report(name: str, before: collections.Counter) -> None:
    """Print this run's counters of ``name`` (examples, steps, bytes fed, and the rest)."""
    counts = {key.split(":", 1)[1]: COUNTS[key] - before[key] for key in sorted(COUNTS) if key.startswith(name + ":")}
    print(f"\nFUZZ {name}: " + ", ".join(f"{value} {key}" for key, value in counts.items()))


# =============================================================================================
# 1a. The sans-IO server under random bytes
# =============================================================================================
#: Keys the model owns. Garbage is never allowed to contain these byte strings, so no garbage
#: request can name them: whatever garbage does, the model's keys are the good clients' alone.
DATA_KEYS = ("k0", "k1", "k2")
QUEUE_KEYS = ("q0", "q1")
MODEL_KEY_BYTES = tuple(k.encode() for k in DATA_KEYS + QUEUE_KEYS)
GARBAGE_KEYS = ("zz", "y/1", "", "\x00pydist/x", "\u2603")

_TORCH_VALIDATE = torch_request(Message("validate", (VALIDATION_MAGIC,)))
_I64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _clean(data: bytes) -> bool:
    return not any(k in data for k in MODEL_KEY_BYTES)


def _pydist_garbage_requests() -> st.SearchStrategy[bytes]:
    """Valid pydist requests over garbage keys, every type and odd field values."""
    keys = st.sampled_from(GARBAGE_KEYS)
    vals = st.binary(max_size=12)
    field = {"s": keys, "b": vals, "q": _I64 | st.integers(-2, 2000),
             "S": st.lists(keys, max_size=3), "B": st.lists(vals, max_size=3)}

    def request(name: str) -> st.SearchStrategy[bytes]:
        fields = _protocol.wire_fields(REQUESTS[name])
        return st.tuples(*(field[k] for k in fields)).map(lambda args: encode_request(Message(name, args)))
    return st.sampled_from(sorted(REQUESTS)).flatmap(request)


def _torch_garbage_requests() -> st.SearchStrategy[bytes]:
    """Valid torch queries over garbage keys (prefixed "/" or not)."""
    keys = st.sampled_from(GARBAGE_KEYS + tuple("/" + k for k in GARBAGE_KEYS))
    vals = st.binary(max_size=12)
    field = {"s": keys, "b": vals, "q": _I64 | st.integers(-2, 5), "I": st.integers(0, (1 << 32) - 1),
             "S": st.lists(keys, max_size=3)}

    def query(name: str) -> st.SearchStrategy[bytes]:
        fields = QUERIES[name].fields
        if fields == "P":
            args = st.lists(st.tuples(keys, vals), max_size=3).map(lambda kv: ([k for k, _ in kv], [v for _, v in kv]))
            return args.map(lambda a: torch_request(Message(name, a)))
        return st.tuples(*(field[k] for k in fields)).map(lambda args: torch_request(Message(name, args)))
    return st.sampled_from(sorted(set(QUERIES) - {"validate"})).flatmap(query)


@st.composite
def _mutated(draw, stream: bytes) -> bytes:
    """``stream`` with 0-3 byte-level mutations: overwrite, insert, delete, truncate, repeat."""
    data = bytearray(stream)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["overwrite", "insert", "delete", "truncate", "repeat", "u32"]))
        at = draw(st.integers(0, max(0, len(data))))
        if kind == "overwrite" and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 16))]
        elif kind == "u32":  # a length or count field rewritten to an extreme value
            data[at:at + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF,
                                                                     MAX_KEY_BYTES + 1, MAX_MESSAGE_BYTES + 1])))
    return bytes(data)


@st.composite
def garbage_stream(draw) -> bytes:
    """A stream a broken or hostile client might send: pure noise, or a valid opening and
    valid requests (pydist or torch) mutated at the byte level."""
    kind = draw(st.sampled_from(["noise", "pydist", "torch", "pydist-noise", "torch-noise"]))
    if kind == "noise":
        data = draw(st.binary(max_size=64))
    elif kind in ("pydist", "torch"):
        opening = hello() if kind == "pydist" else _TORCH_VALIDATE
        requests = _pydist_garbage_requests() if kind == "pydist" else _torch_garbage_requests()
        data = draw(_mutated(opening + b"".join(draw(st.lists(requests, min_size=1, max_size=4)))))
    else:
        data = (hello() if kind == "pydist-noise" else _TORCH_VALIDATE) + draw(st.binary(max_size=48))
    return data if _clean(data) else data.replace(b"k", b"K").replace(b"q", b"Q")


def _chunks(draw, data: bytes) -> list[bytes]:
    """``data`` cut at random points (receive() must not care how bytes are split)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


class _Loop:
    """What tcp.py's I/O loop does with the service, minus the sockets: closes dropped
    connections, collects output per connection, never lets an exception through."""

    def __init__(self) -> None:
        self.service = StoreService()
        self.now = 1000.0
        self.output: dict[int, bytearray] = collections.defaultdict(bytearray)
        self.dropped: dict[int, str] = {}

    def open(self, cid: int) -> None:
        self.service.open(cid)

    def feed(self, cid: int, data: bytes) -> None:
        self.service.receive(cid, data, self.now)
        self.pump()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.service.expire(self.now)
        self.pump()

    def close(self, cid: int) -> bool:
        """Whether the connection ended badly (mid-message): close() answers a bool or a reason."""
        bad = self.service.close(cid)
        self.pump()
        return bool(bad)

    def pump(self) -> None:
        for cid, reason in self.service.take_dropped().items():
            self.dropped[cid] = reason
            self.service.close(cid)
        for cid, data in self.service.take_output().items():
            self.output[cid] += data
