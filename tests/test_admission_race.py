"""Issue 46, finding 6: the acceptor sent its last HELLO before the handshake left the
admission's list of handshakes in flight, so a reap at the deadline or the cap's eviction
in between closed a connection its peer already took as established.

Each test hooks the accepted socket's send: right after the last HELLO went out, the fake
clock passes the handshake timeout and the admission is reaped (or one more connection
arrives past a cap of one). The connection must still be handed over, never cut.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

from test_log_limit import clock  # noqa: F401 - a fixture: a frozen fake clock

from pydist.net import admission as policy
from pydist.transport.tcp.admission import Admission
from pydist.transport.tcp.hello import Connector, read_frame

SECONDS = 60  # every wait's bound: generous (a loaded machine), never reached by a passing test
TIMEOUT = 600.0  # the handshake timeout: only the fake clock passes it


class _Hooked(socket.socket):
    """An accepted socket that runs ``after_send`` once, right after its first send (the
    acceptor's only HELLO without a secret: its last)."""

    after_send: Callable[[], None] | None = None

    def _sent(self) -> None:
        hook, self.after_send = self.after_send, None
        if hook is not None:
            hook()

    def send(self, data, *args):
        sent = super().send(data, *args)
        self._sent()
        return sent

    def sendall(self, data, *args):
        super().sendall(data, *args)
        self._sent()


def _accepted(listener: socket.socket) -> tuple[socket.socket, _Hooked, object]:
    """(the dialling side, the accepted side hooked, its peer address)."""
    dialled = socket.create_connection(listener.getsockname(), timeout=SECONDS)
    accepted, where = listener.accept()
    return dialled, _Hooked(accepted.family, accepted.type, accepted.proto, accepted.detach()), where


def _outcome(gate: Admission, dialled: socket.socket) -> str:
    """Rank 1's side of the HELLOs (no secret) in a thread, done once the acceptor's HELLO
    came (rank 1 then takes the connection as established), while this thread drives the
    admission: "handed over" once it hands rank 1's connection over, "cut" once rank 1 sees
    its connection end."""
    connector = Connector(1, "world", 0, None)
    established = threading.Event()

    def rank_1() -> None:
        dialled.sendall(connector.first)
        connector.on_hello(read_frame(dialled))
        if connector.done:
            established.set()

    threading.Thread(target=rank_1, daemon=True).start()
    ends = time.monotonic() + SECONDS
    while time.monotonic() < ends:
        gate.poll(0.01)
        if [peer for peer, _, _ in gate.take()] == [1]:
            assert established.wait(SECONDS)
            return "handed over"
        if established.is_set() and select.select([dialled], [], [], 0)[0] and dialled.recv(1, socket.MSG_PEEK) == b"":
            return "cut"
    return "neither"


def test_a_reap_at_the_deadline_right_after_the_last_hello_does_not_cut_it(clock):  # noqa: F811 - the fixture
    listener = socket.create_server(("127.0.0.1", 0))
    gate = Admission(0, "world", None, None, lambda peer: None, TIMEOUT, peers=1)
    dialled, accepted, where = _accepted(listener)
    try:
        def deadline_passes() -> None:
            clock.advance(TIMEOUT + 1)
            gate.reap()

        accepted.after_send = deadline_passes
        gate.start(accepted, where, {1}, lambda peer: False)
        assert _outcome(gate, dialled) == "handed over"
    finally:
        gate.close()
        dialled.close()
        listener.close()


def test_the_caps_eviction_right_after_the_last_hello_does_not_cut_it(clock, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    gate = Admission(0, "world", None, None, lambda peer: None, TIMEOUT, peers=0)
    dialled, accepted, where = _accepted(listener)
    later: list[socket.socket] = []
    try:
        def one_more_arrives() -> None:
            other, other_accepted, other_where = _accepted(listener)
            later.append(other)
            gate.start(other_accepted, other_where, {1}, lambda peer: False)

        accepted.after_send = one_more_arrives
        gate.start(accepted, where, {1}, lambda peer: False)
        assert _outcome(gate, dialled) == "handed over"
    finally:
        gate.close()
        for sock in (dialled, *later, listener):
            sock.close()
