"""Waits across src run on pydist's clock (core.deadline): under a MockClock each of these
timeouts passes on fake time, in a fraction of the real time it names. Each test would take
the timeout's real seconds (a minute or more) if its wait read the real clock."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from pydist.core import deadline as _deadline
from pydist.core.deadline import Deadline
from pydist.core.errors import DistBackendError, DistNetworkError
from pydist.groups.work import Work
from pydist.net.addresses import listen
from pydist.store import HashStore, TCPStore
from pydist.store._base import StoreTimeoutError
from pydist.testing import free_port
from pydist.testing.clock import MockClock

#: Real seconds a test may take: far below the fake timeouts (60 s and more), far above what a
#: loaded machine adds.
REAL_BOUND = 10.0


class _Elapsed:
    """Real and fake seconds spent inside the block (the fake ones on ``clock``)."""

    def __init__(self, clock: MockClock):
        self.clock = clock

    def __enter__(self) -> _Elapsed:
        self.real, self.fake = time.monotonic(), self.clock.monotonic()
        return self

    def __exit__(self, *_) -> None:
        self.real = time.monotonic() - self.real
        self.fake = self.clock.monotonic() - self.fake


def test_a_tcpstore_client_gives_up_connecting_on_fake_time():
    """The client's connect retries (backoff sleeps on the clock) end at its 5-minute timeout."""
    port = free_port()  # nothing listens there: every attempt is refused at once
    with MockClock().installed() as clock, _Elapsed(clock) as spent:
        with pytest.raises(DistNetworkError, match=r"could not connect to store server .*tried for 30\d\.\ds"):
            TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(minutes=5))
    assert spent.real < REAL_BOUND and spent.fake >= 300


def test_a_tcpstore_wait_times_out_on_fake_time():
    """The server parks the wait and answers ``timeout`` at its deadline: its loop waits on
    the clock while a request is due, so the 5-minute timeout passes at once (the one
    party: the server's thread; the client waits on its socket)."""
    with TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) as store:
        with MockClock(parties=1, autojump_threshold=0.01).installed() as clock, _Elapsed(clock) as spent:
            with pytest.raises(StoreTimeoutError, match="nokey"):
                store.wait(["nokey"], timedelta(minutes=5))
        assert spent.real < REAL_BOUND and spent.fake >= 300
        store.set("after", b"1")  # the server still serves
        assert store.get("after") == b"1"


def test_tcp_transport_close_lingers_on_fake_time(monkeypatch):
    """close() waits for the peer's goodbye (LINGER_SECONDS); a peer that never closes holds
    it up for the whole linger, which passes on fake time."""
    from test_tcp_stripes import open_pair

    from pydist.transport.tcp import transport as tcp

    monkeypatch.setenv("PYDIST_PEER_TIMEOUT", "0")
    monkeypatch.setattr(tcp, "LINGER_SECONDS", 120.0)
    first, second = open_pair(([], []))
    try:
        with MockClock().installed() as clock, _Elapsed(clock) as spent:
            first.close()  # ``second`` stays open: no EOF comes
        assert spent.real < REAL_BOUND and spent.fake >= 120
    finally:
        second.close()


def test_mesh_accept_times_out_on_fake_time():
    """Waiting for a higher rank to connect ends at the mesh's deadline."""
    from pydist.transport.tcp.mesh import accept_from

    with listen("127.0.0.1", 8) as listener:
        with MockClock(autojump_threshold=0.01).installed() as clock, _Elapsed(clock) as spent:
            with pytest.raises(DistNetworkError, match=r"rank 0 timed out waiting for connections from ranks \[1\]"):
                accept_from(listener, {1}, 0, "token", Deadline.after(600))
    assert spent.real < REAL_BOUND and spent.fake >= 600


def test_agent_rendezvous_join_times_out_on_fake_time():
    """An agent alone in a rendezvous for two nodes gives up at join_timeout (its looks at
    the store are paced by sleeps on the clock)."""
    from pydist.run.agent_rendezvous import NodeRecord, Rendezvous, RendezvousError, RendezvousSettings

    settings = RendezvousSettings("clock", min_nodes=2, max_nodes=2, join_timeout=60.0)
    rendezvous = Rendezvous(HashStore(), settings, NodeRecord("agent-0", "host0", "10.0.0.1", 1, -1))
    with MockClock().installed() as clock, _Elapsed(clock) as spent:
        with pytest.raises(RendezvousError, match=r"timed out after 60s: 1 of at least 2 nodes joined"):
            rendezvous.join()
    assert spent.real < REAL_BOUND and spent.fake >= 60


def test_mpi_poll_ends_at_a_deadline_read_on_the_clock():
    """The MPI engine's poll (no MPI needed: any test function) compares ``Deadline.at``,
    which is on pydist's clock, with that clock, and backs off with sleeps on it."""
    from pydist.engines._mpi_requests import poll_until

    with MockClock().installed() as clock, _Elapsed(clock) as spent:
        assert poll_until(lambda: False, Deadline.after(60).at) is False
    assert spent.real < REAL_BOUND and spent.fake >= 60
    flips = iter([False, False, True])
    with MockClock().installed():
        assert poll_until(lambda: next(flips), Deadline.after(60).at) is True


def test_work_wait_times_out_on_fake_time():
    work = Work("all_reduce (seq 1)")
    with MockClock(autojump_threshold=0.01).installed() as clock, _Elapsed(clock) as spent:
        with pytest.raises(DistBackendError, match=r"Work.wait timed out after 600 s; all_reduce \(seq 1\)"):
            work.wait(timeout=timedelta(minutes=10))
    assert spent.real < REAL_BOUND and spent.fake >= 600
    work._succeed()
    with MockClock().installed():
        assert work.wait(timeout=600)


def _signal():
    from pydist.transport.shm import atomics
    from pydist.transport.shm.segment import anonymous
    from pydist.transport.shm.signal import Signal

    if not atomics.available():
        pytest.skip("no futex/atomics on this platform")
    array, base = anonymous(4096)
    return Signal(memoryview(array), base, 64, oversubscribed=True)


def test_a_shared_memory_wait_times_out_on_fake_time():
    """An arena's wait for a counter sleeps on its futex in timed waits on the clock."""
    from pydist.transport.shm.signal import WaitTimeout

    signal = _signal()
    with MockClock(autojump_threshold=0.01).installed() as clock, _Elapsed(clock) as spent:
        with pytest.raises(WaitTimeout):
            signal.wait_at_least(0, 1, Deadline.after(600))
    assert spent.real < REAL_BOUND and spent.fake >= 600


def test_a_shared_memory_wait_ends_when_the_counter_is_published_on_fake_time():
    """The doorbell still wakes a waiter sleeping through the fake clock. parties=2 with one
    waiter: the clock never jumps, so only the publication can end the wait."""
    signal = _signal()
    publisher = threading.Timer(0.2, signal.publish, args=(0, 1))
    with MockClock(parties=2, autojump_threshold=0.01).installed():
        publisher.start()
        signal.wait_at_least(0, 1, Deadline.after(600))
    publisher.join()
    assert signal.read(0) == 1


def test_clock_join_waits_for_a_thread_on_fake_time():
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    with MockClock(autojump_threshold=0.01).installed() as clock, _Elapsed(clock) as spent:
        assert _deadline.join(thread, 600) is False
    assert spent.real < REAL_BOUND and spent.fake >= 600
    release.set()
    assert _deadline.join(thread, 60) is True
    assert _deadline.now is time.monotonic  # the real clock is back
