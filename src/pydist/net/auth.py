"""Shared-token authentication: an HMAC-SHA256 challenge–response, sans-IO.

With a token (``PYDIST_AUTH_TOKEN``, or ``TCPStore(auth_token=...)``) every connection to
the store server and between ranks opens with a mutual challenge–response before any other
byte is accepted. The side that connects is the *client*, the side that accepts the
*server*::

    1. client -> server   hello + nonce_c                 (32 random bytes, os.urandom)
    2. server -> client   hello + nonce_s                 (32 random bytes)
    3. client -> server   proof_c = MAC("client", transcript)
    4. server -> client   refused, or accepted + proof_s = MAC("server", transcript)

``MAC(role, transcript) = HMAC-SHA256(token, "pydist-auth/1" | purpose | role | message 1
| message 2)``, every field length-prefixed, where messages 1 and 2 are the exact bytes
sent (so the nonces, and for the transports the ranks and job, are bound). Proofs are
compared with ``hmac.compare_digest``. A replayed message 3 fails (message 2 carries a
fresh nonce_s), a reflected proof fails (the role is MACed), and a server answers with a
proof only to a client that proved first, so an unauthenticated peer gets no MAC at all.
What is not protected: see the threat model in docs/guide/networks.md (no encryption, no per-message
integrity after the handshake, no DoS protection).

This module holds the token rules and the proofs; the store (``store/_auth_opening.py``) and
the transports (``transport/tcp/mesh.py``) frame the four messages in their own protocols.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import struct
from collections.abc import Sequence
from hashlib import sha256
from typing import Any

from ..core.errors import DistNetworkError, DistStoreError
from ..core.settings import settings
from . import tls as _tls
from .addresses import is_loopback

#: The environment variable holding the shared token.
TOKEN_ENV = "PYDIST_AUTH_TOKEN"
#: What rank 0 of a job without a token or TLS logs once (logger "pydist", a warning).
OPEN_JOB_WARNING = (
    "pydist: this job has no shared secret, so it is open: anyone who can reach its store or its ranks' ports "
    "can read and write the store, join as a rank, inject data and stop the job. To close it, set the "
    "same PYDIST_AUTH_TOKEN (a long random secret, e.g. from secrets.token_hex(32)) for every rank, or "
    "mutual TLS (PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA); pydist-run does this by itself for a "
    "single-node job.")
#: What it logs instead when the job is bound to loopback only (see reaches_only_this_machine).
LOCAL_JOB_NOTICE = ("pydist: no PYDIST_AUTH_TOKEN, so any process on this machine (loopback only) can reach "
                    "this job; set one on every rank to close it")
_warned_open = False
NONCE_BYTES = 32
MAC_BYTES = 32
CLIENT, SERVER = "client", "server"
_LABEL = b"pydist-auth/1"
_LENGTH = struct.Struct("<I")


class AuthenticationError(DistNetworkError, DistStoreError):
    """A connection failed authentication: the peer has another token, or none, or did not
    prove it holds this one. Both a DistNetworkError and a DistStoreError."""


def resolve_token(explicit: str | bytes | None = None) -> bytes | None:
    """The token as bytes: ``explicit`` if given ("" means none), else PYDIST_AUTH_TOKEN
    (unset or empty: none). Raises TypeError for another type."""
    if explicit is None:
        explicit = settings().auth_token or ""
    if isinstance(explicit, str):
        explicit = explicit.encode()
    if not isinstance(explicit, (bytes, bytearray)):
        raise TypeError(f"auth_token: expected str or bytes, got {type(explicit).__name__}")
    return bytes(explicit) or None


def token_of(store: Any) -> bytes | None:
    """The token of the store a transport rendezvouses through: the ``auth_token`` of the
    first store in its ``underlying_store`` chain that has one (a TCPStore), else
    PYDIST_AUTH_TOKEN."""
    seen = 0
    while store is not None and seen < 64:
        token = getattr(store, "auth_token", None)
        if token is not None or hasattr(type(store), "auth_token"):
            return token
        store, seen = getattr(store, "underlying_store", None), seen + 1
    return resolve_token()


def warn_if_open(store: Any, listening: Sequence[str] = ()) -> bool:
    """Log once per process (logger "pydist") that the job met through ``store``, whose rank
    listens on ``listening``, is open when it has no token (see :func:`token_of`) and no TLS:
    :data:`LOCAL_JOB_NOTICE` if only this machine can reach it (reaches_only_this_machine),
    else :data:`OPEN_JOB_WARNING`; nothing when pydist-run started this worker (its launcher
    says it once for the job). Whether it logged now."""
    global _warned_open
    if _warned_open or settings().run_worker or token_of(store) is not None or _tls.contexts() is not None:
        return False
    _warned_open = True
    local = reaches_only_this_machine(store, listening)
    logging.getLogger("pydist").warning(LOCAL_JOB_NOTICE if local else OPEN_JOB_WARNING)
    return True


def reaches_only_this_machine(store: Any, listening: Sequence[str]) -> bool:
    """Whether a job is bound to loopback only: every address its rank listens on
    (``listening``) is a loopback one, and ``store`` (the end of its ``underlying_store``
    chain) lives in this process (HashStore) or a file (FileStore), or is a pydist TCPStore
    serving from this process on a loopback address. A store served elsewhere counts as
    reachable: where its server listens is not known here (torch's listens on every interface)."""
    if not all(is_loopback(address) for address in listening):
        return False
    for _ in range(64):
        if getattr(store, "underlying_store", None) is None:
            break
        store = store.underlying_store
    if type(store).__name__ in ("HashStore", "FileStore"):
        return True
    serving = getattr(store, "server_stats", None)
    return callable(serving) and serving() is not None and is_loopback(store.host)


def new_nonce() -> bytes:
    """A fresh challenge: NONCE_BYTES from the OS's random source."""
    return secrets.token_bytes(NONCE_BYTES)


class Transcript:
    """The messages of one handshake so far, and the proofs over them."""

    def __init__(self, token: bytes, purpose: str):
        self._token = token
        self._parts = bytearray()
        for part in (_LABEL, purpose.encode()):
            self.add(part)

    def add(self, message: bytes) -> None:
        """Append one message exactly as it was sent or received."""
        self._parts += _LENGTH.pack(len(message)) + message

    def proof(self, role: str) -> bytes:
        """``role``'s proof (MAC_BYTES) over the transcript."""
        return hmac.new(self._token, bytes(self._parts) + _LENGTH.pack(len(role)) + role.encode(), sha256).digest()

    def check(self, role: str, proof: bytes) -> bool:
        """Whether ``proof`` is ``role``'s proof over the transcript (constant time)."""
        return hmac.compare_digest(self.proof(role), bytes(proof))
