"""The conformance matrix: every operation x world sizes 1-8 x dtypes x ReduceOps x counts
x roots, with the algorithms the engine chooses, over loopback (threads), shared memory and
tcp (real processes), against naive references (see pydist.testing.conformance). Every
algorithm forced (lean values for the fast tier; the network algorithms' full cases at
other sizes) is test_collectives_every_algorithm.py; mixed-host groups and the hierarchical
and rails algorithms' full cases are test_shm_collectives.py. No collective runs its cases
with the same algorithm, transport, world size, host layout and arena/segment sizes in two
of these tests; settings of the transport alone (who reads a socket, when pairs connect) are
spread over the sizes rather than crossed with each."""
import numpy as np
import pytest

from pydist.testing import run_processes, run_threads
from pydist.testing.conformance import CASES, run_suite

SIZES = range(1, 9)
#: The largest world of the loopback thread tests that `make test-fast` runs (1 and 2); the
#: larger ones, the tcp and process tests are marked slow. Larger worlds in the fast tier: every
#: algorithm on 3 to 6 ranks (odd ones included) in test_collectives_every_algorithm.py, and
#: the cases that do nothing below 3 ranks (FAST_SIZE_OF).
FAST_SIZE = 2
FAST_SIZE_OF = {"spanning_subgroup": 3}
SMALL_SEGMENTS = "64"  # bytes: every case with more than a few elements runs multi-segment


def failures(results: list[list[str]]) -> list[str]:
    return [failure for per_rank in results for failure in per_rank]


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", SMALL_SEGMENTS)


@pytest.mark.parametrize("case, size", [
    pytest.param(case, size, marks=[pytest.mark.slow] if size > FAST_SIZE_OF.get(case, FAST_SIZE) else [])
    for case in sorted(CASES) for size in SIZES])
def test_threads_loopback(case, size, small_segments):
    assert failures(run_threads(size, run_suite, [case], timeout=240)) == []


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3, 4])
def test_threads_tcp(size, small_segments):
    """Thread-ranks over real sockets: the tcp transport without process start-up cost."""
    assert failures(run_threads(size, run_suite, transport="tcp", timeout=240)) == []


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
def test_processes_shared_memory(size):
    """Real processes on one host: shared-memory arenas and rings (up to 8 ranks on 2 cores),
    with 256-byte arena slots so that most cases run multi-chunk."""
    env = {"PYDIST_SEGMENT_BYTES": SMALL_SEGMENTS, "PYDIST_SHM_SLOT_BYTES": "256"}
    assert failures(run_processes(size, run_suite, init="env", env=env, timeout=300)) == []


#: The tcp-only runs, one per world size (each size's cases run once): each reader and each
#: way of connecting at two sizes, each reader with both all_reduce algorithms (ring on even sizes).
#: "auto" is the default: eager below 64 ranks.
TCP_ONLY = [(2, "caller", "auto"), (3, "io", "auto"), (5, "caller", "lazy"), (8, "io", "lazy")]


@pytest.mark.slow
@pytest.mark.parametrize("size, reader, connect", TCP_ONLY)
def test_processes_tcp_only(size, reader, connect):
    """Real processes with shared memory off (PYDIST_SHM=0): every byte over tcp; all_reduce
    forced onto the ring on even sizes so that both network algorithms run. A blocked caller
    reads the sockets itself (the default) or leaves them to the I/O thread; pairs connect at
    init (auto, the default, at these sizes) or when they first exchange a message (lazy,
    transport/tcp/lazy.py)."""
    env = {"PYDIST_SEGMENT_BYTES": SMALL_SEGMENTS, "PYDIST_SHM": "0", "PYDIST_TCP_READER": reader,
           "PYDIST_TCP_CONNECT": connect}
    if size % 2 == 0:
        env["PYDIST_ALGO_ALL_REDUCE"] = "ring"
    assert failures(run_processes(size, run_suite, init="env", env=env, timeout=300)) == []


@pytest.mark.slow
def test_processes_with_connections_on_first_use_and_shared_memory():
    """PYDIST_TCP_CONNECT=lazy with shared memory, two hosts of two ranks: the local pair
    connected at init, the others on first use; every collective still right (the hierarchical
    ones with their host stage in rounds of 512-byte arena slots)."""
    env = {"PYDIST_SEGMENT_BYTES": SMALL_SEGMENTS, "PYDIST_TCP_CONNECT": "lazy", "PYDIST_SHM_SLOT_BYTES": "512"}
    hosts = {r: {"PYDIST_HOST_ID": f"host{r // 2}"} for r in range(4)}
    assert failures(run_processes(4, run_suite, init="env", env=env, rank_env=hosts, timeout=300)) == []


def test_the_suite_detects_wrong_results(monkeypatch):
    """A broken algorithm must make the suite report failures (the checks are live)."""
    from pydist.engines.choice import ALGORITHMS

    def off_by_one(original):
        def broken(comm, buf, root, segment_bytes):
            original(comm, buf, root, segment_bytes)
            if buf.size and buf.dtype.kind in "iuf":
                buf[0] += 1
        return broken

    for name, algorithm in list(ALGORITHMS["broadcast"].items()):
        monkeypatch.setitem(ALGORITHMS["broadcast"], name, off_by_one(algorithm))
    found = failures(run_threads(2, run_suite, ["broadcast"]))
    assert found and all("broadcast" in f for f in found)


@pytest.mark.slow
def test_all_reduce_large_buffer_over_tcp_processes():
    """A buffer far beyond the socket buffers: the pipelined ring with direct receives."""
    results = run_processes(3, _large_all_reduce, init="env", timeout=120)
    assert results == [True, True, True]


def _large_all_reduce(rank, size):
    import pydist
    buf = np.full(6_000_001, rank + 1, np.float32)
    pydist.all_reduce(buf)
    return bool(np.all(buf == size * (size + 1) / 2))
