"""Every algorithm of every collective, forced, over the in-process loopback transport: the
fast tier's proof that each schedule is right (test_forced_algorithm_over_loopback), and,
marked slow, the full conformance cases of each network algorithm at other world sizes
(test_forced_network_algorithm_full_cases).

Thread-ranks get host identities (``run_threads(..., hosts=...)``) that make the forced
algorithm possible: one host for ``shm`` (the ranks share an arena), one host per rank for
the network algorithms, two or three hosts of several ranks for ``hierarchical`` and
``rails``. World sizes include odd ones; element counts are 0, 1, not divisible by the world
size and many segments long (64-byte segments, 256-byte arena slots). Each result is checked
exactly against a naive reference (pydist.testing.reference), and the forced algorithm is
counted as it runs, so a test cannot pass on another algorithm.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import pydist as dist
from pydist.core.ops import RedOpType
from pydist.engines.choice import ALGORITHMS, HIERARCHICAL
from pydist.testing import run_threads
from pydist.testing.conformance import Checker, run_suite
from pydist.testing.reference import make_op, reduced, value
from pydist.transport.shm import atomics as _atomics

SEGMENT_BYTES = "64"  # every count above 8 int64 elements runs as several segments
SLOT_BYTES = "256"  # the smallest arena slots the settings allow a multiple of: many chunks
DTYPES = ("int64", "float32")
OPS = (RedOpType.SUM, RedOpType.MAX)

#: host identities per kind of algorithm: (hosts per rank, ...), odd and even sizes
LAYOUTS: dict[str, list[list[str]]] = {
    "shm": [["h0"] * 3, ["h0"] * 4],
    "network": [[f"h{r}" for r in range(3)], [f"h{r}" for r in range(4)]],
    # uneven hosts (2 + 1 ranks, the second host's rank in the middle) and 2 + 2 + 1
    "hierarchical": [["h0", "h1", "h0"], ["h0", "h0", "h1", "h1"], ["h0", "h0", "h1", "h1", "h2"]],
    # rails need as many ranks on every host, more than one: 2 x 2, and 3 hosts x 2 interleaved
    "rails": [["h0", "h0", "h1", "h1"], ["h0", "h1", "h2", "h0", "h1", "h2"]],
}


def layouts(algorithm: str) -> list[list[str]]:
    return LAYOUTS[algorithm if algorithm in LAYOUTS else "network"]


def counts(size: int) -> list[int]:
    """0, 1, 7 and 3 * size + 1 (neither divisible by 3 or 4 ranks), and 300 (many segments)."""
    return [0, 1, 7, 3 * size + 1, 300]


# -- one function per collective: runs it over counts, dtypes, ops and roots, checks every
# -- result against the reference, and returns how many calls of the collective it made


def run_all_reduce(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for op in OPS:
            for count in counts(size):
                buf = value(rank, count, dtype)
                dist.all_reduce(buf, op=make_op(op))
                calls += 1
                check.equal(f"all_reduce {op.name} {dtype} n={count}", buf, reduced(size, count, dtype, op))
    return calls


def run_broadcast(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for count in counts(size):
            for root in range(size):
                buf = value(rank, count, dtype)
                dist.broadcast(buf, src=root)
                calls += 1
                check.equal(f"broadcast {dtype} n={count} root={root}", buf, value(root, count, dtype))
    return calls


def run_reduce(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for op in OPS:
            for count in counts(size):
                for root in range(size):
                    mine = value(rank, count, dtype)
                    buf = mine.copy()
                    dist.reduce(buf, dst=root, op=make_op(op))
                    calls += 1
                    want = reduced(size, count, dtype, op) if rank == root else mine
                    check.equal(f"reduce {op.name} {dtype} n={count} root={root}", buf, want)
    return calls


def run_all_gather(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for count in counts(size):
            outs = [np.full(count, 99, dtype) for _ in range(size)]
            dist.all_gather(outs, value(rank, count, dtype))
            calls += 1
            for r in range(size):
                check.equal(f"all_gather {dtype} n={count} [{r}]", outs[r], value(r, count, dtype))
    return calls


def run_reduce_scatter(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for op in OPS:
            for count in counts(size):
                ins = [value(rank, count, dtype, salt=j) for j in range(size)]
                out = np.full(count, 99, dtype)
                dist.reduce_scatter(out, ins, op=make_op(op))
                calls += 1
                check.equal(f"reduce_scatter {op.name} {dtype} n={count}", out,
                            reduced(size, count, dtype, op, salt=rank))
    return calls


def run_all_to_all(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for count in counts(size):
            outs = [np.full(count, 99, dtype) for _ in range(size)]
            dist.all_to_all(outs, [value(rank, count, dtype, salt=j) for j in range(size)])
            calls += 1
            for j in range(size):
                check.equal(f"all_to_all {dtype} n={count} [{j}]", outs[j], value(j, count, dtype, salt=rank))
    return calls


def run_gather(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for count in counts(size):
            for root in range(size):
                outs = [np.full(count, 99, dtype) for _ in range(size)] if rank == root else None
                dist.gather(value(rank, count, dtype), outs, dst=root)
                calls += 1
                for r, out in enumerate(outs or []):
                    check.equal(f"gather {dtype} n={count} root={root} [{r}]", out, value(r, count, dtype))
    return calls


def run_scatter(rank: int, size: int, check: Checker) -> int:
    calls = 0
    for dtype in DTYPES:
        for count in counts(size):
            for root in range(size):
                out = np.full(count, 99, dtype)
                ins = [value(root, count, dtype, salt=r) for r in range(size)] if rank == root else None
                dist.scatter(out, ins, src=root)
                calls += 1
                check.equal(f"scatter {dtype} n={count} root={root}", out, value(root, count, dtype, salt=rank))
    return calls


ROUNDS = 4


def run_barrier(rank: int, size: int, check: Checker, arrived: list[int], lock: threading.Lock) -> int:
    """Round k's straggler (rank k % size) arrives late; after the barrier every rank must
    see that all ``size`` ranks arrived at round k."""
    for round_ in range(ROUNDS):
        if rank == round_ % size:
            time.sleep(0.01)  # late, so that a barrier that does not wait is caught
        with lock:
            arrived[round_] += 1
        dist.barrier()
        with lock:
            seen = arrived[round_]
        if seen != size:
            check.failures.append(f"barrier round {round_}: left it when {seen} of {size} ranks had arrived")
    return ROUNDS


RUNS: dict[str, Callable[..., int]] = {
    "all_reduce": run_all_reduce, "broadcast": run_broadcast, "reduce": run_reduce, "all_gather": run_all_gather,
    "reduce_scatter": run_reduce_scatter, "all_to_all": run_all_to_all, "gather": run_gather,
    "scatter": run_scatter, "barrier": run_barrier,
}


def _rank(rank: int, size: int, collective: str, *extra) -> tuple[int, list[str]]:
    check = Checker()
    calls = RUNS[collective](rank, size, check, *extra)
    return calls, [f"rank {rank}: {failure}" for failure in check.failures]


@pytest.fixture
def ran(monkeypatch) -> Counter:
    """Count, per (collective, algorithm), how many times a rank entered the algorithm."""
    counted: Counter = Counter()
    lock = threading.Lock()

    def counting(collective: str, name: str, algorithm: Callable[..., None]) -> Callable[..., None]:
        def run(*args, **kwargs):
            with lock:
                counted[collective, name] += 1
            return algorithm(*args, **kwargs)
        return run

    for collective, algorithms in ALGORITHMS.items():
        for name, algorithm in list(algorithms.items()):
            monkeypatch.setitem(algorithms, name, counting(collective, name, algorithm))
    return counted


CASES = [pytest.param(collective, algorithm, hosts, id=f"{collective}-{algorithm}-{'.'.join(hosts)}")
         for collective, algorithms in ALGORITHMS.items() for algorithm in algorithms
         for hosts in layouts(algorithm)]


def test_the_cases_cover_every_algorithm_of_every_collective():
    covered = {(collective, algorithm) for collective, algorithm, _ in (case.values for case in CASES)}
    assert covered == {(c, a) for c, names in ALGORITHMS.items() for a in names}
    assert set(RUNS) == set(ALGORITHMS)


@pytest.mark.parametrize("collective, algorithm, hosts", CASES)
def test_forced_algorithm_over_loopback(collective, algorithm, hosts, ran, monkeypatch):
    if algorithm in ("shm",) + HIERARCHICAL and not _atomics.available():
        pytest.skip("no libatomic/futex: shared memory is off")  # as test_shm_collectives.py
    monkeypatch.setenv(f"PYDIST_ALGO_{collective.upper()}", algorithm)
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", SEGMENT_BYTES)
    monkeypatch.setenv("PYDIST_SHM_SLOT_BYTES", SLOT_BYTES)
    size = len(hosts)
    extra = ([0] * ROUNDS, threading.Lock()) if collective == "barrier" else ()
    results = run_threads(size, _rank, collective, *extra, hosts=hosts, timeout=60)
    assert [failure for _, failures in results for failure in failures] == []
    calls = [calls for calls, _ in results]
    assert len(set(calls)) == 1 and calls[0] > 0, calls
    assert ran[collective, algorithm] == size * calls[0], dict(ran)
    if algorithm not in HIERARCHICAL:  # (those run a network all_reduce among leaders or rails)
        others = {name: n for (c, name), n in ran.items() if c == collective and name != algorithm}
        assert others == {}, f"{collective} also ran {others}"


# -- the full conformance cases (pydist.testing.conformance: every dtype and ReduceOp, counts up
# -- to many segments, every root) of each network algorithm, forced, at world sizes the lean
# -- runs above do not use, so that no (collective, algorithm, size) runs twice. The shm
# -- algorithm's full cases are test_collectives_conformance.py's (the choice on one host, at
# -- every size, threads and processes); hierarchical's and rails' are test_shm_collectives.py's
# -- (mixed hosts, uneven and three-host shapes, rails of three hosts).

#: all_reduce's at every size but 3 and 4 (the lean runs'); the other collectives' at 5 ranks
FULL_SIZES = {"all_reduce": [1, 2, 5, 6, 7, 8]}
FULL_SIZE = 5
#: the conformance case of each collective; gather and scatter share one, run with both forced
FULL_CASE = {"gather": "gather_scatter", "scatter": "gather_scatter", "barrier": "barrier_async"}
FULL_CASES = [pytest.param(collective, algorithm, size, marks=pytest.mark.slow, id=f"{collective}-{algorithm}-{size}")
              for collective, algorithms in ALGORITHMS.items() if collective != "scatter"
              for algorithm in algorithms if algorithm != "shm" and algorithm not in HIERARCHICAL
              for size in FULL_SIZES.get(collective, [FULL_SIZE])]


def test_the_full_cases_cover_every_network_algorithm():
    covered = {(collective, algorithm) for collective, algorithm, _ in (case.values for case in FULL_CASES)}
    network = {(c, a) for c, names in ALGORITHMS.items() for a in names if a != "shm" and a not in HIERARCHICAL}
    assert covered | {("scatter", a) for c, a in covered if c == "gather"} == network
    assert ALGORITHMS["gather"].keys() == ALGORITHMS["scatter"].keys()


@pytest.mark.parametrize("collective, algorithm, size", FULL_CASES)
def test_forced_network_algorithm_full_cases(collective, algorithm, size, ran, monkeypatch):
    forced = ["gather", "scatter"] if collective == "gather" else [collective]
    for name in forced:
        monkeypatch.setenv(f"PYDIST_ALGO_{name.upper()}", algorithm)
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", SEGMENT_BYTES)
    hosts = [f"h{r}" for r in range(size)]  # a host each: nothing else runs on shared memory
    results = run_threads(size, run_suite, [FULL_CASE.get(collective, collective)], hosts=hosts, timeout=240)
    assert [failure for failures in results for failure in failures] == []
    assert all(ran[name, algorithm] > 0 for name in forced), dict(ran)
