"""Runtime failures: ranks that disagree on a collective's size raise a DistError at once (not
by the timeout), write nothing outside the tensors, and leave the group failing fast.
The rank functions are in tests/seed_programs/misuse.py."""
from __future__ import annotations

import pytest
from misuse_support import clean_process_world, misuse, transport  # noqa: F401 - fixtures used by every test here

from pydist.testing import run_processes, run_threads

# -- runtime failures: ranks that disagree --------------------------------------------------

def _report(results) -> str:
    return "\n".join(f"  rank {rank}: {r['error']} after {r['seconds']:.2f} s: {r['message'][:160]}; "
                     f"follow-up {r['follow_up']['error']} after {r['follow_up']['seconds']:.2f} s"
                     for rank, r in enumerate(results))


PG_TIMEOUT = 60.0
#: Seconds within which "at once" must be: far below PG_TIMEOUT (so an error that only the
#: timeout brought fails the test), far above what a loaded machine adds.
AT_ONCE = 20.0


@pytest.mark.parametrize("extra", [2, -2], ids=["rank0-smaller", "rank0-larger"])
def test_size_mismatch_all_reduce_two_ranks(extra, transport):
    """Rank 0 all_reduces 10 elements, rank 1 12 (or 8): both ranks raise a DistError at
    once (each receives a message of the wrong size), nothing outside the tensors is
    written, and the group is then broken: the next call fails fast."""
    results = run_threads(2, misuse.size_mismatch, "all_reduce", 10, extra, transport=transport,
                          pg_timeout=PG_TIMEOUT, timeout=120)
    report = _report(results)
    for result in results:
        assert result["dist_error"], report
        assert result["seconds"] < AT_ONCE, "detected only by the timeout:\n" + report
        assert result["intact"], "memory outside the tensors was written:\n" + report
        assert result["follow_up"]["dist_error"], report
        assert result["follow_up"]["seconds"] < AT_ONCE, report


SYMMETRIC = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_gather_into_tensor",
             "reduce_scatter_tensor"]
ROOTED = ["broadcast", "reduce", "scatter", "gather"]


@pytest.mark.parametrize("n", [10, 100_000], ids=["small", "multi-segment"])
@pytest.mark.parametrize("op", SYMMETRIC + ROOTED)
def test_size_mismatch_collectives(op, n, transport):
    """4 ranks, rank 0 with 2 elements fewer. No rank hangs or raises anything but a
    DistError; no memory outside the tensors is written; at least one rank detects it.
    In the symmetric collectives every rank's result depends on rank 0's tensor, so
    every rank must raise (a rank returning normally would hold a wrong result)."""
    results = run_threads(4, misuse.size_mismatch, op, n, 2, transport=transport, pg_timeout=PG_TIMEOUT,
                          timeout=120)
    report = _report(results)
    assert all(r["error"] is None or r["dist_error"] for r in results), report
    assert any(r["dist_error"] for r in results), report
    assert all(r["intact"] for r in results), "memory outside the tensors was written:\n" + report
    if op in SYMMETRIC:
        assert all(r["dist_error"] for r in results), report
    # A root may return from its eager send before any receiver has checked the size (as an MPI
    # sender does); the receiver that detects it aborts the group, so the root's next call fails.
    for r in results:
        learnt = r["dist_error"] or (r["follow_up"]["dist_error"] and r["follow_up"]["seconds"] < AT_ONCE)
        assert learnt, "a rank learnt of it late or never:\n" + report


@pytest.mark.slow
def test_size_mismatch_processes():
    results = run_processes(2, misuse.size_mismatch, "all_reduce", 10, 2, init="env", pg_timeout=PG_TIMEOUT,
                            timeout=120)
    report = _report(results)
    for result in results:
        assert result["dist_error"] and result["seconds"] < AT_ONCE, report
        assert result["intact"], report
        assert result["follow_up"]["dist_error"], report
