"""The seal in a segment's first page: what binds the segment to the group it was made for.

The creator writes, before it publishes the segment's name: a magic, a fresh nonce (32
random bytes) and a tag over (the segment's name, the store key it is published under,
which names the group and its members, the world token, the payload size, the nonce). A
member checks it after mapping the segment and before touching any slot:

- with the job's secret (PYDIST_AUTH_TOKEN, or the store's ``auth_token``): the tag is
  HMAC-SHA256(secret, ...), which nobody without the secret can make, so a segment that
  anyone else made (even as this user), or that was made for another group or job, is
  refused;
- without one: the tag is a plain SHA-256 of the same fields. It proves nothing about who
  wrote it; it catches a name swapped for another pydist segment of this user (another
  group of the job, another job), which the owner check lets through.

The ``unavailable`` mark is the store value a creator publishes instead of a name when it
could not make the segment (/dev/shm full): the members then do without shared memory
together. With a secret it carries an HMAC too, so an outsider cannot forge it.
"""
from __future__ import annotations

import hashlib
import hmac
import mmap
import secrets
import struct
from dataclasses import dataclass

#: bytes of the seal's page: the payload after it starts page-aligned
SEAL_BYTES = 4096
MAGIC = b"pydist-shm-seal1"
NONCE_BYTES = 32
TAG_BYTES = 32
_NONCE_AT = len(MAGIC)
_TAG_AT = _NONCE_AT + NONCE_BYTES
_LENGTH = struct.Struct("<Q")
#: the store value of a segment that could not be made (see the module)
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Binding:
    """What a segment is made for: the store ``key`` it is published under (the group and
    its members), the ``world`` token, the ``payload`` bytes, and the job's ``secret``
    (None: the job has none)."""

    key: str
    world: str
    payload: int
    secret: bytes | None

    def tag(self, name: str, nonce: bytes) -> bytes:
        """The tag of segment ``name`` with ``nonce`` (see the module)."""
        message = b"".join(_LENGTH.pack(len(part)) + part for part in
                           (b"pydist-shm/1", name.encode(), self.key.encode(), self.world.encode(),
                            _LENGTH.pack(self.payload), nonce))
        if self.secret is None:
            return hashlib.sha256(message).digest()
        return hmac.new(self.secret, message, hashlib.sha256).digest()

    def seal(self, page: mmap.mmap, name: str) -> None:
        """Write the seal of segment ``name`` at the start of its map ``page`` (the creator,
        before it publishes the name)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        page[:_NONCE_AT] = MAGIC
        page[_NONCE_AT:_TAG_AT] = nonce
        page[_TAG_AT:_TAG_AT + TAG_BYTES] = self.tag(name, nonce)

    def check(self, page: mmap.mmap, name: str) -> str | None:
        """Why segment ``name``'s seal is not this binding's (None: it is)."""
        if bytes(page[:_NONCE_AT]) != MAGIC:
            return "it carries no pydist seal"
        nonce = bytes(page[_NONCE_AT:_TAG_AT])
        if not hmac.compare_digest(bytes(page[_TAG_AT:_TAG_AT + TAG_BYTES]), self.tag(name, nonce)):
            if self.secret is not None:
                return "its seal is not this job's (not made with the job's secret for this group)"
            return "its seal is for another group or job"
        return None

    def unavailable(self) -> str:
        """The store value saying that the creator could not make the segment."""
        if self.secret is None:
            return UNAVAILABLE
        return f"{UNAVAILABLE}:{self._unavailable_tag()}"

    def is_unavailable(self, value: str) -> bool:
        """Whether ``value`` is this binding's unavailable mark (with a secret: a forged one is not)."""
        return hmac.compare_digest(value.encode(), self.unavailable().encode())

    def _unavailable_tag(self) -> str:
        assert self.secret is not None
        message = b"pydist-shm-unavailable/1\0" + self.key.encode() + b"\0" + self.world.encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()
