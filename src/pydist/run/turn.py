"""The agents' turn, on one machine, to start the rendezvous store at one address and port.

Linux lets SO_REUSEADDR sockets that bind one port at the same moment both fail to listen
(EADDRINUSE) or both listen: 2 simultaneous agents, 3,000 tries, 19 and 3 times. Each then
took it for "another agent hosts it" and was refused for ``connect_timeout``, or two stores
shared a port. So the agents take turns: the turn is an abstract Unix socket named after the
store's address and port (:func:`turn_name`), bound and listening while its agent starts the
store. The kernel releases it when it is closed or its agent dies, and it is per network
namespace, as the port is. Jobs on different addresses with one port take different turns.

Anyone on the machine can bind that name, so a waiting agent asks who holds it: on a
connection to the turn ``SO_PEERCRED`` gives the holder's pid and uid, and a pydist-run agent
answers :data:`TURN_HELLO` at once. The agent waits (up to the rendezvous read timeout) only
for a pydist-run agent of its own user. Any other holder — another user's process, a process
that does not answer the hello within :data:`ANSWER_SECONDS`, a socket that does not listen —
fails the launch at once with an :class:`EndpointError` naming it (pid, uid, command where
visible) and the port. Where there are no abstract sockets (not Linux), no turn is taken.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from collections.abc import Iterator

from ..net.addresses import host_port
from .holders import Holder, peer_of, unix_listener

#: What a pydist-run agent holding the turn says to whoever connects to it.
TURN_HELLO = b"pydist-run agent: turn 1\n"
#: Seconds a program on the turn or the port has to answer before it is taken for a stranger:
#: a pydist-run agent or store answers within milliseconds; this leaves room for a loaded host.
ANSWER_SECONDS = 5.0
#: Seconds between looks at whether another agent of this machine is done starting the store.
TURN_POLL_SECONDS = 0.005


class EndpointError(RuntimeError):
    """The store could not be started or reached."""


def store_address(host: str) -> str:
    """The address the store's server binds for ``host``, as it resolves it (IPv4 preferred);
    ``host`` itself if it does not resolve."""
    try:
        infos = socket.getaddrinfo(host or None, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return host
    return str(min(infos, key=lambda info: info[0] != socket.AF_INET)[4][0])


def turn_name(host: str, port: int) -> str:
    """The abstract socket that is the turn for a store at ``host:port``."""
    return f"\0pydist-endpoint-{store_address(host)}-{port}"


class TurnHolder:
    """The turn, held: a listening socket whose thread answers every connection with
    :data:`TURN_HELLO` (``answered`` counts them) until :meth:`close`."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.answered = 0
        sock.listen(64)
        self._thread = threading.Thread(target=self._answer, name="pydist-run-turn", daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(TURN_HELLO)
            self.answered += 1

    def close(self) -> None:
        """Release the turn (a thread blocked in accept wakes on the shutdown)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(1.0)  # real time: a bound on a thread whose socket was shut


def take_turn(host: str, port: int, seconds: float) -> TurnHolder | None:
    """Wait for the turn at ``host:port`` and take it; None where there are no abstract
    sockets. Raises EndpointError when a stranger holds it, or a pydist-run agent of this user
    held it for ``seconds``."""
    name, where = turn_name(host, port), host_port(host, port)
    deadline = time.monotonic() + seconds
    refused_since: float | None = None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            return TurnHolder(sock)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                return None  # no abstract sockets here
        holder = _ask_holder(name, where)
        now = time.monotonic()
        if holder is None:  # released this moment, or a socket that does not listen
            refused_since = refused_since if refused_since is not None else now
            if now - refused_since >= ANSWER_SECONDS:
                found = unix_listener(name) or Holder()
                raise EndpointError(_stranger(where, name, found, "through a socket that does not listen, so it is "
                                              "not a pydist-run agent"))
        else:
            refused_since = None
            if now >= deadline:
                raise EndpointError(f"cannot start the store on {where}: the pydist-run agent {holder.describe()} "
                                    f"was starting one there for {seconds:g}s")
        time.sleep(TURN_POLL_SECONDS)  # real time: another process's start-up


@contextlib.contextmanager
def hosting_turn(host: str, port: int, seconds: float) -> Iterator[None]:
    """Hold the turn at ``host:port`` (see :func:`take_turn`) for the ``with`` block; port 0
    (a free port) needs none."""
    holder = take_turn(host, port, seconds) if port else None
    try:
        yield
    finally:
        if holder is not None:
            holder.close()


def _ask_holder(name: str, where: str) -> Holder | None:
    """The pydist-run agent of this user that holds turn ``name``; None if nothing listens
    there (released, or never listening). Raises EndpointError for any other holder."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(ANSWER_SECONDS)
        try:
            probe.connect(name)
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        except OSError as exc:  # a full backlog nobody accepts from: timed out
            raise EndpointError(_stranger(where, name, unix_listener(name) or Holder(),
                                          f"which does not accept connections ({exc}), so it is not a "
                                          "pydist-run agent")) from None
        holder = peer_of(probe)
        if holder.uid != os.geteuid():
            raise EndpointError(_stranger(where, name, holder, "not a pydist-run agent of this user "
                                          f"(uid {os.geteuid()})"))
        if _read_hello(probe) != TURN_HELLO:
            raise EndpointError(_stranger(where, name, holder, "which did not answer as a pydist-run agent within "
                                          f"{ANSWER_SECONDS:g}s"))
        return holder


def _read_hello(sock: socket.socket) -> bytes:
    """What ``sock`` sent before it closed, at most one hello's length, within its timeout."""
    received = b""
    with contextlib.suppress(OSError):
        while len(received) < len(TURN_HELLO):
            data = sock.recv(len(TURN_HELLO) - len(received))
            if not data:
                break
            received += data
    return received


def _stranger(where: str, name: str, holder: Holder, what: str) -> str:
    return (f"cannot start the store on {where}: the launcher's turn for it (abstract socket "
            f"@{name.lstrip(chr(0))}) is held by {holder.describe()}, {what}. Choose another port "
            "(--rdzv-endpoint HOST:PORT, --master-port) or stop that process")
