"""pydist.torch.agent_store: pydist-run's authenticated store as a torch Store.

torch's env:// under pydist-run (PYDIST_RUN_WORKER=1) with a token reaches the workers' store
through PydistStore, a Python torch.distributed.Store over pydist's TCPStore client; torch's
C++ pieces (PrefixStore, gloo) call its Python methods. End to end (gloo and the pydist
plugin, restarted, under pydist-run): tests/test_launcher_torch_restart.py.
"""
from __future__ import annotations

from datetime import timedelta

import pytest

tdist = pytest.importorskip("torch.distributed")

from pydist.store import TCPStore  # noqa: E402
from pydist.torch import agent_store  # noqa: E402
from pydist.torch.agent_store import PydistStore, applies  # noqa: E402

TOKEN = "the job's secret"


@pytest.fixture
def server():
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, auth_token=TOKEN,
                      timeout=timedelta(seconds=10))
    yield master
    master.close()


def _client(server: TCPStore) -> PydistStore:
    return PydistStore(TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=10), auth_token=TOKEN))


def test_every_store_call_reaches_the_authenticated_store_also_through_torchs_prefix_store(server):
    store = _client(server)
    store.set("a", "1")
    assert store.get("a") == b"1" and store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("a", "1", "2") == b"2" and store.check(["a"]) and not store.check(["b"])
    store.multi_set(["x", "y"], ["vx", "vy"])
    assert store.multi_get(["x", "y"]) == [b"vx", b"vy"]
    store.append("x", "+")
    store.queue_push("q", "first")
    assert store.queue_len("q") == 1 and store.queue_pop("q") == b"first"
    assert store.delete_key("y") and not store.delete_key("y")
    assert "a" in store.list_keys() and store.num_keys() >= 3
    store.wait(["a"], timedelta(seconds=1))
    prefixed = tdist.PrefixStore("job", store)  # a C++ store calling the Python methods
    prefixed.set("k", "v")
    assert server.get("job/k") == b"v" and prefixed.get("k") == b"v" and prefixed.add("c", 1) == 1
    other = store.clone()
    assert other.get("x") == b"vx+"
    other.close()
    store.close()


def test_pydist_errors_come_out_as_torchs(server):
    store = _client(server)
    store.set_timeout(timedelta(seconds=0.2))
    assert store.timeout == timedelta(seconds=0.2) and store.underlying_store.timeout == timedelta(seconds=0.2)
    with pytest.raises(tdist.DistStoreError, match="missing"):
        store.get("missing")
    with pytest.raises(tdist.DistStoreError):
        store.wait(["missing"], timedelta(seconds=0.1))
    store.close()


def test_it_applies_only_under_pydist_run_with_a_token(monkeypatch):
    for name in ("PYDIST_TLS_CERT", "PYDIST_TLS_KEY", "PYDIST_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", TOKEN)
    monkeypatch.delenv("PYDIST_RUN_WORKER", raising=False)
    assert not applies()  # torchrun's agent store: torch's own protocol, torch's client
    monkeypatch.setenv("PYDIST_RUN_WORKER", "1")
    assert applies()
    monkeypatch.delenv("PYDIST_AUTH_TOKEN")
    assert not applies()  # no token: torch's C++ client works
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert not applies()


def test_the_env_rendezvous_yields_it_and_the_store_stays_alive(server, monkeypatch):
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    store, rank, size = next(agent_store.agent_store_rendezvous("env://", timeout=timedelta(seconds=10)))
    assert (rank, size) == (0, 1) and isinstance(store, PydistStore) and store in agent_store._KEPT
    store.set("from torch", "1")
    assert server.get("from torch") == b"1"


def test_an_empty_queue_raises_torchs_queue_empty_error(server):
    """torch 2.13's stores raise QueueEmptyError (a DistStoreError) from queue_pop(block=False)
    on an empty queue, and DistStoreError when a blocking pop times out; so does this one
    (torch's PrefixStore has no queue calls)."""
    store = _client(server)
    store.set_timeout(timedelta(seconds=0.2))
    with pytest.raises(tdist.QueueEmptyError):
        store.queue_pop("empty", block=False)
    with pytest.raises(tdist.DistStoreError) as blocking:
        store.queue_pop("empty")
    assert not isinstance(blocking.value, tdist.QueueEmptyError)
    store.close()


def test_clones_share_the_stores_connections_and_have_timeouts_of_their_own(server):
    """torch clones a store per shrunk group (shrink_group): each clone opening a client of
    its own would keep one more authenticated connection per shrink for the job's life."""
    store = _client(server)
    store.set("k", "v")
    before = server.server_stats()["connections"]
    clones = [store.clone() for _ in range(5)]
    assert [clone.get("k") for clone in clones] == [b"v"] * 5
    prefixed = tdist.PrefixStore("g", clones[0])
    prefixed.set("p", "1")
    assert prefixed.clone().get("p") == b"1"  # torch's way: PrefixStore.clone clones what it wraps
    assert server.server_stats()["connections"] == before
    clones[0].set_timeout(timedelta(seconds=0.1))
    assert store.timeout == store.underlying_store.timeout == timedelta(seconds=10)
    assert clones[0].timeout == timedelta(seconds=0.1)
    clones[1].close()  # a clone's close leaves the store (and the other clones) open
    assert store.get("k") == b"v" and clones[2].get("k") == b"v"
    store.close()
