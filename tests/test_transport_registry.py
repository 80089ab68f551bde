"""A transport is added by registering it (transport/registry.py): the world builds from the
registry and routes same-host peers through the host-local entry that applies, with no edit
to world.py. Bad entries are refused with an error naming the argument."""
from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

import pydist as dist
from pydist.core.deadline import Deadline
from pydist.core.settings import settings
from pydist.groups.state import GroupStates
from pydist.store import HashStore
from pydist.testing import run_threads
from pydist.transport import registry
from pydist.transport.base import HostLocalTransport
from pydist.transport.loopback import LoopbackFabric
from pydist.transport.registry import HOST_LOCAL, NETWORK, Site, TransportEntry
from pydist.transport.world import WorldTransport


class ThreadPost(HostLocalTransport):
    """A host-local transport for thread-ranks, defined only here: a loopback fabric attached
    to the worlds' own matchers, so a send is copied straight into the peer's matcher.
    Every send is recorded as (source, destination, bytes)."""

    def __init__(self, fabric: LoopbackFabric, site: Site, sent: list):
        self.link = fabric.attach(site.rank, site.matcher, site.events, site.on_peer_gone)
        site.store.set(f"thread-post/{site.rank}", b"1")
        site.store.wait([f"thread-post/{r}" for r in site.local], timedelta(seconds=30))  # local peers reachable
        self.rank, self.sent, self.on_peer_gone = site.rank, sent, site.on_peer_gone

    def isend(self, peer, data, key, call=0):
        self.sent.append((self.rank, peer, data.nbytes))
        return self.link.isend(peer, data, key, call)

    def irecv(self, peer, data, key, call=0):
        return self.link.irecv(peer, data, key, call)  # a send lands at once: nothing to move meanwhile

    def cancel(self, request) -> None:
        self.link.cancel(request)

    def peer_gone(self, peer: int, error: BaseException) -> None:
        self.on_peer_gone(peer, error)  # nothing of the peer's is in flight here

    def close(self) -> None:
        """Nothing held: the network transport says goodbye to the peers."""


@pytest.fixture
def thread_post():
    """Registers ThreadPost ahead of shm (and an entry that never applies ahead of it);
    yields (sent, built): the recorded sends and the ranks that built one."""
    fabric, sent, built = LoopbackFabric(8), [], []

    def build(site: Site) -> ThreadPost:
        built.append(site.rank)
        return ThreadPost(fabric, site, sent)

    def never_built(site: Site):
        raise AssertionError("an entry that does not apply was built")

    registry.register(TransportEntry("thread-post", HOST_LOCAL, build, applies=lambda site: True), first=True)
    registry.register(TransportEntry("never", HOST_LOCAL, never_built, applies=lambda site: False), first=True)
    try:
        yield sent, built
    finally:
        registry.unregister("never")
        registry.unregister("thread-post")


def _exchange(rank: int, size: int) -> list[bool]:
    """Every rank sends every other one a message of its own length; True where it arrived intact."""
    def message(src: int, dst: int) -> np.ndarray:
        return np.arange(1000 + 10 * src + dst, dtype=np.float64) + src

    inboxes = {src: np.zeros(1000 + 10 * src + rank) for src in range(size) if src != rank}
    works = [dist.irecv(box, src=src) for src, box in inboxes.items()]
    works += [dist.isend(message(rank, dst), dst=dst) for dst in range(size) if dst != rank]
    for work in works:
        work.wait()
    return [np.array_equal(box, message(src, rank)) for src, box in inboxes.items()]


def _message_bytes(src: int, dst: int) -> int:
    return (1000 + 10 * src + dst) * 8


def test_a_registered_host_local_transport_carries_the_same_host_peers(thread_post):
    sent, built = thread_post
    results = run_threads(3, _exchange, transport="tcp", hosts=["a", "a", "b"], timeout=60)
    assert all(all(intact) for intact in results)
    assert sorted(built) == [0, 1]  # rank 2 is alone on host b: no host-local transport
    assert (0, 1, _message_bytes(0, 1)) in sent and (1, 0, _message_bytes(1, 0)) in sent
    assert {(src, dst) for src, dst, _ in sent} == {(0, 1), (1, 0)}  # rank 2's peers are over tcp


def _all_reduce(rank: int, size: int) -> list[float]:
    tensor = np.full(1000, rank + 1.0)
    dist.all_reduce(tensor)
    return sorted(set(tensor.tolist()))


def test_a_host_local_entry_without_arenas_gets_network_algorithms_through_it(thread_post):
    sent, _ = thread_post
    assert run_threads(2, _all_reduce, transport="tcp", timeout=60) == [[3.0], [3.0]]
    assert (0, 1, 8000) in sent and (1, 0, 8000) in sent  # recursive doubling's exchange, not an arena


def test_the_built_in_entries():
    assert [e.name for e in registry.entries(NETWORK)] == ["tcp"]
    assert [e.name for e in registry.entries(HOST_LOCAL)] == ["shm"]
    assert registry.entries(HOST_LOCAL)[0].arenas


def test_no_network_transport_is_a_clear_error():
    (tcp,) = registry.entries(NETWORK)
    registry.unregister("tcp")
    try:
        with pytest.raises(RuntimeError, match="rank 0: no registered network transport applies"):
            WorldTransport(0, 1, HashStore(), Deadline.after(5), GroupStates(), settings())
    finally:
        registry.register(tcp)
    assert registry.entries(NETWORK) == [tcp]


def _noop(site):
    return None


@pytest.mark.parametrize("arguments, error, message", [
    (("", HOST_LOCAL, _noop, _noop), ValueError, "name: expected a non-empty string, got ''"),
    ((3, HOST_LOCAL, _noop, _noop), ValueError, "name: expected a non-empty string, got 3"),
    (("x", "disk", _noop, _noop), ValueError, "kind: expected 'network' or 'host-local', got 'disk'"),
    (("x", NETWORK, None, _noop), TypeError, "build: expected a callable taking a Site, got NoneType"),
    (("x", NETWORK, _noop, True), TypeError, "applies: expected a callable taking a Site, got bool"),
    (("x", NETWORK, _noop, _noop, "yes"), TypeError, "arenas: expected a bool, got str"),
])
def test_bad_entries_are_refused(arguments, error, message):
    with pytest.raises(error, match=message):
        TransportEntry(*arguments)


def test_the_registry_refuses_what_is_not_a_new_entry():
    with pytest.raises(TypeError, match="entry: expected a TransportEntry, got str"):
        registry.register("shm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="entry: a transport named 'shm' is already registered"):
        registry.register(TransportEntry("shm", HOST_LOCAL, _noop, _noop))
    with pytest.raises(ValueError, match=r"name: no transport named 'nope' is registered \(registered: shm, tcp\)"):
        registry.unregister("nope")
    with pytest.raises(ValueError, match="kind: expected 'network' or 'host-local', got 'disk'"):
        registry.entries("disk")

