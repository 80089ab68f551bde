"""Shared memory: algorithm choice, forcing an impossible algorithm, groups mixing hosts,
the hierarchical and rails algorithms' full cases in several host shapes, desync detection
through the arena, p2p rings, and no /dev/shm segment surviving SIGKILL. Every algorithm
forced: test_collectives_every_algorithm.py."""
import os
import signal
import time

import numpy as np
import pytest

import pydist as dist
from pydist.engines.choice import ALGORITHMS
from pydist.testing import run_processes, run_threads
from pydist.testing.conformance import run_suite
from pydist.transport.shm import atomics as _atomics

pytestmark = pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off")

TWO_HOSTS = ["hostA", "hostA", "hostB", "hostA", "hostB"]


def failures(results):
    return [f for per_rank in results for f in per_rank]


def _chosen(rank, size):
    from pydist.core.deadline import Deadline
    from pydist.engines.base import OpContext
    ctx = OpContext("probe", 0, Deadline(None))
    backend = dist.group.WORLD.engine
    chosen = {c: backend.choose(c, ctx, 1 << 20, 1 << 18) for c in ALGORITHMS}
    dist.barrier()  # every rank has attached to the arena the probe made before anyone leaves
    return chosen


def test_engine_picks_shm_on_one_host_and_hierarchical_across_hosts():
    one_host = run_threads(3, _chosen, transport="tcp")[0]
    assert set(one_host.values()) == {"shm"}
    mixed = run_threads(5, _chosen, transport="tcp", hosts=TWO_HOSTS)[0]
    hierarchical = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"}
    assert {c for c, algorithm in mixed.items() if algorithm == "hierarchical"} == hierarchical
    assert mixed["all_to_all"] == "pairwise" and mixed["gather"] == "linear"


def test_forcing_an_impossible_algorithm_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PYDIST_ALGO_BROADCAST", "shm")

    def fn(rank, size):
        with pytest.raises(ValueError, match="PYDIST_ALGO_BROADCAST=shm: not possible"):
            dist.broadcast(np.zeros(2), src=0)
    run_threads(2, fn, transport="tcp", hosts=["a", "b"])


def _reduced_everywhere(rank, size):
    x = np.full(1000, rank + 1.0)
    dist.all_reduce(x)
    y = np.full(10, float(rank))
    dist.broadcast(y, src=size - 1)
    return float(x[0]), float(y[0])


def test_groups_spanning_hosts_with_shared_memory_off_run_the_network_algorithms(monkeypatch):
    """PYDIST_SHM=0 with several ranks per host: no arena anywhere, so the engine does not
    pick the hierarchical algorithms (which need one per host; they raised ValueError)."""
    monkeypatch.setenv("PYDIST_SHM", "0")
    assert run_threads(4, _reduced_everywhere, transport="tcp", hosts=["a", "a", "b", "b"]) == [(10.0, 3.0)] * 4


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["loopback", "tcp"])
def test_groups_mixing_hosts_thread_ranks(transport, monkeypatch):
    monkeypatch.setenv("PYDIST_SHM_SLOT_BYTES", "512")
    hosts = ["a", "a", "b", "a", "b", "c"]
    assert failures(run_threads(6, run_suite, transport=transport, hosts=hosts, timeout=240)) == []


@pytest.mark.slow
def test_groups_mixing_hosts_processes():
    """Real processes; PYDIST_HOST_ID makes this machine pose as several hosts (interleaved,
    uneven: 3 + 2). Two hosts of two ranks: test_collectives_conformance.py's
    test_processes_with_connections_on_first_use_and_shared_memory."""
    hosts = ["x", "y", "x", "y", "x"]
    rank_env = {r: {"PYDIST_HOST_ID": host} for r, host in enumerate(hosts)}
    env = {"PYDIST_SHM_SLOT_BYTES": "512", "PYDIST_SEGMENT_BYTES": "256"}
    results = run_processes(len(hosts), run_suite, ["all_reduce", "broadcast", "p2p", "subgroups", "all_gather"],
                            env=env, rank_env=rank_env, timeout=240)
    assert failures(results) == []


def _first_all_reduce(rank, size):
    """(this rank's arena made by init, store requests of its first all_reduce, its result)."""
    import threading

    from pydist.store.tcp import TCPStore
    engine = dist.group.WORLD.engine
    made = (engine._arena if len(engine.hosts) == 1 else engine._local_arena) is not None
    requests = []
    original = TCPStore._request

    def counted(self, *args):
        if threading.current_thread() is threading.main_thread():  # not the progress board's
            requests.append(args[0])
        return original(self, *args)
    TCPStore._request = counted
    try:
        buf = np.ones(1, np.float32)
        dist.all_reduce(buf)
    finally:
        TCPStore._request = original
    return made, len(requests), float(buf[0])


@pytest.mark.slow  # processes or training: up to 2 s a case here
@pytest.mark.parametrize("hosts", [["x", "x", "x"], ["x", "x", "y", "y"]])
def test_init_sets_up_the_arena_so_the_first_collective_asks_the_store_nothing(hosts):
    """Issue 40: the arena (store round trips, the segment) is made by init_process_group,
    so the first all_reduce is like the others; across hosts, each host's part of it."""
    rank_env = {r: {"PYDIST_HOST_ID": host} for r, host in enumerate(hosts)}
    results = run_processes(len(hosts), _first_all_reduce, rank_env=rank_env)
    assert results == [(True, 0, float(len(hosts)))] * len(hosts)


def _disagree(rank, size, case):
    if case == "dtype":  # the same 16 bytes, different dtypes
        call = lambda: dist.all_reduce(np.ones(4, np.float32) if rank == 0 else np.ones(4, np.int32))  # noqa: E731
    elif case == "root":  # each rank believes it is the source
        call = lambda: dist.broadcast(np.full(4, float(rank)), src=rank)  # noqa: E731
    elif case == "op":
        call = lambda: dist.all_reduce(np.ones(2), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)  # noqa
    else:  # different collectives
        call = (lambda: dist.all_reduce(np.ones(4))) if rank == 0 else (lambda: dist.broadcast(np.ones(4), src=0))
    with pytest.raises(dist.DistBackendError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("case, words, difference", [
    ("dtype", "float32", "all_reduce with different dtypes"), ("root", "root", "broadcast with different roots"),
    ("op", "MAX", "all_reduce with different reduce ops"), ("collective", "broadcast", "different operations")])
def test_arena_detects_ranks_calling_different_things(case, words, difference):
    """Every rank raises, naming the other rank and both calls, instead of mixing data."""
    messages = run_threads(2, _disagree, case, transport="tcp", pg_timeout=10)
    for rank, message in enumerate(messages):
        assert f"rank {1 - rank}" in message and f"ranks called {difference}" in message, message
        assert words in message, message


def _big_p2p(rank, size, nbytes):
    data = (np.arange(nbytes, dtype=np.int64) % 251).astype(np.uint8)
    if rank == 0:
        works = [dist.isend(data, dst=1, tag=t) for t in range(3)]
        for w in works:
            w.wait()
        got = np.zeros(nbytes, np.uint8)
        dist.recv(got, src=1, tag=9)
        return bool(np.array_equal(got, data[::-1]))
    received = []
    for t in reversed(range(3)):  # posted out of order: tags still match
        buf = np.zeros(nbytes, np.uint8)
        dist.recv(buf, src=0, tag=t)
        received.append(np.array_equal(buf, data))
    dist.send(np.ascontiguousarray(data[::-1]), dst=0, tag=9)
    return all(received)


def test_p2p_through_small_rings_streams_large_messages(monkeypatch):
    monkeypatch.setenv("PYDIST_SHM_RING_BYTES", "65536")
    assert run_threads(2, _big_p2p, 1_000_003, transport="tcp") == [True, True]


def _any_source_mixed(rank, size):
    if rank == 0:
        senders = sorted(dist.recv(np.zeros(1), tag=4) for _ in range(size - 1))
        return senders
    dist.send(np.ones(1), dst=0, tag=4)
    return None


def test_any_source_receive_over_shm_and_tcp_together():
    """Rank 0 shares a host with rank 1 (shm) but not with ranks 2, 3 (tcp)."""
    assert run_threads(4, _any_source_mixed, transport="tcp", hosts=["a", "a", "b", "c"])[0] == [1, 2, 3]


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("pydist")}


def _loop_until_killed(rank, size, ready):
    """Collectives and p2p over shared memory forever, after saying it is ready."""
    buf = np.ones(1 << 16, np.float32)
    dist.new_group(list(range(size)))  # a second group: a second arena
    dist.all_reduce(buf)
    ready.put(os.getpid())
    while True:
        dist.all_reduce(buf)
        dist.broadcast(buf, src=0)


@pytest.mark.slow
def test_sigkill_leaves_no_shared_memory_segment():
    before = _segments()
    from pydist.testing.processes import start_ranks
    procs, ready = start_ranks(_killed_rank, 3)
    try:
        pids = [ready.get(timeout=60) for _ in procs]
        time.sleep(0.2)  # mid-run
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for proc in procs:
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        ready.close()
    assert _segments() - before == set()


def _killed_rank(rank, size, port, ready):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    dist.init_process_group("pydist")
    _loop_until_killed(rank, size, ready)


def test_a_segment_name_left_in_the_store_by_an_earlier_run_is_an_error_naming_the_key():
    """An attacher reading a name whose segment is gone (an earlier attempt's key, or a creator
    gone before everyone attached) gets a DistStoreError naming the key, not FileNotFoundError."""
    from pydist.core.deadline import Deadline
    from pydist.transport.shm.sharing import share

    store = dist.HashStore()
    store.set("arena/7/name", "pydist-0123456789ab-arena-deadbeef-1")
    with pytest.raises(dist.DistStoreError, match="'arena/7/name'.*pydist-0123456789ab-arena-deadbeef-1.*rank 0"):
        share(store, "arena/7", [0, 1], 1, 64, "0123456789ab", "arena", Deadline.after(5))


HIERARCHICAL_CASES = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"]


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [["a", "a", "b", "b", "c", "c"], ["a", "a", "a", "b"], ["a", "b", "a", "c", "b"]],
                         ids=["3x2", "3+1", "2+2+1 interleaved"])
@pytest.mark.parametrize("segment_bytes", ["512", str(4 << 20)], ids=["many segments", "one segment"])
def test_hierarchical_algorithms_in_uneven_and_three_host_shapes(hosts, segment_bytes, monkeypatch):
    """The hierarchical algorithm of every collective that has one (chosen by the engine
    for these shapes), with many segments or one, exact at every rank."""
    monkeypatch.setenv("PYDIST_SHM_SLOT_BYTES", "256")
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", segment_bytes)
    for collective in HIERARCHICAL_CASES:
        monkeypatch.setenv(f"PYDIST_ALGO_{collective.upper()}", "hierarchical")
    results = run_threads(len(hosts), run_suite, HIERARCHICAL_CASES, hosts=hosts, transport="tcp", timeout=240)
    assert failures(results) == []


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [["a", "a", "b", "b", "c", "c"], ["a", "b", "a", "c", "b"]],
                         ids=["3x2", "2+2+1 interleaved"])
def test_a_subgroup_spanning_hosts_runs_the_hierarchical_algorithms(hosts, monkeypatch):
    """new_group of all ranks but the last (2+2+1 and 2+1+1 hosts): the engine picks the
    hierarchical algorithm of each collective inside the subgroup, and the results are exact."""
    monkeypatch.setenv("PYDIST_SHM_SLOT_BYTES", "256")
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", "512")
    ran: dict[str, set[int]] = {collective: set() for collective in HIERARCHICAL_CASES}
    for collective in HIERARCHICAL_CASES:
        algorithm = ALGORITHMS[collective]["hierarchical"]

        def counted(*args, _collective=collective, _algorithm=algorithm, **kwargs):
            ran[_collective].add(dist.get_rank())
            return _algorithm(*args, **kwargs)
        monkeypatch.setitem(ALGORITHMS[collective], "hierarchical", counted)
    results = run_threads(len(hosts), run_suite, ["spanning_subgroup"], hosts=hosts, transport="tcp", timeout=240)
    assert failures(results) == []
    assert ran == {collective: set(range(len(hosts) - 1)) for collective in HIERARCHICAL_CASES}


@pytest.mark.slow
def test_rails_in_three_hosts_of_two(monkeypatch):
    monkeypatch.setenv("PYDIST_SHM_SLOT_BYTES", "256")
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", "64")
    monkeypatch.setenv("PYDIST_ALGO_ALL_REDUCE", "rails")
    monkeypatch.setenv("PYDIST_ALGO_BROADCAST", "rails")
    results = run_threads(6, run_suite, ["all_reduce", "broadcast"], hosts=["a", "b", "c", "a", "b", "c"],
                          transport="tcp", timeout=240)
    assert failures(results) == []


def test_rails_with_uneven_hosts_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PYDIST_ALGO_ALL_REDUCE", "rails")

    def fn(rank, size):
        with pytest.raises(ValueError, match="PYDIST_ALGO_ALL_REDUCE=rails: not possible"):
            dist.all_reduce(np.zeros(2))
    run_threads(3, fn, transport="tcp", hosts=["a", "a", "b"])
