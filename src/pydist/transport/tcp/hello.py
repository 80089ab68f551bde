"""The HELLO handshake that opens every tcp connection, sans-IO: rank and world token each way,
and with a shared token (the store's ``auth_token``, else PYDIST_AUTH_TOKEN; see
:mod:`pydist.net.auth`) nonces and proofs, so a connection is accepted only after both ranks
proved they hold the token (:class:`Connector` dials, :class:`Acceptor` answers)."""
from __future__ import annotations

import hmac
import json
import socket
from collections.abc import Callable

from ...net.auth import CLIENT, SERVER, AuthenticationError, Transcript, new_nonce
from ..framing import HEADER_SIZE, FramingError, Kind, decode_header, encode_frame

MAX_HELLO_BYTES = 4096


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed during handshake")
        chunks += chunk
    return bytes(chunks)


def hello_frame(fields: dict) -> bytes:
    return encode_frame(Kind.HELLO, 0, 0, 0, json.dumps(fields).encode())


def hello_size(head: bytes) -> int:
    """The size of the HELLO frame (header and payload) whose header is ``head``;
    FramingError if it is not one, or is over MAX_HELLO_BYTES."""
    header = decode_header(head)
    if header.kind != Kind.HELLO or header.nbytes > MAX_HELLO_BYTES:
        raise FramingError(f"expected a HELLO frame, got {header.kind.name} of {header.nbytes} bytes")
    return HEADER_SIZE + header.nbytes


def read_frame(sock: socket.socket) -> bytes:
    """One whole HELLO frame (header and payload); FramingError/ConnectionError on anything else."""
    head = recv_exactly(sock, HEADER_SIZE)
    return head + recv_exactly(sock, hello_size(head) - HEADER_SIZE)


def fields_of(frame: bytes) -> dict:
    """The JSON object a HELLO frame carries; FramingError if it is not one."""
    try:
        fields = json.loads(frame[HEADER_SIZE:])
    except ValueError as error:
        raise FramingError(f"HELLO payload is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise FramingError("HELLO payload is not a JSON object")
    return fields


def rank_of(fields: dict) -> int:
    rank = fields.get("rank")
    if type(rank) is not int:
        raise FramingError(f"HELLO without a rank: {str(fields)[:80]}")
    return rank


def _unhex(value: object) -> bytes:
    try:
        return bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        return b""


class Refused(FramingError):
    """The accepting side refuses a connection (authentication); send ``reply``, then close."""

    def __init__(self, message: str, reason_for_peer: str):
        super().__init__(message)
        self.reply = hello_frame({"refused": reason_for_peer})


class Connector:
    """The connecting rank's side of the handshake, sans-IO. Send ``first``, then pass each
    HELLO frame received to ``on_hello`` (it returns the frame to send, maybe b"") until
    ``done``. Raises FramingError (not ``expected`` of this job: retry) or
    AuthenticationError (the peer refused this rank's proof, has no token, or failed to prove).

    Without a token: HELLO {rank, token, claim} and HELLO {rank, token} back, ``claim`` being
    the one this rank's store record publishes (checked by an acceptor with no secret). With
    one (see :mod:`pydist.net.auth`)::

        -> HELLO {rank, token, claim, nonce}   <- HELLO {rank, token, nonce}
        -> HELLO {proof}                <- HELLO {proof} | HELLO {refused}, close
    """

    def __init__(self, rank: int, world: str, expected: int, auth_token: bytes | None, claim: str = ""):
        self._world, self._expected, self._auth_token = world, expected, auth_token
        fields: dict = {"rank": rank, "token": world}
        if claim:
            fields["claim"] = claim
        if auth_token is not None:
            fields["nonce"] = new_nonce().hex()
        self.first = hello_frame(fields)
        self._transcript: Transcript | None = None
        self.done = False

    def on_hello(self, frame: bytes) -> bytes:
        fields = fields_of(frame)
        if "refused" in fields:
            raise AuthenticationError(f"it refused this rank: {str(fields['refused'])[:200]}")
        if self._transcript is not None:
            if not self._transcript.check(SERVER, _unhex(fields.get("proof"))):
                raise AuthenticationError("it did not prove that it holds the token")
            self.done = True
            return b""
        if fields.get("token") != self._world:
            raise FramingError("HELLO from another job (world token differs)")
        if rank_of(fields) != self._expected:
            raise FramingError(f"the peer is not rank {self._expected}")
        if self._auth_token is None:
            self.done = True
            return b""
        if not isinstance(fields.get("nonce"), str):
            raise AuthenticationError("it has no token (it does not authenticate) and this rank has one")
        self._transcript = Transcript(self._auth_token, "mesh")
        self._transcript.add(self.first)
        self._transcript.add(frame)
        return hello_frame({"proof": self._transcript.proof(CLIENT).hex()})


class Acceptor:
    """The accepting rank's side, sans-IO: pass each HELLO frame received to ``on_hello``
    (it returns the frame to send) until ``done``; ``peer`` is then the connector's rank,
    one of ``expected``. Raises FramingError (a stray or garbage: drop it) or
    :class:`Refused` (failed authentication: send its reply, then drop it).

    Without a secret (no token, no TLS) the acceptor may be given ``claim_of(peer)``, the
    claim peer's record publishes (None or "": not checked), and ``taken(peer)``, whether
    peer is connected already, asked once per HELLO that carries the claim, before it is
    answered (the Admission reserves peer for this connection when it answers False): a
    HELLO without the claim, or claiming a rank connected or claimed already, is refused
    (only a secret tells a rank from a process that read the store)."""

    def __init__(self, rank: int, world: str, expected: set[int], auth_token: bytes | None,
                 claim_of: Callable[[int], str | None] | None = None, taken: Callable[[int], bool] | None = None):
        self._rank, self._world, self.expected, self._auth_token = rank, world, expected, auth_token
        self._claim_of, self._taken = claim_of, taken
        self._transcript: Transcript | None = None
        self.peer: int | None = None
        self.done = False

    def on_hello(self, frame: bytes) -> bytes:
        fields = fields_of(frame)
        if self._transcript is not None:
            if not self._transcript.check(CLIENT, _unhex(fields.get("proof"))):
                raise Refused(f"rank {self.peer}: wrong proof (another token, or a replayed handshake)",
                              "wrong proof: the tokens differ")
            self.done = True
            return hello_frame({"proof": self._transcript.proof(SERVER).hex()})
        if fields.get("token") != self._world:
            raise FramingError("HELLO from another job (world token differs)")
        peer = rank_of(fields)
        if peer not in self.expected:
            raise FramingError(f"unexpected HELLO from rank {peer}")
        claim = self._claim_of(peer) if self._claim_of is not None else None
        if claim and not hmac.compare_digest(str(fields.get("claim", "")).encode(), claim.encode()):
            raise Refused(f"a HELLO claiming rank {peer} without its published claim",
                          f"it does not carry rank {peer}'s claim")
        if self._taken is not None and self._taken(peer):
            raise Refused(f"a second connection claiming rank {peer}, which is connected already",
                          f"rank {peer} is connected to rank {self._rank} already: another process claimed its "
                          "rank (without PYDIST_AUTH_TOKEN or TLS, any process that can read the store can)")
        self.peer = peer
        reply: dict = {"rank": self._rank, "token": self._world}
        if self._auth_token is None:
            if "nonce" in fields:
                raise Refused(f"rank {peer} authenticates and this rank has no token",
                              "it has no token (PYDIST_AUTH_TOKEN) and does not authenticate")
            self.done = True
            return hello_frame(reply)
        if not isinstance(fields.get("nonce"), str):
            raise Refused(f"rank {peer} did not authenticate (it has no token)",
                          "it requires a token (PYDIST_AUTH_TOKEN) and this rank has none")
        reply["nonce"] = new_nonce().hex()
        answer = hello_frame(reply)
        self._transcript = Transcript(self._auth_token, "mesh")
        self._transcript.add(frame)
        self._transcript.add(answer)
        return answer
