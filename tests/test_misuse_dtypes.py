"""Misuse of dtypes and objects: reduce ops a dtype does not support, mismatched dtypes in one
call, objects that are not tensors (meta and sparse torch tensors too). Each raises a
TypeError at the call naming the argument; the group stays usable (tests/misuse_support.py)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from misuse_support import LIBS, clean_process_world, run2, torch, transport  # noqa: F401 - fixtures used by every test here

import pydist as dist

# -- reduce ops the dtype does not support --------------------------------------------------

def _float_tensors(lib: str):
    if lib == "torch":
        return [torch.ones(2), torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.float64)]
    return [np.ones(2, np.float16), np.ones(2, np.float32), np.ones(2, np.float64)]


def _complex_tensors(lib: str):
    if lib == "torch":
        return [torch.ones(2, dtype=torch.complex64)]
    return [np.ones(2, np.complex64), np.ones(2, np.complex128)]


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"])
def test_bitwise_op_on_floats(op, collective, lib, transport):
    def fn(rank, size):
        for tensor in _float_tensors(lib):
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


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("op", ["MIN", "MAX"])
def test_min_max_on_complex(op, lib, transport):
    def fn(rank, size):
        for tensor in _complex_tensors(lib):
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
    if case.endswith("-torch"):
        pytest.importorskip("torch")
    call, names, callers = DTYPES[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(TypeError) as info:
                call(rank, size)
            message = str(info.value)
            assert "float32" in message or "int" in message, message
            assert re.search(names, message), f"the message names no argument: {message!r}"

    run2(fn, transport)


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
    pytest.importorskip("torch")
    meta = torch.empty(2, device="meta")
    assert meta.device.type == "meta"

    def fn(rank, size):
        for call in [lambda: dist.all_reduce(meta), lambda: dist.broadcast(meta, src=0),
                     lambda: dist.send(meta, dst=1 - rank), lambda: dist.all_gather([meta, meta], torch.ones(2))]:
            with pytest.raises((ValueError, TypeError), match="meta") as info:
                call()
            assert "cpu" in str(info.value).lower()

    run2(fn, transport)


def test_sparse_tensor_rejected_where_torch_has_no_sparse_version(transport):
    """Sparse tensors are reduced by all_reduce (tests/test_torch_sparse.py); other
    collectives refuse them at the call, as gloo does."""
    pytest.importorskip("torch")
    def fn(rank, size):
        with pytest.raises((ValueError, TypeError), match=r"\btensor\b") as info:
            dist.broadcast(torch.ones(2).to_sparse(), src=0)
        assert "sparse" in str(info.value) or "strided" in str(info.value)

    run2(fn, transport)
