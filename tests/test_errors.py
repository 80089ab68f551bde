"""Misuse raises a clear ValueError/TypeError at the call; runtime failures raise DistError.

Misuse (DESIGN: "Errors say whose fault it is"): bad init_process_group arguments, calls
before init, bad ranks/src/dst, wrong list lengths and sizes, mismatched dtypes, reduce
ops a dtype does not support, read-only outputs, unsupported objects. Each must raise at
the call, before anything is sent (so nothing hangs: only the misusing rank makes the
call), name the argument, and leave the group usable: every such test ends with a real
all_reduce on all ranks, which also proves the failed call consumed no sequence number.
A rank outside a group gets a warning and a no-op.

Runtime failures: sizes that disagree across ranks, receives
that time out, Work.wait(timeout=...) expiring. Ranks are threads (loopback and tcp
transports) for most tests and real processes where the process matters; the rank
functions shared with processes are in tests/seed_programs/misuse.py.
"""
from __future__ import annotations

import os
import re
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # seed_programs must be importable here and in every child
    sys.path.insert(0, str(TESTS))

import pydist as dist  # noqa: E402
from pydist.testing import free_port, run_processes, run_threads  # noqa: E402
from seed_programs import misuse  # noqa: E402

TRANSPORTS = ["loopback", "tcp"]
SHORT = timedelta(seconds=3)  # bounds every init call below, in case a check comes too late
FAST = 1.5  # seconds: a misuse error must come at once, well before SHORT expires


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def clean_process_world():
    """Tests that init in the main thread must not leave the process-wide group behind."""
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def run2(fn, transport: str, size: int = 2, pg_timeout: float = 10.0):
    """Run ``fn(rank, size)`` on thread-ranks, then check the group still works."""

    def body(rank: int, size: int):
        value = fn(rank, size)
        tensor = np.arange(3.0) + rank
        dist.all_reduce(tensor)
        expected = sum(np.arange(3.0) + r for r in range(size))
        assert tensor.tolist() == expected.tolist(), "the group is unusable after the misuse error"
        return value

    return run_threads(size, body, transport=transport, timeout=60, pg_timeout=pg_timeout)


def ro(values=(1.0, 2.0)) -> np.ndarray:
    array = np.array(values)
    array.flags.writeable = False
    return array


# -- init_process_group --------------------------------------------------------------------

def quick(call, exc, match):
    """``call()`` raises ``exc`` matching ``match``, within FAST seconds."""
    start = time.monotonic()
    with pytest.raises(exc, match=match) as info:
        call()
    assert time.monotonic() - start < FAST, f"took {time.monotonic() - start:.2f} s: {info.value}"
    assert not dist.is_initialized()
    return info.value


def test_init_twice_threads(transport):
    def fn(rank, size):
        with pytest.raises(ValueError, match="twice"):
            dist.init_process_group("pydist", store=dist.HashStore(), rank=rank, world_size=size)

    run2(fn, transport)


def test_init_twice_process():
    results = run_processes(2, misuse.init_twice, init="env", timeout=60)
    for result in results:
        assert result["again"]["error"] == "ValueError" and "twice" in result["again"]["message"], result
        assert result["still_works"] == [2.0, 2.0]


@pytest.mark.parametrize("backend", ["gloo", "nccl", "GLOO", "ucc", "bogus"])  # "mpi" is a backend: test_mpi_backend
def test_init_bad_backend(backend):
    # rank 1 of a tcp:// rendezvous nobody serves: a late check would block on the store
    error = quick(lambda: dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                                                  rank=1, world_size=2, timeout=SHORT),
                  ValueError, "pydist")
    assert backend in str(error) and "backend" in str(error)


def test_init_backend_not_a_string():
    quick(lambda: dist.init_process_group(5, store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT),
          TypeError, "backend")


@pytest.mark.parametrize("backend", [None, "pydist", "PYDIST", dist.Backend.PYDIST])
def test_init_valid_backends(backend):
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT)
    assert dist.get_backend() == "pydist"
    tensor = np.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("rank, world_size", [(2, 2), (5, 2), (-1, 2), (-3, 4), (0, 0)])
def test_init_rank_out_of_range_store(rank, world_size):
    error = quick(lambda: dist.init_process_group(store=dist.HashStore(), rank=rank, world_size=world_size,
                                                  timeout=SHORT), ValueError, "rank|world_size")
    assert str(rank) in str(error) or str(world_size) in str(error)


@pytest.mark.parametrize("scheme", ["tcp", "env"])
@pytest.mark.parametrize("rank", [2, 7, -2])
def test_init_rank_out_of_range_rendezvous(scheme, rank, monkeypatch):
    port = free_port()
    if scheme == "env":
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        call = lambda: dist.init_process_group("pydist", timeout=SHORT)  # noqa: E731
    else:
        call = lambda: dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{port}",  # noqa: E731
                                               rank=rank, world_size=2, timeout=SHORT)
    error = quick(call, ValueError, "rank")
    assert str(rank) in str(error)


def test_init_rank_out_of_range_file_leaves_no_file(tmp_path):
    path = tmp_path / "sharedfile"
    quick(lambda: dist.init_process_group("pydist", init_method=f"file://{path}", rank=3, world_size=2,
                                          timeout=SHORT), ValueError, "rank")
    # seed 002: a file:// init needs a file that does not exist; a rejected call must not
    # leave one behind for the next init_process_group on that path
    assert not path.exists(), f"rejected file:// init left {path} ({path.stat().st_size} bytes)"


def test_init_store_and_init_method():
    error = quick(lambda: dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{free_port()}",
                                                  store=dist.HashStore(), rank=0, world_size=1, timeout=SHORT),
                  ValueError, "init_method")
    assert "store" in str(error)


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])
def test_init_env_missing_variable(missing, monkeypatch):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "2"}
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for name, value in env.items():
        if name == missing:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    quick(lambda: dist.init_process_group("pydist", timeout=SHORT), ValueError, missing)
    quick(lambda: dist.init_process_group("pydist", init_method="env://", timeout=SHORT), ValueError, missing)


@pytest.mark.parametrize("name, value", [("MASTER_PORT", "abc"), ("RANK", "x"), ("WORLD_SIZE", "two")])
def test_init_env_not_a_number(name, value, monkeypatch):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "2", name: value}
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    quick(lambda: dist.init_process_group("pydist", timeout=SHORT), ValueError, name)


# -- calls before init_process_group --------------------------------------------------------

BEFORE_INIT = {
    "all_reduce": lambda: dist.all_reduce(np.ones(2)),
    "broadcast": lambda: dist.broadcast(np.ones(2), src=0),
    "reduce": lambda: dist.reduce(np.ones(2), dst=0),
    "all_gather": lambda: dist.all_gather([np.ones(2)], np.ones(2)),
    "gather": lambda: dist.gather(np.ones(2), dst=0),
    "scatter": lambda: dist.scatter(np.ones(2), src=0),
    "barrier": lambda: dist.barrier(),
    "send": lambda: dist.send(np.ones(2), dst=1),
    "recv": lambda: dist.recv(np.ones(2), src=1),
    "isend": lambda: dist.isend(np.ones(2), dst=1),
    "new_group": lambda: dist.new_group([0]),
    "get_rank": lambda: dist.get_rank(),
    "get_world_size": lambda: dist.get_world_size(),
}


@pytest.mark.parametrize("name", list(BEFORE_INIT))
def test_call_before_init(name):
    quick(BEFORE_INIT[name], ValueError, "init_process_group")


# -- new_group ------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, exc, match", [
    ([0, 0], ValueError, "twice|duplicate"),
    ([1, 0, 1], ValueError, "twice|duplicate"),
    ([0, 2], ValueError, "2"),
    ([0, 7], ValueError, "7"),
    ([-1, 0], ValueError, "-1"),
    (["0"], TypeError, "ranks"),
])
def test_new_group_bad_ranks(ranks, exc, match, transport):
    def fn(rank, size):
        with pytest.raises(exc, match=match) as info:
            dist.new_group(ranks)
        assert "rank" in str(info.value)

    run2(fn, transport)


# -- bad src / dst --------------------------------------------------------------------------

BAD_PEER = {
    "broadcast-src-out-of-range": (lambda r: dist.broadcast(np.ones(2), src=2), ValueError, r"\bsrc\b"),
    "broadcast-src-negative": (lambda r: dist.broadcast(np.ones(2), src=-1), ValueError, r"\bsrc\b"),
    "broadcast-src-missing": (lambda r: dist.broadcast(np.ones(2)), ValueError, r"\bsrc\b"),
    "broadcast-src-str": (lambda r: dist.broadcast(np.ones(2), src="0"), TypeError, r"\bsrc\b"),
    "broadcast-group_src-out-of-range": (lambda r: dist.broadcast(np.ones(2), group_src=2), ValueError,
                                         r"\bgroup_src\b"),
    "broadcast-src-and-group_src": (lambda r: dist.broadcast(np.ones(2), src=0, group_src=0), ValueError,
                                    r"\bsrc\b"),
    "reduce-dst": (lambda r: dist.reduce(np.ones(2), dst=2), ValueError, r"\bdst\b"),
    "gather-dst": (lambda r: dist.gather(np.ones(2), dst=5), ValueError, r"\bdst\b"),
    "scatter-src": (lambda r: dist.scatter(np.ones(2), src=-3), ValueError, r"\bsrc\b"),
    "send-dst-out-of-range": (lambda r: dist.send(np.ones(2), dst=2), ValueError, r"\bdst\b"),
    "send-to-self": (lambda r: dist.send(np.ones(2), dst=r), ValueError, r"\bdst\b"),
    "recv-src-out-of-range": (lambda r: dist.recv(np.ones(2), src=9), ValueError, r"\bsrc\b"),
    "recv-from-self": (lambda r: dist.recv(np.ones(2), src=r), ValueError, r"\bsrc\b"),
    "isend-dst-negative": (lambda r: dist.isend(np.ones(2), dst=-1), ValueError, r"\bdst\b"),
    "irecv-src-out-of-range": (lambda r: dist.irecv(np.ones(2), src=7), ValueError, r"\bsrc\b"),
    "send-tag-str": (lambda r: dist.send(np.ones(2), dst=1 - r, tag="x"), TypeError, r"\btag\b"),
}


@pytest.mark.parametrize("case", list(BAD_PEER))
def test_bad_src_dst(case, transport):
    call, exc, match = BAD_PEER[case]

    def fn(rank, size):
        with pytest.raises(exc, match=match):
            call(rank)

    run2(fn, transport)


# -- a rank outside the group: no-op with a warning -----------------------------------------

def test_non_member_all_reduce_warns(transport):
    def fn(rank, size):
        group = dist.new_group([0])
        tensor = np.array([1.0, 2.0, 3.0]) * (rank + 1)
        if rank == 1:
            assert group is dist.GroupMember.NON_GROUP_MEMBER
            with pytest.warns(UserWarning, match="all_reduce"):
                assert dist.all_reduce(tensor, group=group) is None
            assert tensor.tolist() == [2.0, 4.0, 6.0]  # untouched
            assert (dist.get_rank(group), dist.get_world_size(group)) == (-1, -1)
        else:
            dist.all_reduce(tensor, group=group)
            assert tensor.tolist() == [1.0, 2.0, 3.0]

    run2(fn, transport)


def test_non_member_calls_warn_process():
    results = run_processes(2, misuse.non_member_calls, init="tcp", timeout=60)
    outside = results[1]
    assert outside["is_non_member"] and outside["rank_in_group"] == (-1, -1)
    assert outside["tensor"] == [1.0, 2.0, 3.0]
    for name in ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "barrier", "isend",
                 "irecv"]:
        assert outside[name]["returned"] == "None", (name, outside[name])
        warned = outside[name]["warnings"]
        assert len(warned) == 1 and warned[0][0] == "UserWarning" and name in warned[0][1], (name, warned)
    assert results[0]["tensor"] == [0.0, 1.0, 2.0]


# -- reduce ops the dtype does not support --------------------------------------------------

def _float_tensors():
    return [np.ones(2, np.float16), np.ones(2, np.float32), np.ones(2, np.float64), torch.ones(2),
            torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float64)]


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"])
def test_bitwise_op_on_floats(op, collective, transport):
    def fn(rank, size):
        for tensor in _float_tensors():
            calls = {
                "all_reduce": lambda: dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op)),
                "reduce": lambda: dist.reduce(tensor, dst=0, op=getattr(dist.ReduceOp, op)),
                "reduce_scatter": lambda: dist.reduce_scatter(tensor, [tensor.clone() if hasattr(tensor, "clone")
                                                                       else tensor.copy()] * size,
                                                              op=getattr(dist.ReduceOp, op)),
                "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(tensor[:1], tensor,
                                                                            op=getattr(dist.ReduceOp, op)),
            }
            with pytest.raises(TypeError) as info:
                calls[collective]()
            assert op in str(info.value) and _dtype_name(tensor) in str(info.value), str(info.value)

    run2(fn, transport)


@pytest.mark.parametrize("op", ["MIN", "MAX"])
def test_min_max_on_complex(op, transport):
    def fn(rank, size):
        for tensor in [np.ones(2, np.complex64), np.ones(2, np.complex128), torch.ones(2, dtype=torch.complex64)]:
            for call in [lambda: dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op)),
                         lambda: dist.reduce(tensor, dst=1, op=getattr(dist.ReduceOp, op))]:
                with pytest.raises(TypeError) as info:
                    call()
                assert op in str(info.value) and _dtype_name(tensor) in str(info.value), str(info.value)

    run2(fn, transport)


def test_supported_ops_still_work(transport):
    """Controls for the two tests above: the same ops on dtypes that support them."""

    def fn(rank, size):
        bits = np.array([0b1100, 0b1010], np.int64) >> rank
        out = {}
        for op in ["BAND", "BOR", "BXOR"]:
            tensor = bits.copy()
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
            out[op] = tensor.tolist()
        flags = np.array([True, rank == 0])
        dist.all_reduce(flags, op=dist.ReduceOp.BOR)
        out["bool"] = flags.tolist()
        value = np.array([1.0 + rank, -rank])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        out["MAX"] = value.tolist()
        return out

    a, b = np.array([0b1100, 0b1010]), np.array([0b1100, 0b1010]) >> 1
    for out in run2(fn, transport):
        assert out == {"BAND": (a & b).tolist(), "BOR": (a | b).tolist(), "BXOR": (a ^ b).tolist(),
                       "bool": [True, True], "MAX": [2.0, 0.0]}


# -- wrong list lengths and sizes -----------------------------------------------------------

ONE = lambda n=2: np.ones(n)  # noqa: E731
SHAPES = {
    # name: (call(rank, size), exception, match, ranks that make the call)
    "all_gather-list-short": (lambda r, s: dist.all_gather([ONE()], ONE()), ValueError, "tensor_list", None),
    "all_gather-list-long": (lambda r, s: dist.all_gather([ONE()] * 3, ONE()), ValueError, "tensor_list", None),
    "all_gather-own-slot-size": (lambda r, s: dist.all_gather([ONE(3), ONE(3)], ONE()), ValueError,
                                 "tensor_list", None),
    "gather-list-long": (lambda r, s: dist.gather(ONE(), [ONE()] * 3, dst=0), ValueError, "gather_list", [0]),
    "gather-list-item-size": (lambda r, s: dist.gather(ONE(), [ONE(), ONE(5)], dst=0), ValueError,
                              "gather_list", [0]),
    "gather-list-missing-on-dst": (lambda r, s: dist.gather(ONE(), None, dst=0), ValueError, "gather_list", [0]),
    "scatter-list-short": (lambda r, s: dist.scatter(ONE(), [ONE()], src=0), ValueError, "scatter_list", [0]),
    "scatter-list-item-size": (lambda r, s: dist.scatter(ONE(), [ONE(), ONE(3)], src=0), ValueError,
                               "scatter_list", [0]),
    "reduce_scatter-list-long": (lambda r, s: dist.reduce_scatter(ONE(), [ONE()] * 3), ValueError,
                                 "input_list", None),
    "reduce_scatter-item-size": (lambda r, s: dist.reduce_scatter(ONE(), [ONE(), ONE(4)]), ValueError,
                                 "input_list", None),
    "all_to_all-output-long": (lambda r, s: dist.all_to_all([ONE()] * 3, [ONE()] * 2), ValueError,
                               "output_tensor_list", None),
    "all_to_all-input-short": (lambda r, s: dist.all_to_all([ONE()] * 2, [ONE()]), ValueError,
                               "input_tensor_list", None),
    "all_gather_into_tensor-output-3": (lambda r, s: dist.all_gather_into_tensor(ONE(3), ONE()), ValueError,
                                        "output_tensor", None),
    "all_gather_into_tensor-output-5": (lambda r, s: dist.all_gather_into_tensor(ONE(5), ONE()), ValueError,
                                        "output_tensor", None),
    "all_gather_into_tensor-output-2": (lambda r, s: dist.all_gather_into_tensor(ONE(2), ONE()), ValueError,
                                        "output_tensor", None),
    "reduce_scatter_tensor-input-3": (lambda r, s: dist.reduce_scatter_tensor(ONE(), ONE(3)), ValueError,
                                      r"\binput\b", None),
    "reduce_scatter_tensor-output-3": (lambda r, s: dist.reduce_scatter_tensor(ONE(3), ONE(4)), ValueError,
                                       r"\boutput\b|\binput\b", None),
    "all_to_all_single-splits": (lambda r, s: dist.all_to_all_single(ONE(4), ONE(4), [1, 1], [2, 2]),
                                 ValueError, r"\boutput\b|split", None),
    "all_to_all_single-not-divisible": (lambda r, s: dist.all_to_all_single(ONE(3), ONE(3)), ValueError,
                                        r"\boutput\b|\binput\b", None),
    "all_gather-not-a-list": (lambda r, s: dist.all_gather(ONE(4), ONE()), TypeError, "tensor_list", None),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_wrong_lengths_and_sizes(case, transport):
    call, exc, match, callers = SHAPES[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(exc, match=match):
                call(rank, size)

    run2(fn, transport)


# -- mismatched dtypes within one call ------------------------------------------------------

F32, F64, I64 = np.float32, np.float64, np.int64
DTYPES = {
    # name: (call(rank, size), a regex naming an argument, ranks that make the call)
    "all_gather": (lambda r, s: dist.all_gather([np.ones(2, F32)] * 2, np.ones(2, I64)), r"tensor_list|\btensor\b",
                   None),
    "all_gather-mixed-list": (lambda r, s: dist.all_gather([np.ones(2, F64), np.ones(2, F32)], np.ones(2, F64)),
                              r"tensor_list", None),
    "all_gather-torch": (lambda r, s: dist.all_gather([torch.ones(2)] * 2, torch.ones(2, dtype=torch.int32)),
                         r"tensor_list|\btensor\b", None),
    "gather": (lambda r, s: dist.gather(np.ones(2, F32), [np.ones(2, F64)] * 2, dst=0), r"gather_list|\btensor\b",
               [0]),
    "scatter": (lambda r, s: dist.scatter(np.ones(2, F32), [np.ones(2, F64)] * 2, src=0),
                r"scatter_list|\btensor\b", [0]),
    "reduce_scatter": (lambda r, s: dist.reduce_scatter(np.ones(2, F32), [np.ones(2, F64)] * 2),
                       r"input_list|\boutput\b", None),
    "all_to_all": (lambda r, s: dist.all_to_all([np.ones(2, F32)] * 2, [np.ones(2, F64)] * 2),
                   r"output_tensor_list|input_tensor_list", None),
    "all_gather_into_tensor": (lambda r, s: dist.all_gather_into_tensor(np.ones(4, F32), np.ones(2, F64)),
                               r"output_tensor|input_tensor", None),
    "reduce_scatter_tensor": (lambda r, s: dist.reduce_scatter_tensor(np.ones(2, F32), np.ones(4, F64)),
                              r"\boutput\b|\binput\b", None),
    "all_to_all_single": (lambda r, s: dist.all_to_all_single(np.ones(4, F32), np.ones(4, F64)),
                          r"\boutput\b|\binput\b", None),
}


@pytest.mark.parametrize("case", list(DTYPES))
def test_mismatched_dtypes(case, transport):
    call, names, callers = DTYPES[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(TypeError) as info:
                call(rank, size)
            message = str(info.value)
            assert "float32" in message or "int" in message, message
            assert re.search(names, message), f"the message names no argument: {message!r}"

    run2(fn, transport)


# -- gather_list / scatter_list on the wrong rank -------------------------------------------

def test_gather_list_on_non_dst(transport):
    def fn(rank, size):
        if rank == 1:
            with pytest.raises(ValueError, match="gather_list"):
                dist.gather(np.ones(2), [np.zeros(2), np.zeros(2)], dst=0)
            with pytest.raises(ValueError, match="scatter_list"):
                dist.scatter(np.ones(2), [np.zeros(2), np.zeros(2)], src=0)

    run2(fn, transport)


# -- read-only outputs ----------------------------------------------------------------------

READ_ONLY = {
    # name: (call(rank), argument named in the message, ranks that make the call)
    "all_reduce": (lambda r: dist.all_reduce(ro()), "tensor", None),
    "broadcast": (lambda r: dist.broadcast(ro(), src=0), "tensor", None),
    "reduce-dst": (lambda r: dist.reduce(ro(), dst=0), "tensor", [0]),
    "recv": (lambda r: dist.recv(ro(), src=0), "tensor", [1]),
    "irecv": (lambda r: dist.irecv(ro(), src=0), "tensor", [1]),
    "recv-bytes": (lambda r: dist.recv(b"\0" * 16, src=0), "tensor", [1]),
    "scatter-output": (lambda r: dist.scatter(ro(), None, src=0), "tensor", [1]),
    "all_gather-list": (lambda r: dist.all_gather([np.zeros(2), ro()], np.ones(2)), r"tensor_list\[1\]", None),
    "gather-list": (lambda r: dist.gather(np.ones(2), [ro(), np.zeros(2)], dst=0), r"gather_list\[0\]", [0]),
    "reduce_scatter-output": (lambda r: dist.reduce_scatter(ro(), [np.ones(2)] * 2), r"\boutput\b", None),
    "all_gather_into_tensor-output": (lambda r: dist.all_gather_into_tensor(ro((0.0,) * 4), np.ones(2)),
                                      "output_tensor", None),
    "reduce_scatter_tensor-output": (lambda r: dist.reduce_scatter_tensor(ro(), np.ones(4)), r"\boutput\b", None),
    "all_to_all-output": (lambda r: dist.all_to_all([ro(), np.zeros(2)], [np.ones(2)] * 2),
                          r"output_tensor_list\[0\]", None),
}


@pytest.mark.parametrize("case", list(READ_ONLY))
def test_read_only_output(case, transport):
    call, name, callers = READ_ONLY[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(ValueError, match=name) as info:
                call(rank)
            assert "read-only" in str(info.value) or "readonly" in str(info.value) or "writ" in str(info.value)

    run2(fn, transport)


def test_read_only_inputs_are_fine(transport):
    """Inputs are only read: read-only arrays (and bytes) are accepted where they are inputs."""

    def fn(rank, size):
        out = {}
        if rank == 0:
            dist.send(ro((5.0, 6.0)), dst=1)
            dist.send(np.array([7, 8], np.uint8).tobytes(), dst=1)
        else:
            got, raw = np.zeros(2), bytearray(2)
            dist.recv(got, src=0)
            dist.recv(raw, src=0)
            out["recv"], out["bytes"] = got.tolist(), list(raw)
        gathered = [np.zeros(2), np.zeros(2)]
        dist.all_gather(gathered, ro((float(rank),) * 2))
        out["all_gather"] = [g.tolist() for g in gathered]
        flat = np.zeros(4)
        dist.all_gather_into_tensor(flat, ro((float(rank),) * 2))
        out["all_gather_into_tensor"] = flat.tolist()
        mine = np.zeros(2)
        dist.scatter(mine, [ro((0.0, 0.0)), ro((1.0, 1.0))] if rank == 0 else None, src=0)
        out["scatter"] = mine.tolist()
        reduced = np.zeros(2)
        dist.reduce_scatter(reduced, [ro((1.0, 1.0)), ro((2.0, 2.0))])
        out["reduce_scatter"] = reduced.tolist()
        return out

    first, second = run2(fn, transport)
    assert second["recv"] == [5.0, 6.0] and second["bytes"] == [7, 8]
    for rank, out in enumerate([first, second]):
        assert out["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert out["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert out["scatter"] == [float(rank)] * 2
        assert out["reduce_scatter"] == [2.0 * (rank + 1)] * 2


# -- unsupported objects --------------------------------------------------------------------

UNSUPPORTED = {
    "list": [1.0, 2.0, 3.0],
    "str": "abc",
    "None": None,
    "dict": {"a": 1},
    "float": 3.0,
    "object-array": np.array([1, None], dtype=object),
    "str-array": np.array(["a", "b"]),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_input_types(case, transport):
    obj = UNSUPPORTED[case]

    def fn(rank, size):
        with pytest.raises(TypeError, match=r"\btensor\b"):
            dist.all_reduce(obj)
        with pytest.raises(TypeError, match=r"\btensor\b"):
            dist.broadcast(obj, src=0)
        with pytest.raises(TypeError, match=r"\btensor\b"):
            dist.send(obj, dst=1 - rank)
        with pytest.raises(TypeError, match=r"tensor_list\[0\]"):
            dist.all_gather([obj, np.ones(2)], np.ones(2))

    run2(fn, transport)


def test_meta_device_tensor_rejected(transport):
    meta = torch.empty(2, device="meta")
    assert meta.device.type == "meta"

    def fn(rank, size):
        for call in [lambda: dist.all_reduce(meta), lambda: dist.broadcast(meta, src=0),
                     lambda: dist.send(meta, dst=1 - rank), lambda: dist.all_gather([meta, meta], torch.ones(2))]:
            with pytest.raises((ValueError, TypeError), match="meta") as info:
                call()
            assert "cpu" in str(info.value).lower()

    run2(fn, transport)


def test_sparse_tensor_rejected(transport):
    def fn(rank, size):
        with pytest.raises((ValueError, TypeError), match=r"\btensor\b") as info:
            dist.all_reduce(torch.ones(2).to_sparse())
        assert "sparse" in str(info.value) or "strided" in str(info.value)

    run2(fn, transport)


def test_group_argument_of_wrong_type(transport):
    def fn(rank, size):
        with pytest.raises(TypeError, match="group"):
            dist.all_reduce(np.ones(2), group="world")

    run2(fn, transport)


# -- runtime failures: ranks that disagree --------------------------------------------------

def _report(results) -> str:
    return "\n".join(f"  rank {rank}: {r['error']} after {r['seconds']:.2f} s: {r['message'][:160]}; "
                     f"follow-up {r['follow_up']['error']} after {r['follow_up']['seconds']:.2f} s"
                     for rank, r in enumerate(results))


PG_TIMEOUT = 2.0


@pytest.mark.parametrize("extra", [2, -2], ids=["rank0-smaller", "rank0-larger"])
def test_size_mismatch_all_reduce_two_ranks(extra, transport):
    """Rank 0 all_reduces 10 elements, rank 1 12 (or 8): both ranks raise a DistError at
    once (each receives a message of the wrong size), nothing outside the tensors is
    written, and the group is then broken: the next call fails fast."""
    results = run_threads(2, misuse.size_mismatch, "all_reduce", 10, extra, transport=transport,
                          pg_timeout=PG_TIMEOUT, timeout=60)
    report = _report(results)
    for result in results:
        assert result["dist_error"], report
        assert result["seconds"] < PG_TIMEOUT, "detected only by the timeout:\n" + report
        assert result["intact"], "memory outside the tensors was written:\n" + report
        assert result["follow_up"]["dist_error"], report
        assert result["follow_up"]["seconds"] < PG_TIMEOUT, report


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
                          timeout=60)
    report = _report(results)
    assert all(r["error"] is None or r["dist_error"] for r in results), report
    assert any(r["dist_error"] for r in results), report
    assert all(r["intact"] for r in results), "memory outside the tensors was written:\n" + report
    if op in SYMMETRIC:
        assert all(r["dist_error"] for r in results), report
    for r in results:  # after the failure no rank's next call may succeed on a desynchronised group ...
        assert r["follow_up"]["error"] is None or r["follow_up"]["dist_error"], report
    assert any(r["follow_up"]["dist_error"] for r in results), report


def test_size_mismatch_processes():
    results = run_processes(2, misuse.size_mismatch, "all_reduce", 10, 2, init="env", pg_timeout=PG_TIMEOUT,
                            timeout=60)
    report = _report(results)
    for result in results:
        assert result["dist_error"] and result["seconds"] < PG_TIMEOUT, report
        assert result["intact"], report
        assert result["follow_up"]["dist_error"], report


# -- runtime failures: timeouts -------------------------------------------------------------

def _check_timeouts(observed: dict, short: float) -> None:
    recv = observed["recv"]
    assert recv["error"] == "DistBackendError", recv
    assert "recv" in recv["message"] and "rank 1" in recv["message"], recv
    assert short * 0.9 <= recv["seconds"] < short + 5, recv
    wait = observed["wait"]
    assert wait["error"] == "DistBackendError" and wait["seconds"] < short * 0.9, wait
    assert "recv" in wait["message"] and "rank 1" in wait["message"], wait
    assert observed["wait_completed"] is False
    assert observed["wait_timedelta"]["error"] == "DistBackendError", observed["wait_timedelta"]
    anyone = observed["any_source"]
    assert anyone["error"] == "DistBackendError" and "any" in anyone["message"], anyone


def test_recv_timeout_threads(transport):
    results = run_threads(2, misuse.recv_times_out, 1.0, transport=transport, timeout=60)
    _check_timeouts(results[0], 1.0)


def test_recv_timeout_processes():
    results = run_processes(2, misuse.recv_times_out, 1.0, init="file", timeout=60)
    _check_timeouts(results[0], 1.0)


def test_collective_timeout_names_op_and_rank(transport):
    results = run_threads(2, misuse.collective_times_out, 1.0, transport=transport, timeout=60)
    error = results[0]["all_reduce"]
    assert error["error"] == "OpTimeoutError" and 0.9 <= error["seconds"] < 6, error  # a DistBackendError
    assert "all_reduce" in error["message"] and "rank 1" in error["message"], error
    assert "ranks that never reached it: 1 (" in error["message"], error


def test_work_wait_timeout_on_async_collective(transport):
    """Work.wait(timeout=...) on an all_reduce that rank 1 has not joined yet raises;
    once rank 1 joins, the operation completes."""

    def fn(rank, size):
        tensor = np.ones(2) * (rank + 1)
        if rank == 0:
            work = dist.all_reduce(tensor, async_op=True)
            start = time.monotonic()
            with pytest.raises(dist.DistBackendError, match="all_reduce"):
                work.wait(timeout=timedelta(milliseconds=100))
            assert time.monotonic() - start < 1.0
            dist.send(np.ones(1), dst=1)  # now let rank 1 join
            work.wait()
        else:
            dist.recv(np.zeros(1), src=0)
            dist.all_reduce(tensor)
        return tensor.tolist()

    assert run2(fn, transport) == [[3.0, 3.0], [3.0, 3.0]]


def test_no_warning_for_members(transport):
    """Control for the non-member tests: members calling on their group get no warning."""

    def fn(rank, size):
        group = dist.new_group([0, 1])
        tensor = np.ones(2)
        if rank == 1:  # catch_warnings is process-wide: one thread-rank only
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                dist.all_reduce(tensor, group=group)
            assert not caught, [str(w.message) for w in caught]
        else:
            dist.all_reduce(tensor, group=group)
        return tensor.tolist()

    assert run2(fn, transport) == [[2.0, 2.0], [2.0, 2.0]]


def test_env_init_in_child_process_missing_master_addr():
    """A fresh process (no MASTER_ADDR in its environment) gets the ValueError too."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    code = ("import pydist as dist\n"
            "try:\n"
            "    dist.init_process_group('pydist', rank=0, world_size=1)\n"
            "except ValueError as e:\n"
            "    print('ValueError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("ValueError") and "MASTER_ADDR" in out.stdout, out.stdout + out.stderr
