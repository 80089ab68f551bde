"""The conformance matrix: every operation x world sizes 1-8 x dtypes x ReduceOps x counts
x roots, over loopback (threads), shared memory and tcp (real processes), against naive
references (see pydist.testing.conformance). Forced algorithms and mixed-host groups are in
test_shm_collectives.py; every algorithm forced over loopback, for the fast tier, in
test_collectives_every_algorithm.py."""
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


@pytest.mark.slow  # the fast tier forces every algorithm in test_collectives_every_algorithm.py
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
def test_threads_loopback_all_reduce_algorithms(algorithm, size, small_segments, monkeypatch):
    monkeypatch.setenv("PYDIST_ALGO_ALL_REDUCE", algorithm)
    assert failures(run_threads(size, run_suite, ["all_reduce"], timeout=240)) == []


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


@pytest.mark.slow
@pytest.mark.parametrize("size, reader", [(2, "caller"), (3, "caller"), (5, "caller"), (8, "caller"),
                                          (2, "io"), (5, "io")])
def test_processes_tcp_only(size, reader):
    """Real processes with shared memory off (PYDIST_SHM=0): every byte over tcp; all_reduce
    forced onto the ring on even sizes so that both network algorithms run; a blocked caller
    reads the sockets itself (the default) or leaves them to the I/O thread."""
    env = {"PYDIST_SEGMENT_BYTES": SMALL_SEGMENTS, "PYDIST_SHM": "0", "PYDIST_TCP_READER": reader}
    if size % 2 == 0:
        env["PYDIST_ALGO_ALL_REDUCE"] = "ring"
    assert failures(run_processes(size, run_suite, init="env", env=env, timeout=300)) == []


@pytest.mark.slow
@pytest.mark.parametrize("size, shm", [(5, "0"), (8, "0"), (4, "1")])
def test_processes_with_connections_on_first_use(size, shm):
    """PYDIST_TCP_CONNECT=lazy (transport/tcp/lazy.py): pairs connect when they first exchange a
    message; every collective still right, over tcp only, and with shared memory (two ranks
    per host: the local pair connected at init, the others on first use)."""
    env = {"PYDIST_SEGMENT_BYTES": SMALL_SEGMENTS, "PYDIST_SHM": shm, "PYDIST_TCP_CONNECT": "lazy"}
    hosts = {r: {"PYDIST_HOST_ID": f"host{r // 2}"} for r in range(size)} if shm == "1" else None
    assert failures(run_processes(size, run_suite, init="env", env=env, rank_env=hosts, timeout=300)) == []


def test_the_suite_detects_wrong_results(monkeypatch):
    """A broken algorithm must make the suite report failures (the checks are live)."""
    from pydist.engines.native import ALGORITHMS

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
