"""What the device collective tests share: inputs every rank and the test derive alike, and
the numpy references they are checked against.

``inputs(name, count, rank, seed, op)`` are the host values rank ``rank`` uploads (bfloat16 as
int16 bits): floats exact in every float type and whose sums, products and averages stay
exact or round once the way the device rounds (halves in [-8, 8]; for PRODUCT powers of two
up to 2), integers over their full range (sums and products wrap), random bools.
``reduced(parts, op, name, size)`` is the reduction of the ranks' parts in rank order as
numpy computes it, each step in the type arithmetic on ``name`` uses (float32 for the half
types) and rounded to ``name``: what a device computes. ``op_of`` makes the ReduceOp.
"""
from __future__ import annotations

import numpy as np
from device_support import sample

from pydist.core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
from pydist.core.ops import ReduceOp, _make_nccl_premul_sum, postscale
from pydist.device.dtypes import dtype

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
_UFUNCS = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
           "BOR": np.bitwise_or, "BXOR": np.bitwise_xor, "AVG": np.add, "PREMUL_SUM": np.add}


def valid(op: str, name: str) -> bool:
    """Whether ReduceOp ``op`` reduces dtype ``name`` (bitwise ops: not floats; AVG and
    PREMUL_SUM: not bool)."""
    kind = dtype(name).kind
    return not ((op in ("BAND", "BOR", "BXOR") and kind == "f") or (op in ("AVG", "PREMUL_SUM") and kind == "b"))


def factor(name: str) -> float | int:
    """PREMUL_SUM's factor for dtype ``name``."""
    return 0.5 if dtype(name).kind == "f" else 3


def op_of(op: str, name: str) -> ReduceOp:
    if op == "PREMUL_SUM":
        return _make_nccl_premul_sum(factor(name))
    return ReduceOp(getattr(ReduceOp, op))


def inputs(name: str, count: int, rank: int, seed: int = 0, op: str = "SUM") -> np.ndarray:
    """Rank ``rank``'s host values (module docstring)."""
    values = sample(name, (count,), seed=seed * 1009 + rank)
    if op == "PRODUCT" and dtype(name).kind == "f":
        rng = np.random.default_rng(seed * 1009 + rank)
        powers = rng.choice(np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0]), count).astype(np.float32)
        return float32_to_bf16_bits(powers) if name == "bfloat16" else powers.astype(dtype(name).compute)
    return values


def widen(bits: np.ndarray, name: str) -> np.ndarray:
    if name == "bfloat16":
        return bf16_bits_to_float32(bits)
    if name == "float16":
        return bits.astype(np.float32)
    return bits


def narrow(values: np.ndarray, name: str) -> np.ndarray:
    if name == "bfloat16":
        return float32_to_bf16_bits(np.asarray(values, np.float32))
    return np.asarray(values).astype(dtype(name).compute)


def reduced(parts: list[np.ndarray], op: str, name: str, size: int) -> np.ndarray:
    """The reduction of ``parts`` in rank order, as a device computes it (module docstring)."""
    values = [widen(part, name) for part in parts]
    if op == "PREMUL_SUM":
        scale = np.asarray(factor(name)).astype(values[0].dtype)
        values = [widen(narrow(value * scale, name), name) for value in values]
    acc = values[0]
    for value in values[1:]:
        acc = widen(narrow(_UFUNCS[op](acc, value), name), name)
    if op == "AVG":
        if dtype(name).kind == "f":
            acc = acc / np.asarray(size).astype(acc.dtype)
        else:
            acc = acc.copy()
            postscale(acc, ReduceOp(ReduceOp.AVG), size)
    return narrow(acc, name)


def same(got: np.ndarray, expected: np.ndarray) -> bool:
    """Bit for bit (NaN payloads included)."""
    return got.dtype == expected.dtype and got.shape == expected.shape and got.tobytes() == expected.tobytes()
