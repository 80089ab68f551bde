"""Deterministic inputs and naive reference results for the conformance suite.

Every rank can compute every other rank's input, so each rank checks its own results
locally. Values are small integers (exact in every dtype, float16 included), so sums and
products are exact whatever the reduction order.
"""
from __future__ import annotations

import functools

import numpy as np

from ..core.ops import RedOpType, ReduceOp

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]

_UFUNC = {RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PREMUL_SUM: np.add,
          RedOpType.PRODUCT: np.multiply, RedOpType.MIN: np.minimum, RedOpType.MAX: np.maximum,
          RedOpType.BAND: np.bitwise_and, RedOpType.BOR: np.bitwise_or, RedOpType.BXOR: np.bitwise_xor}


def supports(op: RedOpType, dtype: str) -> bool:
    """Whether pydist (like torch) defines ``op`` for ``dtype``."""
    kind = np.dtype(dtype).kind
    if op in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR):
        return kind in "biu"
    if op in (RedOpType.MIN, RedOpType.MAX):
        return kind != "c"
    if op in (RedOpType.AVG, RedOpType.PREMUL_SUM):
        return kind != "b"
    return True


def make_op(op: RedOpType) -> ReduceOp:
    return ReduceOp(op, 2 if op == RedOpType.PREMUL_SUM else None)


def value(rank: int, count: int, dtype: str, salt: int = 0, for_product: bool = False) -> np.ndarray:
    """Rank ``rank``'s input: small integers in ``dtype`` (in {1, 2} for products)."""
    index = np.arange(count, dtype=np.int64)
    raw = (rank * 7 + index * 3 + salt * 5) % 11
    kind = np.dtype(dtype).kind
    if for_product:
        raw = 1 + raw % 2
    elif kind == "b":
        return (raw % 2 == 0)
    elif kind in "ifc":
        raw = raw - 5
    array = raw.astype(dtype)
    if kind == "c":
        array = array + 1j * ((raw + 2) % 3).astype(dtype)
    return array


def reduced(size: int, count: int, dtype: str, op: RedOpType, salt: int = 0) -> np.ndarray:
    """The reduction of every rank's ``value(...)`` under ``op``, computed naively."""
    product = op == RedOpType.PRODUCT
    inputs = [value(r, count, dtype, salt, product) for r in range(size)]
    if op == RedOpType.PREMUL_SUM:
        inputs = [x * np.asarray(2).astype(dtype) for x in inputs]
    result = functools.reduce(lambda a, b: _UFUNC[op](a, b), inputs[1:], inputs[0].copy())
    if op != RedOpType.AVG:
        return result
    if np.dtype(dtype).kind in "fc":
        return (result / np.asarray(size).astype(dtype)).astype(dtype)
    exact = [int(v) for v in result]
    return np.array([abs(v) // size * (1 if v >= 0 else -1) for v in exact], dtype=dtype)
