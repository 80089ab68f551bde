"""Desync detection: ranks that call different operations (or the same one with a
different dtype, count, root or reduce op) at the same point of a group's sequence all
raise, naming both ranks and both calls, instead of hanging or mixing data. Every message
carries its call's fingerprint; the shared-memory arena compares them too."""
from __future__ import annotations

import re

import numpy as np
import pytest

import pydist
from pydist.core.fingerprint import describe_fingerprint, fingerprint, how_calls_differ
from pydist.testing import run_processes, run_threads
from pydist.testing.threads import RankFailed


def test_fingerprints_read_back():
    assert describe_fingerprint(fingerprint("all_reduce", np.dtype(np.float32), 8, reduce_op=0)) == \
        "all_reduce(8 x float32, SUM)"
    assert describe_fingerprint(fingerprint("broadcast", np.dtype(np.int64), 3, root=2)) == \
        "broadcast(3 x int64, root 2)"
    assert describe_fingerprint(fingerprint("barrier")) == "barrier()"


def _calls(rank: int, size: int, case: str) -> None:
    t = np.ones(8, np.float32)
    odd = rank == 1
    if case == "op":
        if odd:
            pydist.all_gather([np.zeros(8, np.float32) for _ in range(size)], t)
        else:
            pydist.all_reduce(t)
    elif case == "count":
        pydist.all_reduce(np.ones(16 if odd else 8, np.float32))
    elif case == "dtype":
        pydist.all_reduce(np.ones(8, np.float64 if odd else np.float32))
    elif case == "root":  # with 2 ranks both think they are the root and only send: the
        pydist.broadcast(t, src=1 if odd else 0)  # desync shows at the next call at the latest
        pydist.barrier()
    elif case == "reduce_op":
        pydist.all_reduce(t, op=pydist.ReduceOp.MAX if odd else pydist.ReduceOp.SUM)
    elif case == "skipped":  # rank 1 skips the barrier: its all_reduce meets the others' barrier
        if not odd:
            pydist.barrier()
        pydist.all_reduce(t)


EXPECTED = {
    "op": ("all_gather(8 x float32)", "all_reduce(8 x float32, SUM)"),
    "count": ("all_reduce(16 x float32, SUM)", "all_reduce(8 x float32, SUM)"),
    "dtype": ("all_reduce(8 x float64, SUM)", "all_reduce(8 x float32, SUM)"),
    "root": ("broadcast(8 x float32, root 1)", "broadcast(8 x float32, root 0)"),
    "reduce_op": ("all_reduce(8 x float32, MAX)", "all_reduce(8 x float32, SUM)"),
    "skipped": ("all_reduce(8 x float32, SUM)", "barrier()"),
}


#: what the error says first: another operation, or which arguments of the same one differ
DIFFERENCE = {"op": "ranks called different operations", "count": "ranks called all_reduce with different sizes",
              "dtype": "ranks called all_reduce with different dtypes",
              "root": "ranks called broadcast with different roots",
              "reduce_op": "ranks called all_reduce with different reduce ops",
              "skipped": "ranks called different operations"}


def test_a_desync_says_which_arguments_of_the_same_operation_differ():
    """An all_reduce of 4 elements against one of 8 is a size mismatch, not "different operations"."""
    four, eight = fingerprint("all_reduce", np.dtype("float32"), 4), fingerprint("all_reduce", np.dtype("float32"), 8)
    assert how_calls_differ(four, eight) == "ranks called all_reduce with different sizes"
    wide = fingerprint("all_reduce", np.dtype("float64"), 8, reduce_op=2)
    assert how_calls_differ(four, wide) == "ranks called all_reduce with different dtypes and sizes and reduce ops"
    assert how_calls_differ(four, fingerprint("broadcast", np.dtype("float32"), 4, root=0)) == \
        "ranks called different operations"


def _check(error: BaseException, size: int, case: str) -> None:
    text = str(error)
    odd_call, other_call = EXPECTED[case]
    assert DIFFERENCE[case] in text, text
    assert odd_call in text and other_call in text, text
    assert re.search(r"rank 1 called " + re.escape(odd_call), text) or \
        re.search(r"rank \d called " + re.escape(other_call) + " while this rank called " + re.escape(odd_call),
                  text), text
    # every rank raised; with mismatched roots a rank fed by an agreeing parent may finish
    # its broadcast and barrier correctly before the abort reaches it
    for rank in range(size) if case != "root" else (0, 1):
        assert f"rank {rank}" in text


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_tcp_ranks_in_different_calls_all_raise(case, size):
    hosts = [f"h{r}" for r in range(size)]  # one host each: the network path
    with pytest.raises(RankFailed) as failed:
        run_threads(size, _calls, case, transport="tcp", hosts=hosts, pg_timeout=20, timeout=60)
    _check(failed.value, size, case)


@pytest.mark.parametrize("case", ["op", "count", "root"])
def test_loopback_ranks_in_different_calls_all_raise(case, monkeypatch):
    monkeypatch.setenv("PYDIST_ALGO_ALL_REDUCE", "ring")
    monkeypatch.setenv("PYDIST_ALGO_BROADCAST", "binomial")
    with pytest.raises(RankFailed) as failed:
        run_threads(3, _calls, case, hosts=["a", "b", "c"], pg_timeout=20, timeout=60)
    _check(failed.value, 3, case)


def _every_collective_in_two_dtypes(rank: int, size: int, op: str) -> None:
    """Rank 1 calls ``op`` on float64 data, the others on float32; then a barrier, so that
    a rank whose part ended without hearing from the others (a root that only sends) fails too."""
    dtype = np.float64 if rank == 1 else np.float32
    t, parts = np.ones(4, dtype), [np.ones(4, dtype) for _ in range(size)]
    calls = {
        "broadcast": lambda: pydist.broadcast(t, src=0),
        "all_reduce": lambda: pydist.all_reduce(t),
        "reduce": lambda: pydist.reduce(t, dst=0),
        "all_gather": lambda: pydist.all_gather(parts, t),
        "all_gather_into_tensor": lambda: pydist.all_gather_into_tensor(np.ones(4 * size, dtype), t),
        "gather": lambda: pydist.gather(t, parts if rank == 0 else None, dst=0),
        "scatter": lambda: pydist.scatter(t, parts if rank == 0 else None, src=0),
        "reduce_scatter": lambda: pydist.reduce_scatter(t, parts),
        "reduce_scatter_tensor": lambda: pydist.reduce_scatter_tensor(t, np.ones(4 * size, dtype)),
        "all_to_all": lambda: pydist.all_to_all([np.ones(4, dtype) for _ in range(size)], parts),
        "all_to_all_single": lambda: pydist.all_to_all_single(np.ones(4 * size, dtype), np.ones(4 * size, dtype)),
    }
    calls[op]()
    pydist.barrier()


#: op -> (engine collective, its description's root/count/reduce-op text)
EVERY = {"broadcast": ("broadcast", "4 x {}, root 0"), "all_reduce": ("all_reduce", "4 x {}, SUM"),
         "reduce": ("reduce", "4 x {}, root 0, SUM"), "all_gather": ("all_gather", "4 x {}"),
         "all_gather_into_tensor": ("all_gather", "4 x {}"), "gather": ("gather", "{}, root 0"),
         "scatter": ("scatter", "{}, root 0"), "reduce_scatter": ("reduce_scatter", "4 x {}, SUM"),
         "reduce_scatter_tensor": ("reduce_scatter", "4 x {}, SUM"), "all_to_all": ("all_to_all", "{}"),
         "all_to_all_single": ("all_to_all", "{}")}


@pytest.mark.parametrize("where", ["network", "shared memory"])
@pytest.mark.parametrize("op", sorted(EVERY))
def test_every_collective_with_another_dtype_on_one_rank_raises_naming_both_calls(op, where):
    hosts = ["a", "b"] if where == "network" else None
    with pytest.raises(RankFailed) as failed:
        run_threads(2, _every_collective_in_two_dtypes, op, transport="tcp", hosts=hosts, pg_timeout=20, timeout=60)
    text = str(failed.value)
    kind, args = EVERY[op]
    assert f"ranks called {kind} with different dtypes" in text, text
    assert f"{kind}({args.format('float64')})" in text and f"{kind}({args.format('float32')})" in text, text


def _one_process(rank: int, size: int, case: str) -> str:
    try:
        _calls(rank, size, case)
    except pydist.DistBackendError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


@pytest.mark.slow
def test_processes_on_one_host_raise_through_shared_memory():
    results = run_processes(3, _one_process, "op", timeout=60)
    assert all("ranks called different operations" in r or "aborted the group" in r for r in results), results
    assert any("all_gather" in r and "all_reduce" in r for r in results), results


def test_same_calls_never_trip_the_check():
    def body(rank, size):
        t = np.arange(5, dtype=np.float32)
        pydist.all_reduce(t)
        pydist.broadcast(t, src=size - 1)
        out = [np.zeros(5, np.float32) for _ in range(size)]
        pydist.all_gather(out, t)
        if rank % 2 == 0:
            pydist.send(np.ones(3, np.int64), rank + 1)  # point-to-point is never checked
        else:
            pydist.recv(np.zeros(3, np.int64), rank - 1)
        return float(t.sum())

    assert len(run_threads(4, body, transport="tcp", hosts=["a", "a", "b", "b"])) == 4
