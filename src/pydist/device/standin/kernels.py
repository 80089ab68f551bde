"""The stand-in's arithmetic on stored bits, computed as torch computes on a device.

Values are stored as their bits (pydist.device.dtypes: bfloat16 as uint16). ``widen`` turns
bits into numbers to compute with: float16 and bfloat16 into float32 (torch's "opmath" for
half types: every operation computes in float32 and rounds once), the rest as themselves;
``narrow`` rounds back (nearest even) and returns bits. Integers wrap on overflow, as on a GPU.
"""
from __future__ import annotations

import numpy as np

from ...core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
from ...core.ops import RedOpType, ReduceOp, postscale, ufunc_of
from ..dtypes import DType


def widen(bits: np.ndarray, kind: DType) -> np.ndarray:
    """The values whose bits are ``bits``, in the type arithmetic on ``kind`` uses."""
    if kind.name == "bfloat16":
        return bf16_bits_to_float32(bits)
    if kind.name == "float16":
        return bits.view(np.float16).astype(np.float32)
    return bits.view(kind.compute)


def narrow(values: np.ndarray, kind: DType) -> np.ndarray:
    """``values`` rounded to ``kind``, as bits."""
    if kind.name == "bfloat16":
        return float32_to_bf16_bits(values).view(kind.storage).reshape(values.shape)
    return np.asarray(values).astype(kind.compute).view(kind.storage)


def reduce(acc: np.ndarray, incoming: np.ndarray, op: RedOpType, kind: DType) -> np.ndarray:
    """The bits of ``acc op incoming`` (AVG and PREMUL_SUM add)."""
    return narrow(ufunc_of(op)(widen(acc, kind), widen(incoming, kind)), kind)


def multiply(bits: np.ndarray, factor: float | int, kind: DType) -> np.ndarray:
    """The bits of ``bits * factor`` (float factor on floats, int on integers)."""
    values = widen(bits, kind)
    return narrow(values * np.asarray(factor).astype(values.dtype), kind)


def divide(bits: np.ndarray, divisor: int, kind: DType) -> np.ndarray:
    """The bits of ``bits / divisor``; integers truncate toward zero (C's, NCCL's division)."""
    values = widen(bits, kind)
    if kind.kind == "f":
        return narrow(values / np.asarray(divisor).astype(values.dtype), kind)
    quotient = values.copy()
    postscale(quotient, ReduceOp(RedOpType.AVG), divisor)
    return narrow(quotient, kind)
