"""The bytes a device buffer or event is shared by: pydist's envelope around the device's own.

Behaviour
    ``Handle`` carries what the importer needs beside the device's own handle bytes
    (``payload``: CUDA's 64-byte ``cudaIpcMemHandle_t`` or ``cudaIpcEventHandle_t``, the
    stand-in's file name): what it is (memory or event), the implementation that made it, the
    exporting process and rank (to refuse an open in the exporting process and to name the
    peer when it dies), the physical device (UUID), the size, a random nonce (a buffer freed
    and allocated again never has the same handle bytes) and the buffer's ledger
    (pydist.device.ledger). ``encode`` / ``decode`` are its wire form.

Failure modes
    ``decode`` checks every length against the bytes received before reading a field, and
    raises ValueError naming what is wrong (magic, version, kind, a length, a ledger name
    that is not one); a handle is at most ``MAX_BYTES``.
"""
from __future__ import annotations

import dataclasses
import secrets
import struct

from . import shm_files

MAX_BYTES = 4096
_MAGIC = b"PDVH"
_VERSION = 1
#: magic, version, what, implementation, pid, rank, nbytes, nonce, uuid len, ledger len, payload len
_HEAD = struct.Struct("!4sBc12sIiQ16sHHH")
MEMORY, EVENT = b"m", b"e"


@dataclasses.dataclass(frozen=True)
class Handle:
    """A shared buffer (``what`` MEMORY) or interprocess event (EVENT), as its peers open it."""

    what: bytes
    kind: str
    pid: int
    rank: int | None
    nbytes: int
    device_uuid: str
    payload: bytes
    ledger: str = ""
    nonce: bytes = dataclasses.field(default_factory=lambda: secrets.token_bytes(16))

    @property
    def exporter(self) -> str:
        """The exporting process, as messages name it."""
        return f"rank {self.rank} (pid {self.pid})" if self.rank is not None else f"pid {self.pid}"


def encode(handle: Handle) -> bytes:
    """``handle`` as bytes (``decode`` reads it back)."""
    uuid, ledger = handle.device_uuid.encode(), handle.ledger.encode()
    head = _HEAD.pack(_MAGIC, _VERSION, handle.what, handle.kind.encode(), handle.pid,
                      -1 if handle.rank is None else handle.rank, handle.nbytes, handle.nonce,
                      len(uuid), len(ledger), len(handle.payload))
    data = head + uuid + ledger + handle.payload
    if len(data) > MAX_BYTES:
        raise ValueError(f"a device handle of {len(data)} bytes exceeds {MAX_BYTES}")
    return data


def decode(data: bytes) -> Handle:
    """The handle ``encode`` made; ValueError naming what is wrong with anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"a device handle is bytes, got {type(data).__name__}")
    data = bytes(data)
    if not _HEAD.size <= len(data) <= MAX_BYTES:
        raise ValueError(f"a device handle has {_HEAD.size} to {MAX_BYTES} bytes, got {len(data)}")
    magic, version, what, kind, pid, rank, nbytes, nonce, n_uuid, n_ledger, n_payload = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"not a pydist device handle (magic {magic!r})")
    if version != _VERSION:
        raise ValueError(f"device handle version {version}, this pydist reads {_VERSION}")
    if what not in (MEMORY, EVENT):
        raise ValueError(f"a device handle of unknown kind {what!r}")
    if len(data) != _HEAD.size + n_uuid + n_ledger + n_payload:
        raise ValueError(f"a device handle of {len(data)} bytes, its header says "
                         f"{_HEAD.size + n_uuid + n_ledger + n_payload}")
    at = _HEAD.size
    try:
        uuid = data[at:at + n_uuid].decode()
        ledger = data[at + n_uuid:at + n_uuid + n_ledger].decode()
    except UnicodeDecodeError as error:
        raise ValueError(f"a device handle with a malformed text field: {error}") from None
    if what == MEMORY:
        shm_files.check_name(ledger)
    return Handle(what, kind.rstrip(b"\0").decode("ascii", "replace"), pid, None if rank < 0 else rank, nbytes,
                  uuid, data[at + n_uuid + n_ledger:], ledger, nonce)
