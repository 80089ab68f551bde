"""torch's rendezvous through pydist's stores, in process: what a torch script gets under
pydist-run's default secret, and what it leaves behind.

- tcp:// naming the workers' store (MASTER_ADDR:MASTER_PORT) under pydist-run with a token
  reaches it through pydist's authenticated client, as env:// does; any other tcp:// is
  torch's own (review finding 2).
- init/destroy cycles keep at most one client of the workers' store open (finding 9).
- a failed env:// rendezvous takes back the variables it set from the launcher's (17).
- pydist's own env:// under an elastic agent keeps each round of a membership change (same
  restart count, another world size) in a namespace of its own (finding 8).
- only the job's rank 0 says the job is open, not a torch subgroup's rank 0 (finding 16).
- the plugin's set_timeout validates before it changes anything (17).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

import pytest

tdist = pytest.importorskip("torch.distributed")
import torch  # noqa: E402

from pydist.net import auth  # noqa: E402
from pydist.rendezvous import rendezvous  # noqa: E402
from pydist.store import TCPStore  # noqa: E402
from pydist.torch import agent_store  # noqa: E402
from pydist.torch._store import TorchStore  # noqa: E402
from pydist.torch.agent_store import PydistStore  # noqa: E402

TOKEN = "the job's secret"
SECONDS = 30.0  # a bound for what a loaded 2-core machine does in well under a second
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher's, agent's or security variables; returns monkeypatch."""
    for name in list(os.environ):
        if (name in LAUNCH or name.startswith(("TORCHELASTIC_", "PMI_", "OMPI_", "SLURM_", "MPI_", "PYDIST_AUTH",
                                               "PYDIST_TLS_", "SUBMITIT_")) or name == "PYDIST_RUN_WORKER"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def workers_store(clean_env):
    """A pydist store that requires TOKEN, and the environment of a pydist-run worker of it."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, auth_token=TOKEN,
                      timeout=timedelta(seconds=SECONDS))
    for name, value in {"PYDIST_RUN_WORKER": "1", "TORCHELASTIC_USE_AGENT_STORE": "True", "PYDIST_AUTH_TOKEN": TOKEN,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "RANK": "0",
                        "WORLD_SIZE": "1"}.items():
        clean_env.setenv(name, value)
    yield server
    if tdist.is_initialized():
        tdist.destroy_process_group()
    while agent_store._KEPT:
        agent_store._KEPT.pop().close()
    server.close()


def _sum_of_ones(**init) -> float:
    tdist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=SECONDS), **init)
    try:
        tensor = torch.ones(3)
        tdist.all_reduce(tensor)
        return float(tensor.sum())
    finally:
        tdist.destroy_process_group()


def test_tcp_init_method_naming_the_workers_store_works_under_the_default_secret(workers_store):
    """As under torchrun: init_process_group("gloo", init_method="tcp://MASTER_ADDR:MASTER_PORT")
    (torch's C++ client alone would be refused by the store that requires the token)."""
    assert _sum_of_ones(init_method=f"tcp://127.0.0.1:{workers_store.port}") == 3.0
    assert _sum_of_ones(init_method=f"tcp://localhost:{workers_store.port}") == 3.0  # another name of the host
    assert any(key.startswith("default_pg") for key in workers_store.list_keys())  # torch's keys went there
    with pytest.raises(ValueError, match="tcp:// rendezvous: rank parameter missing"):  # as torch's: no RANK read
        next(agent_store.agent_store_rendezvous(f"tcp://127.0.0.1:{workers_store.port}"))


def test_tcp_init_method_naming_another_store_is_torchs_own(workers_store):
    other = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # torch's own server
    assert agent_store.targets_workers_store(f"tcp://127.0.0.1:{workers_store.port}")
    assert not agent_store.targets_workers_store(f"tcp://127.0.0.1:{other.port}")
    assert _sum_of_ones(init_method=f"tcp://127.0.0.1:{other.port}") == 3.0
    assert not agent_store._KEPT  # torch's client served it


def _connections(server: TCPStore, at_most: int) -> int:
    """The server's open connections once they are ``at_most`` (bounded: the server thread
    sees a client's close a moment after it)."""
    deadline = time.monotonic() + SECONDS
    while True:
        stats = server.server_stats()
        assert stats is not None
        if stats["connections"] <= at_most or time.monotonic() > deadline:
            return stats["connections"]
        time.sleep(0.01)


def test_init_and_destroy_cycles_keep_at_most_one_client_of_the_workers_store(workers_store):
    assert _sum_of_ones() == 3.0
    assert len(agent_store._KEPT) == 1
    one = workers_store.server_stats()["connections"]
    assert one >= 1
    for _ in range(3):
        assert _sum_of_ones() == 3.0
    assert len(agent_store._KEPT) == 1  # the earlier rounds' clients were closed by the next init
    assert _connections(workers_store, one) <= one


def test_a_clone_lives_as_long_as_its_store_and_closes_with_it(workers_store):
    store = PydistStore(TCPStore("127.0.0.1", workers_store.port, timeout=timedelta(seconds=SECONDS),
                                 auth_token=TOKEN))
    clone = store.clone()
    clone.set("k", "v")
    assert store.get("k") == b"v"
    store.close()
    with pytest.raises(tdist.DistStoreError):
        clone.get("k")


@pytest.mark.slow  # a real connect timeout / two worlds made over a store: seconds
def test_a_failed_env_rendezvous_takes_back_the_variables_it_set(clean_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once closed
    clean_env.setenv("PMI_RANK", "1")  # mpiexec's rank 1 of 2: a client of rank 0's store
    clean_env.setenv("PMI_SIZE", "2")
    clean_env.setenv("MPI_LOCALNRANKS", "2")
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", str(closed))
    with pytest.raises(RuntimeError):  # torch's DistNetworkError: nobody serves the store
        tdist.init_process_group("pydist", timeout=timedelta(seconds=1))  # the pydist backend's: filled
    assert {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == \
        dict.fromkeys(("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    assert os.environ["MASTER_PORT"] == str(closed)  # the user's own are left alone


def test_pydists_env_rendezvous_keeps_each_round_of_a_membership_change_apart(clean_env):
    """torchrun --nnodes 1:2: a second agent joining restarts the workers into a larger world
    under the same restart count; the new round must not read the old round's keys."""
    agent = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=SECONDS))
    try:
        for name, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "grow",
                            "TORCHELASTIC_RESTART_COUNT": "1", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(agent.port), "RANK": "0"}.items():
            clean_env.setenv(name, value)
        stores = []
        for size in ("2", "4"):
            clean_env.setenv("WORLD_SIZE", size)
            store, _, world_size = rendezvous("env://", -1, -1, timedelta(seconds=SECONDS))
            assert world_size == int(size)
            stores.append(store)
        small, large = stores
        small.set("pydist/0/tcp/0", b"the old round's rank 0")
        assert not large.check(["pydist/0/tcp/0"])
        assert agent.get("attempt/grow/1/2/pydist/0/tcp/0") == b"the old round's rank 0"
        for store in stores:
            store.close()
    finally:
        agent.close()


@pytest.mark.slow  # a real connect timeout / two worlds made over a store: seconds
def test_only_the_jobs_rank_0_says_the_job_is_open(clean_env, caplog):
    """Two ranks of a torch subgroup over ranks 1 and 2 of the job: its rank 0 (job rank 1)
    says nothing; the same group as ranks 0 and 1 of the job says it once."""
    from pydist.groups.factory import standalone_world
    from pydist.torch.placement import _job_position

    assert _job_position(0, 2, [1, 2]) == (1, 3) and _job_position(1, 3, None) == (1, 3)

    def pair(jobs: list[tuple[int, int]]) -> None:
        store, worlds, errors = TorchStore(tdist.HashStore()), [None, None], []

        def rank(r: int) -> None:
            try:
                worlds[r] = standalone_world(store, r, 2, SECONDS, "torch", job=jobs[r])
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SECONDS * 4)
        assert not errors and all(worlds), errors
        for world in worlds:
            world.leave()

    clean_env.setattr(auth, "_warned_open", False)
    with caplog.at_level(logging.WARNING, logger="pydist"):
        pair([(1, 3), (2, 3)])
        assert auth.OPEN_JOB_WARNING not in caplog.text
        pair([(0, 3), (1, 3)])
    assert caplog.text.count(auth.OPEN_JOB_WARNING) == 1


def test_the_plugins_set_timeout_checks_before_it_changes_anything():
    from pydist.torch.backend import ProcessGroupPydist

    group = ProcessGroupPydist(tdist.HashStore(), 0, 1, timedelta(seconds=SECONDS))
    try:
        before = group.pydist_group.timeout
        for bad in (timedelta(0), timedelta(seconds=-1)):
            with pytest.raises(ValueError, match="positive"):
                group.set_timeout(bad)
            assert group.pydist_group.timeout == before
        group.set_timeout(timedelta(seconds=7))
        assert group.pydist_group.timeout == 7.0
    finally:
        group.shutdown()
