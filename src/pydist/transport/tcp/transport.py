"""TCP transport: one connection per pair of ranks (per interface named, see stripes), one
I/O thread per world.

Each peer's connection (connection.py) sends at once from the caller's thread and queues
what the kernel does not take for the I/O thread. The I/O thread reads every connection,
except while a caller blocked on a receive has borrowed them (``TcpTransport.drive``,
PYDIST_TCP_READER=caller; see poller): that caller reads the sockets itself until its
receive completes, as MPI progress engines do, so a message costs no hand-off between
threads. Whoever reads, a frame whose receive is already posted lands straight in the
destination buffer (large payloads with no intermediate copy); others are held as
unexpected until matched. Past PYDIST_MAX_UNEXPECTED_BYTES held from one peer, and with no
receive wanting its data, the I/O thread stops reading that peer (between two frames) until
a receive wants it, so TCP's flow control blocks a sender that runs ahead (see flow). A peer
that disconnects fails every receive and send involving it with PeerFailedError naming its
rank and host (reported through ``on_peer_gone``); a clean shutdown is announced by a BYE
frame so the error can say so. A peer's ABORT frame is reported to ``events``.
"""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from ...core import deadline as _deadline
from ...core.deadline import Deadline
from ...core.errors import DistBackendError, DistError, PeerFailedError
from ...core.settings import Settings
from ...net.auth import token_of
from ...net.tls import contexts
from ..abort import abort_payload, aborted_by
from ..base import Events, MessageKey, NetworkTransport, Request, completed_request
from ..framing import FramingError, Kind, encode_frame, encode_header
from ..goodbye import exit_payload, shutdown_payload
from ..identity import lane_addresses
from ..matching import Matcher
from .caller_reads import CallerReads
from .connection import Connection
from .failures import PeerFailures
from .heartbeat import Heartbeat
from .joining import JoinListener, listen_to_join
from .lazy import Dialer, lazy, meet_on_first_use
from .mesh import build_mesh, lane_count, listen_and_publish
from .peers import Peers
from .poller import Poller
from .stripes import bounds, join, part_key

log = logging.getLogger("pydist.transport")

FLUSH_SECONDS = 10.0  # close(): how long queued sends may take to drain
LINGER_SECONDS = 2.0  # close(): how long to wait for peers' goodbye before closing anyway
#: unfinished sends kept per group before the finished ones are dropped from the list
UNSENT_TRIM = 32


class TcpTransport(CallerReads, Peers, PeerFailures, NetworkTransport):
    """The tcp transport of one rank: sockets to all peers and their I/O thread."""

    def __init__(self, rank: int, size: int, store, deadline: Deadline, address: str, hostname: str,
                 host_id: str, matcher: Matcher, events: Events, settings: Settings,
                 on_peer_gone: Callable[[int, BaseException], None] | None = None, lanes: list[str] | None = None,
                 joining: bool = False):
        """``on_peer_gone``: told when a peer's connection dies (default: ``events.peer_gone``);
        ``lanes``: further addresses to listen on, one connection per peer on each (default:
        the other interfaces PYDIST_SOCKET_IFNAME names, see ``lane_addresses``); ``joining``:
        this rank joins a running job: it connects to nobody now, publishes its record and
        waits for the job's ranks to connect (see ``connect`` and joining.py)."""
        self.rank, self.size = rank, size
        self.matcher, self.events = matcher, events
        self._on_peer_gone = on_peer_gone or events.peer_gone
        self.failure_heard: str | None = None  # the first peer failure heard of (see _heard)
        self.caller_reads = settings.tcp_reader == "caller"
        self.peer_timeout = settings.peer_timeout
        self._heart = Heartbeat(self, settings.peer_timeout)
        self._stripe_bytes = settings.stripe_bytes or (1 << 62)
        self._failed_while_read = False
        self._store = store  # where the job's records are: ranks joining later are met through it
        lanes = lane_addresses(address, settings) if lanes is None else lanes
        self._join: JoinListener | None = None
        self._dialer: Dialer | None = None
        sockets: dict = {}
        listeners: list = []
        hosts: dict[int, str] = {}
        if joining:
            self.token, self._join = listen_to_join(store, rank, address, hostname, host_id, lanes, deadline,
                                                    self.peer_timeout)
            self.records = {rank: self._join.record}
        elif lazy(settings.tcp_connect, size):
            listeners, self.records, hosts, self.token = listen_and_publish(store, rank, size, address, hostname,
                                                                            host_id, deadline, lanes)
        else:
            sockets, self.records, self.token = build_mesh(store, rank, size, address, hostname, host_id, deadline,
                                                           lanes, settings.peer_timeout, settings.connect_timeout)
        self.hosts = hosts if listeners else {peer: record.host_id for peer, record in self.records.items()}
        #: each peer's connections, lane 0 (every message under PYDIST_STRIPE_BYTES) first
        self._lanes = {peer: [Connection(self, peer, sock, self.records[peer].lane(k).label)
                              for k, sock in enumerate(socks)] for peer, socks in sockets.items()}
        self._every = [conn for lanes in self._lanes.values() for conn in lanes]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller = Poller(self._wake_r.fileno(), self._wake)
        self._arm_lock = threading.Lock()
        self._by_fd = {conn.fd: conn for conn in self._every}
        for conn in self._every:
            self._arm(conn)
        self._pending_lock = threading.Lock()
        self._pending_write: list[Connection] = []
        self.matcher.throttle.resume = self._resume_reading
        self._pending_fail: list[tuple[Connection, BaseException]] = []
        self._pending_calls: list[Callable[[], None]] = []  # for the I/O thread (see _do_later)
        self._parts: dict[Request, list[Request]] = {}  # striped receives in progress: their parts
        self._unsent: dict[int, list[Request]] = {}  # group -> sends not finished yet (see fail_sends)
        self._unsent_lock = threading.Lock()
        self._stopping = False
        self._closed = False
        self._extra: dict[int, list[Connection]] = {}  # crossed dials' connections, read only (see lazy)
        self._install_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"pydist-tcp-io-{rank}", daemon=True)
        self._thread.start()
        if listeners:  # connections on first use: accept from now on
            self._dialer, self._join = meet_on_first_use(self, listeners, token_of(store), contexts())

    # -- NetworkTransport ------------------------------------------------------------------------
    def isend(self, peer: int, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to itself over tcp")
        lanes = self._lanes.get(peer) or self._dial(peer)
        if isinstance(lanes, BaseException):
            return completed_request(peer, data, lanes)
        request = Request(peer, data)
        request.drive = self.driver(data.nbytes)  # its waiter reads arrivals meanwhile (they may be what it waits for)
        parts = self._parts_of(peer, data.nbytes, call)
        if parts:
            join(request, [self._send_on(lanes[k], data[a:b], part_key(key, k), call)
                           for k, (a, b) in enumerate(parts)])
        else:
            self._send_on(lanes[0], data, key, call, request)
        return request

    def _parts_of(self, peer: int | None, nbytes: int, call: int) -> list[tuple[int, int]]:
        """How a message goes to or comes from ``peer``: (start, stop) of each lane's part, or
        [] to go whole on lane 0. Both ends decide alike: a collective's message (``call``
        set: both know its size) of PYDIST_STRIPE_BYTES or more, to a peer with several lanes."""
        if peer is None or not call or nbytes < self._stripe_bytes:
            return []
        connected = self._lanes.get(peer)  # not yet (lazy): the lanes both records offer
        lanes = len(connected) if connected else lane_count(self.record(self.rank), self.record(peer))
        return bounds(nbytes, lanes) if lanes > 1 else []

    def _send_on(self, conn: Connection, data: memoryview, key: MessageKey, call: int,
                 request: Request | None = None) -> Request:
        """Send ``data`` as one frame on ``conn``, completing ``request`` (made if None)."""
        request = request or Request(conn.peer, data)
        header = memoryview(encode_header(Kind.DATA, key.group, key.seq, key.tag, data.nbytes, call))
        conn.send([header, data], request)
        if not request.done():
            self._track_unsent(key.group, request)
        return request

    def _track_unsent(self, group: int, request: Request) -> None:
        """A send of ``group`` not finished yet: an abort of the group fails it (a broadcast
        root only sends: without this it would learn of the abort only when the peer's socket
        closes, and name that peer instead of the dead one)."""
        with self._unsent_lock:
            sends = self._unsent.setdefault(group, [])
            if len(sends) >= UNSENT_TRIM:
                sends[:] = [r for r in sends if not r.done()]
            sends.append(request)

    def fail_sends(self, group: int, error: BaseException) -> None:
        with self._unsent_lock:
            sends = self._unsent.pop(group, [])
        for request in sends:
            request.complete(error)

    def irecv(self, peer: int | None, data: memoryview, key: MessageKey, call: int = 0) -> Request:
        """A collective's message of PYDIST_STRIPE_BYTES or more from a peer with several lanes
        arrives in parts, one per lane (as ``isend`` sends it); others whole on lane 0."""
        if peer is not None and peer not in self._lanes and self._dialer is not None:
            self._dialer.soon(peer)  # a live sender dials first; a peer that is gone is named soon
        request = Request(peer, data, call)
        request.drive = self.driver(data.nbytes)
        cuts = self._parts_of(peer, data.nbytes, call)
        if cuts:
            parts = [Request(peer, data[a:b], call) for a, b in cuts]
            for k, part in enumerate(parts):
                self.matcher.post(part, peer, part_key(key, k))
            self._parts[request] = parts
            join(request, parts)
            request.add_callback(self._forget_parts)
        else:
            self.matcher.post(request, peer, key)
        return request

    def _forget_parts(self, request: Request) -> None:
        self._parts.pop(request, None)

    def connections(self) -> list[Connection]:
        """Every connection to every peer (each lane of each)."""
        return list(self._every)

    def lanes(self, peer: int) -> list[Connection]:
        """The connections to ``peer``, lane 0 first (dialled now with lazy connections)."""
        lanes = self._lanes.get(peer) or self._dial(peer)
        if isinstance(lanes, BaseException):
            raise lanes
        return list(lanes)

    def _read(self, conn: Connection) -> None:
        """Read what ``conn`` has (the reading thread); a broken peer is failed, one that sent
        what this rank cannot take is refused (see failures)."""
        if conn.error is not None:
            return
        try:
            conn.on_readable()
        except (FramingError, MemoryError) as error:
            self.refuse(conn, error)
        except (OSError, EOFError) as error:
            self._drop(conn, error)

    def cancel(self, request: Request) -> None:
        for part in self._parts.get(request, [request]):
            self.matcher.cancel(part, DistBackendError("receive cancelled"))

    def peer_host(self, peer: int) -> str:
        try:
            return self.record(peer).label
        except DistError:  # the store is gone (lazy connections read a record when it is needed)
            return f"host {self.hosts.get(peer, 'unknown')}"

    def endpoint(self) -> str:
        return self.records[self.rank].where

    def abort(self, peers: list[int], group: int, error: BaseException, known_dead: list[int]) -> None:
        payload = abort_payload(error, known_dead)
        frame = memoryview(encode_frame(Kind.ABORT, group, 0, 0, payload))
        for peer in peers:
            if peer in self._lanes:  # an unconnected peer (lazy) waits on nothing from this rank
                self._lanes[peer][0].send([frame], None)

    def listening_addresses(self) -> list[str]:
        own = self.records[self.rank]
        return [own.address, *(lane[0] for lane in own.lanes)]

    def announce_exit(self, cause: str | None) -> None:
        if self._closed:
            return
        frame = memoryview(encode_frame(Kind.BYE, 0, 0, 0, exit_payload(cause)))
        for conn in self._every:
            conn.send([frame], None)

    def close(self) -> None:
        """Flush queued sends, send BYE and EOF, wait briefly for peers' EOF (so nothing they
        still send hits a closed socket), stop the I/O thread, close everything."""
        if self._closed:
            return
        self._closed = True
        if self._join is not None:
            self._join.close()
        deadline = Deadline.after(FLUSH_SECONDS)
        _deadline.poll_until(lambda: all(c.idle() for c in self._every), deadline)
        bye = memoryview(encode_frame(Kind.BYE, 0, 0, 0, shutdown_payload(self.failure_heard)))
        for conn in self._every:
            conn.send([bye], None)
        _deadline.poll_until(lambda: all(c.idle() for c in self._every), deadline)
        for conn in self._every:
            conn.closing = True  # read to every peer's EOF, paused or not
            self._arm(conn)
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        _deadline.poll_until(lambda: all(c.error is not None for c in self._every),
                         Deadline.after(LINGER_SECONDS))
        self._stopping = True
        self._wake()
        self._thread.join(timeout=FLUSH_SECONDS)  # real time: a bound on a thread told to stop, not a timeout
        for conn in self._every:
            conn.fail(None)
        self._poller.close()
        for conn in self._every:
            conn.sock.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- I/O thread -----------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def want_write(self, conn: Connection) -> None:
        with self._pending_lock:
            self._pending_write.append(conn)
        self._wake()

    def _resume_reading(self, peer: int) -> None:
        """Any thread: read from ``peer`` again (a receive wants its data; see ..flow)."""
        for conn in self._lanes.get(peer, []):  # none: a peer of another transport (shared memory)
            self._arm(conn)

    def should_pause(self, conn: Connection) -> bool:
        """The reading thread, between frames: stop reading ``conn`` (the matcher holds too
        much of its unexpected data and nothing wants it)."""
        if self._closed or not self.matcher.should_pause(conn.peer):
            return False
        self._arm(conn)  # every change of the paused set is followed by an _arm: the last one wins
        return True

    def _arm(self, conn: Connection, write: bool | None = None) -> None:
        """Any thread: wait for ``conn``'s socket to be readable (unless paused or failed)
        and, if ``write`` (None: as before), writable."""
        with self._arm_lock:  # the state read and its registration as one step: the last call wins
            if write is not None:
                conn.write_armed = write
            alive = conn.error is None
            self._poller.want(conn.fd, alive and conn.reading, alive and conn.write_armed)

    def send_failed(self, conn: Connection, error: BaseException) -> None:
        """A send failed on a caller's thread: the I/O thread drops ``conn``, because only a
        thread that reads the sockets may abandon the frame half read from it."""
        with self._pending_lock:
            self._pending_fail.append((conn, error))
        self._wake()

    def _do_later(self, call: Callable[[], None]) -> None:
        """Have the I/O thread run ``call`` (it may fail connections: only the reading thread may)."""
        with self._pending_lock:
            self._pending_calls.append(call)
        self._wake()

    def peer_aborted(self, peer: int, group: int, payload: bytes) -> None:
        """``peer``'s ABORT frame for ``group`` arrived (the reading thread)."""
        error = aborted_by(peer, self.records[peer].hostname, payload)
        if isinstance(error, PeerFailedError) and error.rank is not None:
            self._heard(error.rank, error.host)
        self.events.abort_group(group, error)

    def peer_lost(self, peer: int, error: BaseException) -> None:
        """A connection to ``peer`` failed with ``error`` (its PeerFailedError): a failure of the
        peer unless one of its failed connections (crossed dials' too) says it shut down."""
        failed = [conn for conn in self._connections_to(peer) if conn.error is not None]
        if all(conn.peer_failed() for conn in failed):
            self._heard(peer, getattr(error, "host", None))
        self._on_peer_gone(peer, error)

    def _heard(self, peer: int, host: str | None) -> None:
        """``peer`` failed: the first such is told in this rank's goodbye (close), so that the
        peers still waiting on this rank name it too."""
        if self.failure_heard is None:
            self.failure_heard = f"rank {peer} on {host} failed" if host else f"rank {peer} failed"

    def _apply_pending(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        with self._pending_lock:
            writes, self._pending_write = self._pending_write, []
            fails, self._pending_fail = self._pending_fail, []
            calls, self._pending_calls = self._pending_calls, []
        for conn, error in fails:
            self._drop(conn, error)
        for call in calls:
            call()
        for conn in writes:
            self._flush(conn)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # noqa: BLE001 - never die silently: fail every waiter with it
            self.io_thread_died(error)

    def _serve(self) -> None:
        """The I/O thread's loop: wait, apply what other threads asked, read, write, beat."""
        poller = self._poller
        while not self._stopping:
            woken, readable, writable = self._heart.timed_wait(poller.wait_io)
            if woken:
                self._apply_pending()
            if readable:
                with poller.read_lock:
                    if not poller.borrowed:  # else a caller reads them (this event is stale)
                        for fd in poller.ready_reads():
                            self._read(self._by_fd[fd])
            for fd in writable:
                self._flush(self._by_fd[fd])
            self._heart.tick()

    def stalled(self) -> float | None:
        """Seconds this process was just stalled, longer than PYDIST_PEER_TIMEOUT (Heartbeat.stalled)."""
        return self._heart.stalled()

    @property
    def connections_now(self) -> list[Connection]:
        """Every connection (each lane of each peer), as the I/O thread sees them now."""
        return self._every

    @property
    def closed(self) -> bool:
        return self._closed

    def _flush(self, conn: Connection) -> None:
        """I/O thread: send what ``conn`` has queued; wait for it to be writable if the
        kernel did not take everything. A broken peer is failed."""
        if conn.error is not None:
            return
        try:
            self._arm(conn, not conn.flush())
        except OSError as error:
            self._drop(conn, error)

