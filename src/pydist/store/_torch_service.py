"""What the store server does for a torch TCPStore client: torch's semantics over the
shared :class:`~pydist.store._state.KVState`, so torch and pydist clients see one store.

Keys. A torch client puts ``/`` before every user key (its ``list_keys`` keeps and strips
only those), so wire key ``/k`` is state key ``k``: a torch ``set("k", v)`` is a pydist
``get("k")``. Its few unprefixed keys (``init/``, the worker count of ``world_size``) live
under :data:`TORCH_RAW_PREFIX`, internal to pydist clients but counted and listed for torch
clients, as torch's own server does.

Semantics follow torch's libuv server: ``get``/``multi_get`` answer b"" for a missing key
(the client waits first); ``wait`` and ``barrier`` block without a server deadline until
the keys exist / the barrier is full, or the client sends CANCEL_WAIT after its own
timeout; ``queue_pop`` never blocks (the client waits on the queue first); a failing
operation (``add`` on a value that is not an integer) drops the connection, since torch's
protocol has no error reply.
"""
from __future__ import annotations

import math
from typing import Any

from ._protocol import Message
from ._state import INTERNAL_PREFIX, KVState, NotReady, parse_int
from ._torch_protocol import TorchRequestParser, encode_reply

#: State-key prefix of the keys a torch client sends without its "/" prefix.
TORCH_RAW_PREFIX = INTERNAL_PREFIX + "torch/"
_BLOCKING = frozenset({"wait", "barrier"})


def state_key(key: str) -> str:
    """The state key of a key as a torch client sends it."""
    return key[1:] if key.startswith("/") else TORCH_RAW_PREFIX + key


def wire_key(key: str) -> str | None:
    """The key a torch client knows state key ``key`` by; None for pydist-internal keys."""
    if key.startswith(TORCH_RAW_PREFIX):
        return key[len(TORCH_RAW_PREFIX):]
    return None if key.startswith(INTERNAL_PREFIX) else "/" + key


class TorchView:
    """torch's store operations, by query name, on a shared KVState (wire keys in, state
    keys out). Blocking ones raise NotReady naming the state keys to wait on."""

    def __init__(self, state: KVState):
        self._state = state

    def validate(self, magic: int) -> None:
        """The handshake; the parser has checked the magic number."""

    def ping(self, nonce: int) -> int:
        return nonce

    def set(self, key: str, value: bytes) -> None:
        self._state.set(state_key(key), value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._state.compare_set(state_key(key), expected, desired)

    def get(self, key: str) -> bytes:
        return self._state.data.get(state_key(key), b"")

    def add(self, key: str, amount: int) -> int:
        return self._state.add(state_key(key), amount)

    def check(self, keys: list[str]) -> bool:
        return self._state.check([state_key(key) for key in keys])

    def wait(self, keys: list[str]) -> None:
        self._state.wait([state_key(key) for key in keys])

    def num_keys(self) -> int:
        return sum(1 for key in self._state.data if wire_key(key) is not None)

    def delete_key(self, key: str) -> int:
        return int(self._state.delete_key(state_key(key)))

    def append(self, key: str, value: bytes) -> None:
        self._state.append(state_key(key), value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        self._state.multi_set([state_key(key) for key in keys], values)

    def queue_push(self, key: str, value: bytes) -> None:
        self._state.queue_push(state_key(key), value)

    def queue_pop(self, key: str) -> tuple[int, bytes | None]:
        length = self._state.queue_len(state_key(key))
        return length, self._state.queue_pop(state_key(key)) if length else None

    def queue_len(self, key: str) -> int:
        return self._state.queue_len(state_key(key))

    def list_keys(self) -> list[str]:
        return [name for name in map(wire_key, self._state.data) if name is not None]

    def barrier(self, key: str, world_size: int, arrive: bool = True) -> None:
        """Count this client in (once), then block until ``world_size`` clients did."""
        counter = state_key(key)
        count = self._state.add(counter, 1) if arrive else parse_int(counter, self._state.data.get(counter, b"0"))
        if count < world_size:
            raise NotReady([counter], retry_args=(key, world_size, False))


class TorchCodec(TorchRequestParser):
    """A torch client's connection as the server's service sees it: the request parser,
    the operations to run, and how answers are framed (see ``_service.PydistCodec``)."""

    greeting = b""
    cancel_op: str | None = "cancel_wait"

    @property
    def greeted(self) -> bool:
        """Its VALIDATE came."""
        return self.validated

    def bind(self, state: KVState) -> TorchView:
        return TorchView(state)

    def split(self, msg: Message) -> tuple[tuple[Any, ...], float]:
        """Arguments and the server-side timeout in ms: torch's blocking queries wait until
        answered or canceled (inf); the others never block (0)."""
        return msg.args, math.inf if msg.name in _BLOCKING else 0

    def answer(self, name: str, result: Any) -> bytes:
        return encode_reply(name, result)

    def timeout(self, name: str, missing: list[str], waited_ms: int) -> bytes | None:
        return None  # torch's requests have no server-side timeout: unreachable

    def error(self, name: str, exc: BaseException) -> bytes | None:
        return None  # no error reply in torch's protocol: the connection is dropped
