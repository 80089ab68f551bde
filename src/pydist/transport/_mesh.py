"""Connection setup for the tcp transport: one socket per pair of ranks, met through the store.

Each rank listens on its advertised address and publishes ``tcp/<rank>`` (address, port,
host name, host identity) in the store; then it connects to every lower rank and accepts
every higher one. Both ends exchange HELLO frames carrying rank and world token, so a stray
or garbage connection is dropped (and logged) without disturbing the setup.
"""
from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from dataclasses import dataclass

from .._deadline import Deadline
from .._errors import DistNetworkError
from ._framing import HEADER_SIZE, FramingError, Kind, decode_header, encode_frame

log = logging.getLogger("pydist.transport")


@dataclass
class PeerRecord:
    rank: int
    address: str
    port: int
    hostname: str
    host_id: str


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed during handshake")
        chunks += chunk
    return bytes(chunks)


def _send_hello(sock: socket.socket, rank: int, token: str) -> None:
    sock.sendall(encode_frame(Kind.HELLO, 0, 0, 0, json.dumps({"rank": rank, "token": token}).encode()))


def _read_hello(sock: socket.socket, token: str) -> int:
    """The peer's rank from its HELLO frame; ValueError/ConnectionError on anything else."""
    header = decode_header(_recv_exactly(sock, HEADER_SIZE))
    if header.kind != Kind.HELLO or header.nbytes > 4096:
        raise FramingError(f"expected a HELLO frame, got {header.kind.name} of {header.nbytes} bytes")
    hello = json.loads(_recv_exactly(sock, header.nbytes))
    if hello.get("token") != token:
        raise FramingError("HELLO from another job (world token differs)")
    return int(hello["rank"])


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def publish_and_collect(store, rank: int, size: int, record: PeerRecord, deadline: Deadline) -> tuple[list[PeerRecord], str]:
    """Publish this rank's record and return every rank's record and the world token."""
    if rank == 0:
        store.set("tcp/token", uuid.uuid4().hex)
    store.set(f"tcp/{rank}", json.dumps(record.__dict__))
    keys = ["tcp/token"] + [f"tcp/{r}" for r in range(size)]
    store.wait(keys, _remaining_timedelta(deadline))
    values = store.multi_get(keys)
    token = values[0].decode()
    return [PeerRecord(**json.loads(v)) for v in values[1:]], token


def _remaining_timedelta(deadline: Deadline):
    from datetime import timedelta
    left = deadline.remaining()
    return timedelta(days=365) if left is None else timedelta(seconds=max(left, 0.001))


def connect_to(record: PeerRecord, rank: int, token: str, deadline: Deadline) -> socket.socket:
    """Connect to a lower rank, retrying with backoff until the deadline."""
    delay, last_error = 0.01, None
    while not deadline.expired():
        try:
            timeout = deadline.remaining()
            sock = socket.create_connection((record.address, record.port), timeout=min(timeout or 30, 30))
            try:
                _send_hello(sock, rank, token)
                if _read_hello(sock, token) != record.rank:
                    raise FramingError(f"{record.address}:{record.port} is not rank {record.rank}")
            except BaseException:
                sock.close()
                raise
            return _tune(sock)
        except (OSError, ValueError) as error:
            last_error = error
            time.sleep(min(delay, deadline.remaining() or delay))
            delay = min(delay * 2, 1.0)
    raise DistNetworkError(f"rank {rank} could not connect to rank {record.rank} at "
                           f"{record.address}:{record.port} ({record.hostname}) before the timeout: "
                           f"{last_error}") from last_error


def accept_from(listener: socket.socket, expected: set[int], rank: int, token: str,
                deadline: Deadline) -> dict[int, socket.socket]:
    """Accept one connection from each rank in ``expected``; drop strays and garbage."""
    accepted: dict[int, socket.socket] = {}
    while len(accepted) < len(expected):
        remaining = deadline.remaining()
        if remaining == 0:
            missing = sorted(expected - accepted.keys())
            for sock in accepted.values():
                sock.close()
            raise DistNetworkError(f"rank {rank} timed out waiting for connections from ranks {missing}")
        listener.settimeout(remaining)
        try:
            sock, where = listener.accept()
        except socket.timeout:
            continue
        try:
            sock.settimeout(min(remaining or 10, 10))
            peer = _read_hello(sock, token)
            if peer not in expected or peer in accepted:
                raise FramingError(f"unexpected HELLO from rank {peer}")
            _send_hello(sock, rank, token)
        except (OSError, ValueError) as error:
            log.warning("pydist rank %d dropped a connection from %s: %s", rank, where, error)
            sock.close()
            continue
        accepted[peer] = _tune(sock)
    return accepted


def build_mesh(store, rank: int, size: int, address: str, hostname: str, host_id: str,
               deadline: Deadline) -> tuple[dict[int, socket.socket], list[PeerRecord], str]:
    """Sockets to every other rank (blocking mode), every rank's record, the world token."""
    with socket.create_server((address, 0), backlog=max(size, 16)) as listener:
        record = PeerRecord(rank, address, listener.getsockname()[1], hostname, host_id)
        records, token = publish_and_collect(store, rank, size, record, deadline)
        sockets: dict[int, socket.socket] = {}
        try:
            for peer in range(rank):
                sockets[peer] = connect_to(records[peer], rank, token, deadline)
            sockets.update(accept_from(listener, set(range(rank + 1, size)), rank, token, deadline))
        except BaseException:
            for sock in sockets.values():
                sock.close()
            raise
    return sockets, records, token
