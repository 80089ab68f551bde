"""Connection setup for the tcp transport: one socket per pair of ranks and lane, met through the store.

Each rank listens on its advertised address (and on one more per further lane: another
interface named, see :mod:`._stripes`) and publishes ``tcp/<rank>`` (address, port, host
name, host identity, interface, lanes) in the store; then, lane by lane, it connects to every
lower rank and accepts every higher one. Both ends exchange HELLO frames carrying rank and world token (and
the claim of the connector's record), so a stray or garbage connection is dropped (and logged) without
disturbing the setup; handshakes at a listener run side by side, each within PYDIST_HANDSHAKE_TIMEOUT
(:mod:`.admission`).

With a shared token the HELLOs also carry nonces and proofs (:mod:`.hello`): a connection
is accepted only after both ranks proved they hold the token, so a peer without it cannot
inject a frame; it is refused and logged. With PYDIST_TLS_CERT/KEY/CA each connection runs
mutual TLS before its HELLOs (:mod:`.mesh_tls`).
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from ...core import deadline as _deadline
from ...core import init_marks
from ...core.deadline import Deadline
from ...core.errors import DistNetworkError
from ...core.settings import settings
from ...net.addresses import host_port, listen
from ...net.auth import AuthenticationError, token_of
from ...net.interfaces import interface_of
from ...net.tls import Contexts, contexts
from ...store._base import StoreTimeoutError
from .admission import Admission, listening_at
from .hello import Connector, read_frame
from .liveness import process_identity
from .mesh_tls import refused_by, secured
from .tls_socket import TlsSocket

log = logging.getLogger("pydist.transport")


@dataclass
class PeerRecord:
    rank: int
    address: str
    port: int
    hostname: str
    host_id: str
    iface: str = ""  # the interface holding ``address`` on the peer's host
    lanes: list = field(default_factory=list)  # [address, port, iface] of each further lane
    process: str = ""  # liveness.process_identity(): what /proc says about it on its own host
    claim: str = ""  # a random value this rank's HELLOs carry (checked by acceptors with no secret)

    def lane(self, k: int) -> PeerRecord:
        """The record as lane ``k`` reaches it (lane 0: this one)."""
        if k == 0 or k > len(self.lanes):
            return self
        address, port, iface = self.lanes[k - 1]
        return replace(self, address=address, port=port, iface=iface, lanes=[])

    @property
    def label(self) -> str:
        """How errors name the peer's host: ``node7 (10.1.0.7, eth1)``."""
        return f"{self.hostname} ({self.address}{self._on_iface})"

    @property
    def dialled(self) -> str:
        """The listening endpoint and its host: ``[fd00::7]:4242 (node7, eth1)``."""
        return f"{host_port(self.address, self.port)} ({self.hostname}{self._on_iface})"

    @property
    def where(self) -> str:
        """Each lane's address and interface, for debug output: ``10.1.0.7, eth0; 10.2.0.7, eth1``."""
        lanes = (self.lane(k) for k in range(1 + len(self.lanes)))
        return "; ".join(f"{lane.address}, {lane.iface or 'interface unknown'}" for lane in lanes)

    @property
    def _on_iface(self) -> str:
        return f", {self.iface}" if self.iface else ""


def _tune(sock: socket.socket, seconds: float) -> socket.socket:
    """No Nagle delay. No kernel keepalive nor TCP_USER_TIMEOUT: the peer's liveness is the
    transport's heartbeat (``seconds``: PYDIST_PEER_TIMEOUT, see TcpTransport._heartbeat); the
    kernel's timers fired on a live peer that was only slow to read (its receive window full
    for the user timeout), and could not see a stopped process (its kernel answers)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


#: the store key of lazy connections' directory of ranks (publish_and_meet)
DIRECTORY = "tcp/directory"


def publish_and_collect(store, rank: int, size: int, record: PeerRecord,
                        deadline: Deadline) -> tuple[dict[int, PeerRecord], str]:
    """Publish this rank's record and return every rank's record and the world token."""
    if rank == 0:
        store.set("tcp/token", uuid.uuid4().hex)
    store.set(f"tcp/{rank}", json.dumps(record.__dict__))
    keys = ["tcp/token"] + [f"tcp/{r}" for r in range(size)]
    try:
        store.wait(keys, _remaining_timedelta(deadline))
    except StoreTimeoutError as error:
        missing = [r for r in range(size) if not store.check([f"tcp/{r}"])]
        raise StoreTimeoutError(f"rank {rank}: ranks {missing} never registered their address in the store "
                                f"(their processes did not start, died, or cannot reach the store): {error}",
                                error.keys) from error
    values = store.multi_get(keys)
    init_marks.mark(init_marks.RECORDS_EXCHANGED)
    token = values[0].decode()
    return {r: PeerRecord(**json.loads(v)) for r, v in enumerate(values[1:])}, token


def publish(store, record: PeerRecord) -> None:
    """Publish a record (a rank joining later: its peers read it with ``read_records``)."""
    store.set(f"tcp/{record.rank}", json.dumps(record.__dict__))


def read_records(store, ranks: list[int], deadline: Deadline) -> tuple[dict[int, PeerRecord], str]:
    """The records of ``ranks`` and the world token (a joining rank, or ranks meeting it)."""
    keys = ["tcp/token"] + [f"tcp/{r}" for r in ranks]
    store.wait(keys, _remaining_timedelta(deadline))
    values = store.multi_get(keys)
    return {r: PeerRecord(**json.loads(v)) for r, v in zip(ranks, values[1:])}, values[0].decode()


def _remaining_timedelta(deadline: Deadline):
    from datetime import timedelta
    left = deadline.remaining()
    return timedelta(days=365) if left is None else timedelta(seconds=max(left, 0.001))


def connect_to(record: PeerRecord, rank: int, token: str, deadline: Deadline,
               auth_token: bytes | None = None, tls: Contexts | None = None,
               peer_timeout: float = 0.0, refused_for: float = 0.0, claim: str = "") -> socket.socket | TlsSocket:
    """Connect to a lower rank (with ``tls``: over mutual TLS), retrying with backoff until
    the deadline. Failed authentication (AuthenticationError) and a TLS refusal (an alert, a
    certificate this rank rejects, a peer not using TLS: TlsRefused) are not retried; a
    connection closed or reset without a word, before or after TLS, is: the acceptor cut it
    (a burst past its cap, a late handshake), which says nothing about this rank's
    certificate. ``peer_timeout``: the connection's heartbeat (see _tune). The peer listened
    before it published its record, so a refused connection means it is gone: after
    ``refused_for`` seconds of nothing but refusals (0: at the first) DistNetworkError names
    it and its address; ``claim``: this rank's record's (see hello.Connector)."""
    delay = 0.01
    last_error: BaseException | None = None
    refused_since: float | None = None
    while not deadline.expired():
        try:
            timeout = deadline.remaining()
            sock = socket.create_connection((record.address, record.port), timeout=min(timeout or 30, 30))
            try:
                if tls is not None:
                    sock = tls.client.wrap_socket(sock)
                handshake = Connector(rank, token, record.rank, auth_token, claim)
                sock.sendall(handshake.first)
                while not handshake.done:
                    reply = handshake.on_hello(read_frame(sock))
                    if reply:
                        sock.sendall(reply)
            except _CUT:
                sock.close()
                raise
            except ssl.SSLError as error:  # TLS 1.3: a refused certificate shows at the first read
                sock.close()
                raise refused_by(rank, record.rank, record.dialled, error) from None
            except BaseException:
                sock.close()
                raise
            return secured(_tune(sock, peer_timeout))
        except AuthenticationError as error:
            raise AuthenticationError(f"rank {rank} could not authenticate with rank {record.rank} at "
                                      f"{record.dialled}: authentication failed: {error}") from None
        except ConnectionRefusedError as error:
            refused_since = _deadline.now() if refused_since is None else refused_since
            if _deadline.now() - refused_since >= refused_for:
                raise _gone(rank, record, refused_for, error) from error
            last_error = error
            _deadline.sleep(min(delay, deadline.remaining() or delay))
            delay = min(delay * 2, 1.0)
        except (OSError, ValueError) as error:
            refused_since, last_error = None, error
            _deadline.sleep(min(delay, deadline.remaining() or delay))
            delay = min(delay * 2, 1.0)
    raise DistNetworkError(f"rank {rank} could not connect to rank {record.rank} at "
                           f"{record.dialled} before the timeout: "
                           f"{last_error}") from last_error


#: how a cut connection shows on the connector's side (an EOF, or a reset; under TLS also
#: an EOF the TLS layer reports): retried, never taken for a refusal
_CUT = (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


def _gone(rank: int, record: PeerRecord, refused_for: float, error: OSError) -> DistNetworkError:
    """The error of a peer whose published address refuses connections."""
    during = f" for {refused_for:g} s (PYDIST_CONNECT_TIMEOUT)" if refused_for else ""
    return DistNetworkError(f"rank {rank} could not connect to rank {record.rank} at {record.dialled}: {error}"
                            f"{during}; nothing listens there: rank {record.rank}'s process exited, or its address "
                            f"was left in the store by an earlier run of the job")


def accept_from(listener: socket.socket, expected: set[int], rank: int, token: str,
                deadline: Deadline, auth_token: bytes | None = None, tls: Contexts | None = None,
                records: dict[int, PeerRecord] | None = None, peer_timeout: float = 0.0,
                ) -> dict[int, socket.socket | TlsSocket]:
    """Accept one connection from each rank in ``expected``, handshaking side by side
    (:mod:`.admission`): strays, garbage, TLS failures and mismatches, failed authentication
    and (without a secret) HELLOs without the claim of the rank's record in ``records`` or
    claiming a rank accepted already are dropped and logged, never raised; DistNetworkError
    at the deadline names the ranks missing, the connections refused meanwhile, and the
    last failed accept (out of file descriptors) with this rank's listener."""
    claims = (lambda peer: records[peer].claim) if records is not None else (lambda peer: None)
    admission = Admission(rank, token, auth_token, tls, claims, settings().handshake_timeout, len(expected))
    accepted: dict[int, socket.socket | TlsSocket] = {}
    admission.listen(listener, lambda: expected - accepted.keys(), accepted.__contains__)
    try:
        while len(accepted) < len(expected):
            for peer, sock, _ in admission.take():  # without a secret, one per rank (Admission)
                if peer in accepted:  # proven: the rank retried (its first try failed on its side)
                    accepted.pop(peer).close()
                accepted[peer] = secured(_tune(sock, peer_timeout))
            if len(accepted) == len(expected):
                break
            if deadline.expired():
                raise _missing(rank, listener, sorted(expected - accepted.keys()), admission)
            deadline.wait(admission.poll)
    except BaseException:
        for done in accepted.values():
            done.close()
        raise
    finally:
        admission.close()
    return accepted


def _missing(rank: int, listener: socket.socket, missing: list[int], admission: Admission) -> DistNetworkError:
    """The error of a rank whose deadline passed before ranks ``missing`` connected."""
    refused = f"; refused meanwhile: {'; '.join(admission.refusals)}" if admission.refusals else ""
    error = admission.accept_error
    failed = (f"; accepting on {listening_at(listener)} failed: {error} (out of file descriptors? see ulimit -n)"
              if error is not None else "")
    missed = DistNetworkError(f"rank {rank} timed out waiting for connections from ranks {missing}{refused}{failed}")
    missed.__cause__ = error
    return missed


Connection = socket.socket | TlsSocket


def lane_count(one: PeerRecord, other: PeerRecord) -> int:
    """How many lanes (connections) join two ranks: both must offer an address for each."""
    return 1 + min(len(one.lanes), len(other.lanes))


def lane_token(token: str, lane: int) -> str:
    """The world token a lane's HELLOs carry (it names the lane)."""
    return token if lane == 0 else f"{token}/lane{lane}"


def open_listeners(address: str, lanes: list[str], backlog: int) -> list[socket.socket]:
    """A listening socket on ``address`` and on each further lane's address."""
    listeners: list[socket.socket] = []
    try:
        for each in [address, *lanes]:
            listeners.append(listen(each, backlog=backlog))
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    return listeners


def own_record(rank: int, hostname: str, host_id: str, addresses: list[str],
               listeners: list[socket.socket]) -> PeerRecord:
    """This rank's record: the address and port of each of its listeners (``addresses``:
    lane 0's first, as ``open_listeners`` got them)."""
    ports = [listener.getsockname()[1] for listener in listeners]
    further = [[a, port, interface_of(a)] for a, port in zip(addresses[1:], ports[1:])]
    return PeerRecord(rank, addresses[0], ports[0], hostname, host_id, interface_of(addresses[0]), further,
                      process_identity(), uuid.uuid4().hex)


def dial(mine: PeerRecord, theirs: PeerRecord, token: str, deadline: Deadline, peer_timeout: float,
         auth_token: bytes | None, tls: Contexts | None, refused_for: float = 0.0) -> list[Connection]:
    """One connection to ``theirs`` per lane both records offer, lane 0 first (see connect_to)."""
    connections: list[Connection] = []
    try:
        for k in range(lane_count(mine, theirs)):
            connections.append(connect_to(theirs.lane(k), mine.rank, lane_token(token, k), deadline, auth_token, tls,
                                          peer_timeout, refused_for, mine.claim))
    except BaseException:
        for connection in connections:
            connection.close()
        raise
    return connections


def listen_and_publish(store, rank: int, size: int, address: str, hostname: str, host_id: str, deadline: Deadline,
                       lanes: list[str]) -> tuple[list[socket.socket], dict[int, PeerRecord], dict[int, str], str]:
    """Listen on every lane and meet through the directory (``publish_and_meet``): (the
    listeners, the records known, every rank's host identity, the world token); connections
    come later (lazy.py)."""
    listeners = open_listeners(address, lanes, min(max(size, 16), 4096))
    try:
        record = own_record(rank, hostname, host_id, [address, *lanes], listeners)
        return (listeners, *publish_and_meet(store, rank, size, record, deadline))
    except BaseException:
        for listener in listeners:
            listener.close()
        raise


def publish_and_meet(store, rank: int, size: int, record: PeerRecord,
                     deadline: Deadline) -> tuple[dict[int, PeerRecord], dict[int, str], str]:
    """Rendezvous in O(N) store work: every rank publishes its record; rank 0 reads them all and
    publishes the directory (each rank's host identity, each distinct one once); the others
    read only that (a peer's record is read when it is dialled). (The records known: all on
    rank 0, its own elsewhere; every rank's host identity; the world token.)"""
    if rank == 0:
        records, token = publish_and_collect(store, rank, size, record, deadline)
        distinct = list(dict.fromkeys(r.host_id for r in records.values()))
        index = {host: k for k, host in enumerate(distinct)}
        store.set(DIRECTORY, json.dumps({"hosts": distinct, "of": [index[records[r].host_id] for r in range(size)]}))
        return records, {r: records[r].host_id for r in range(size)}, token
    store.set(f"tcp/{rank}", json.dumps(record.__dict__))
    try:
        store.wait([DIRECTORY], _remaining_timedelta(deadline))
    except StoreTimeoutError as error:
        missing = [r for r in range(size) if not store.check([f"tcp/{r}"])]
        raise StoreTimeoutError(f"rank {rank}: rank 0 did not publish the directory of ranks: ranks {missing} never "
                                f"registered their address in the store (their processes did not start, died, or "
                                f"cannot reach the store): {error}", error.keys) from error
    token, directory = (value.decode() for value in store.multi_get(["tcp/token", DIRECTORY]))
    init_marks.mark(init_marks.RECORDS_EXCHANGED)
    found = json.loads(directory)
    return {rank: record}, {r: found["hosts"][k] for r, k in enumerate(found["of"])}, token


def build_mesh(store, rank: int, size: int, address: str, hostname: str, host_id: str, deadline: Deadline,
               lanes: list[str] | None = None, peer_timeout: float = 0.0, refused_for: float = 20.0,
               ) -> tuple[dict[int, list[Connection]], dict[int, PeerRecord], str]:
    """Sockets to every other rank (blocking mode), lane 0 first, every rank's record, the
    world token. ``lanes``: this rank's further addresses, each listened on; two ranks open
    one connection per lane both offer, lane by lane (the HELLO's world token names the lane);
    ``peer_timeout``: every connection's heartbeat (PYDIST_PEER_TIMEOUT, see _tune);
    ``refused_for``: how long a lower rank's address may refuse (PYDIST_CONNECT_TIMEOUT, see connect_to)."""
    with ExitStack() as listening:
        listeners = [listening.enter_context(sock) for sock in open_listeners(address, lanes or [], max(size, 16))]
        record = own_record(rank, hostname, host_id, [address, *(lanes or [])], listeners)
        records, token = publish_and_collect(store, rank, size, record, deadline)
        auth_token, tls = token_of(store), contexts()
        sockets: dict[int, list[Connection]] = {}
        try:
            for k, listener in enumerate(listeners):
                world = lane_token(token, k)
                peers = [p for p in range(size) if p != rank and k < lane_count(records[rank], records[p])]
                for peer in (p for p in peers if p < rank):
                    sockets.setdefault(peer, []).append(
                        connect_to(records[peer].lane(k), rank, world, deadline, auth_token, tls, peer_timeout,
                                   refused_for, records[rank].claim))
                accepted = accept_from(listener, {p for p in peers if p > rank}, rank, world, deadline, auth_token,
                                       tls, {r: each.lane(k) for r, each in records.items()}, peer_timeout)
                for peer in sorted(accepted):
                    sockets.setdefault(peer, []).append(accepted[peer])
        except BaseException:
            for sock in (s for socks in sockets.values() for s in socks):
                sock.close()
            raise
    return sockets, records, token
