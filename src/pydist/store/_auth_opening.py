"""The authenticated opening of a store connection, pure sans-IO.

With a shared token both sides of a pydist store stream open with a mutual HMAC
challenge–response (the wire format is in :mod:`._protocol`'s docstring):
:class:`ClientOpening` and :class:`ServerOpening` each take the peer's bytes through
``feed`` and return the bytes to send, until ``done``; ``leftover()`` is then the start of
the message stream. A peer without a token, with another token, or that replays a handshake
fails it: the client raises AuthenticationError, the server AuthRefused carrying the reply to
send before closing; bytes that are not a pydist store stream raise ProtocolError.
"""
from __future__ import annotations

from ..net.auth import CLIENT, MAC_BYTES, SERVER, AuthenticationError, Transcript, new_nonce
from ._protocol import (
    AUTH_ACCEPTED,
    AUTH_FLAG,
    AUTH_HELLO_BYTES,
    AUTH_REFUSED,
    HELLO_BYTES,
    VERSION,
    VERSION_FIELD,
    WIRE_MAGIC,
    AuthRefused,
    ProtocolError,
    auth_hello,
)


def _hello_version(buf: bytearray) -> int | None:
    """The version of the hello at the start of ``buf`` (None: incomplete). Raises ProtocolError."""
    seen = bytes(buf[:len(WIRE_MAGIC)])
    if not WIRE_MAGIC.startswith(seen):
        raise ProtocolError(f"bad magic {seen!r} (expected {WIRE_MAGIC!r}): not a pydist store stream")
    return VERSION_FIELD.unpack_from(buf, len(WIRE_MAGIC))[0] if len(buf) >= HELLO_BYTES else None


class _Opening:
    """One side of the authenticated opening: ``feed(bytes)`` returns bytes to send; when
    ``done``, ``leftover()`` is what arrived after it (the start of the message stream)."""

    def __init__(self, token: bytes):
        self._buf = bytearray()
        self._transcript = Transcript(token, "store")
        self._nonce = new_nonce()
        self._step = 0
        self.done = False

    @property
    def answered(self) -> bool:
        """The peer's hello was taken (and answered, on the server's side)."""
        return self._step > 0

    @property
    def pending(self) -> int:
        """Bytes received and not consumed yet (the peer's next step, or what it sent early)."""
        return len(self._buf)

    def leftover(self) -> bytes:
        data, self._buf = bytes(self._buf), bytearray()
        return data

    def feed(self, data: bytes) -> bytes:
        """Take received bytes; return the bytes to send (b"": none yet)."""
        self._buf += data
        out = b""
        try:
            while not self.done and (step := self._advance()) is not None:
                out += step
        except AuthRefused as e:
            e.reply = out + e.reply
            raise
        return out

    def _advance(self) -> bytes | None:
        """One step: what to send, or None if more bytes are needed."""
        raise NotImplementedError

    def _plain_hello(self) -> None:
        """The peer's hello does not authenticate: raise."""
        raise NotImplementedError

    def _peer_hello(self) -> bytes | None:
        """The peer's authenticating hello, added to the transcript (None: not whole yet).
        Raises ProtocolError (not a pydist stream, another version) or ``_plain_hello``'s error."""
        version = _hello_version(self._buf)
        if version is None:
            return None
        if version == VERSION:
            self._plain_hello()
        if version != VERSION | AUTH_FLAG:
            raise ProtocolError(f"protocol version {version & ~AUTH_FLAG} is not supported "
                                f"(this side speaks {VERSION})")
        message = self._take(AUTH_HELLO_BYTES)
        if message is not None:
            self._transcript.add(message)
        return message

    def _take(self, n: int) -> bytes | None:
        if len(self._buf) < n:
            return None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


class ClientOpening(_Opening):
    """The client's side: send ``start()``, then ``feed`` what the server sends until
    ``done``. Raises AuthenticationError (the server has another token or none, or failed to
    prove it holds this one) or ProtocolError (not a pydist store server)."""

    def start(self) -> bytes:
        message = auth_hello(self._nonce)
        self._transcript.add(message)
        return message

    def _plain_hello(self) -> None:
        raise AuthenticationError("the server has no token (it does not authenticate) "
                                  "and this client has one (PYDIST_AUTH_TOKEN or auth_token=)")

    def _advance(self) -> bytes | None:
        if self._step == 0:
            if self._peer_hello() is None:
                return None
            self._step = 1
            return self._transcript.proof(CLIENT)
        status = self._buf[:1]
        if status == bytes([AUTH_REFUSED]):
            raise AuthenticationError("the server refused this client's proof: the tokens differ")
        if status and status != bytes([AUTH_ACCEPTED]):
            raise ProtocolError(f"unexpected authentication status {status!r}")
        answer = self._take(1 + MAC_BYTES)
        if answer is None:
            return None
        if not self._transcript.check(SERVER, answer[1:]):
            raise AuthenticationError("the server did not prove that it holds the token")
        self.done = True
        return b""


class ServerOpening(_Opening):
    """The server's side: ``feed`` what the client sends until ``done``. Raises
    AuthRefused (with the reply to send before closing) or ProtocolError."""

    def _plain_hello(self) -> None:
        raise AuthRefused("the client did not authenticate (it has no token)", auth_hello())

    def _advance(self) -> bytes | None:
        if self._step == 0:
            if self._peer_hello() is None:
                return None
            answer = auth_hello(self._nonce)
            self._transcript.add(answer)
            self._step = 1
            return answer
        proof = self._take(MAC_BYTES)
        if proof is None:
            return None
        if not self._transcript.check(CLIENT, proof):
            raise AuthRefused("wrong proof (another token, or a replayed handshake)", bytes([AUTH_REFUSED]))
        self.done = True
        return bytes([AUTH_ACCEPTED]) + self._transcript.proof(SERVER)
