"""Reduction operations: torch's ReduceOp names, dtype rules and numpy reduce kernels.

``reduce_into(acc, incoming, op)`` combines in place (``acc = acc op incoming``) with numpy
ufuncs that release the GIL. AVG and PREMUL_SUM are sums with a step before (scale by the
factor) or after (divide by the group size).
"""
from __future__ import annotations

import enum
import numbers
from typing import TypeAlias

import numpy as np


class RedOpType(enum.IntEnum):
    """The reduction kinds, numbered as torch numbers them."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8


class ReduceOp:
    """torch.distributed.ReduceOp: ``ReduceOp.SUM`` etc.; ``ReduceOp(RedOpType.X)`` also works.

    PREMUL_SUM needs a factor: build it with ``_make_nccl_premul_sum(factor)``.
    """

    RedOpType: TypeAlias = RedOpType  # an alias, so the annotations below may name it
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM

    def __init__(self, op: RedOpType = RedOpType.SUM, factor: float | None = None):
        self.op = RedOpType(op)
        self.factor = factor

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.op == other.op and self.factor == other.factor
        return self.factor is None and self.op == other

    def __hash__(self) -> int:
        return hash((self.op, self.factor))

    def __repr__(self) -> str:
        return f"ReduceOp.{self.op.name}" + ("" if self.factor is None else f"({self.factor})")


class reduce_op:  # noqa: N801 - torch's deprecated alias
    """torch's deprecated spelling of ReduceOp: SUM, PRODUCT, MIN and MAX only."""

    SUM = RedOpType.SUM
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX


def _make_nccl_premul_sum(factor: float) -> ReduceOp:
    """A PREMUL_SUM op: every input is multiplied by ``factor`` before the sum (torch's helper)."""
    if hasattr(factor, "item"):  # a one-element tensor or array
        factor = factor.item()
    if not isinstance(factor, numbers.Number) or isinstance(factor, bool):
        raise TypeError(f"premul_sum factor: expected a number, got {type(factor).__name__}")
    return ReduceOp(RedOpType.PREMUL_SUM, factor)


def as_reduce_op(op: object) -> ReduceOp:
    """Normalise what users pass as ``op=`` (RedOpType, ReduceOp, torch's ReduceOp) to ReduceOp."""
    if isinstance(op, ReduceOp):
        result = op
    elif isinstance(op, RedOpType):
        result = ReduceOp(op)
    elif type(op).__name__ in ("RedOpType", "ReduceOp") and hasattr(op, "name"):
        result = ReduceOp(RedOpType[op.name])  # torch's enum, by name
    else:
        raise TypeError(f"op: expected a ReduceOp (e.g. ReduceOp.SUM), got {op!r}")
    if result.op == RedOpType.PREMUL_SUM and result.factor is None:
        raise ValueError("op: ReduceOp.PREMUL_SUM needs a factor; build it with _make_nccl_premul_sum(factor)")
    return result


_UFUNC = {
    RedOpType.SUM: np.add,
    RedOpType.AVG: np.add,
    RedOpType.PREMUL_SUM: np.add,
    RedOpType.PRODUCT: np.multiply,
    RedOpType.MIN: np.minimum,
    RedOpType.MAX: np.maximum,
    RedOpType.BAND: np.bitwise_and,
    RedOpType.BOR: np.bitwise_or,
    RedOpType.BXOR: np.bitwise_xor,
}
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


def check_op_dtype(op: ReduceOp, dtype: np.dtype, dtype_name: str) -> None:
    """Raise TypeError when ``op`` cannot reduce ``dtype`` (bitwise on floats, MIN/MAX on complex...)."""
    kind = np.dtype(dtype).kind
    if op.op in _BITWISE and kind not in "biu":
        raise TypeError(f"op: ReduceOp.{op.op.name} is a bitwise op and needs an integer or bool "
                        f"tensor, got {dtype_name}")
    if op.op in (RedOpType.MIN, RedOpType.MAX) and kind == "c":
        raise TypeError(f"op: ReduceOp.{op.op.name} is not defined for complex tensors ({dtype_name})")
    if op.op in (RedOpType.AVG, RedOpType.PREMUL_SUM) and kind == "b":
        raise TypeError(f"op: ReduceOp.{op.op.name} is not defined for bool tensors")
    if op.op == RedOpType.PREMUL_SUM and kind in "iu":
        assert op.factor is not None  # as_reduce_op rejects a PREMUL_SUM without one
        if float(op.factor) != int(op.factor):
            raise TypeError(f"op: PREMUL_SUM factor {op.factor} is not an integer, "
                            f"so it cannot scale an integer tensor ({dtype_name})")


def ufunc_of(op: RedOpType) -> np.ufunc:
    """The numpy ufunc that combines two parts under ``op`` (AVG and PREMUL_SUM add: their
    scaling is prescale's and postscale's)."""
    return _UFUNC[op]


def reduce_into(acc: np.ndarray, incoming: np.ndarray, op: ReduceOp) -> None:
    """``acc = acc op incoming`` elementwise, in place."""
    if acc.size:
        _UFUNC[op.op](acc, incoming, out=acc)


def prescale(buf: np.ndarray, op: ReduceOp) -> None:
    """Apply PREMUL_SUM's factor to this rank's contribution, in place (no-op for other ops)."""
    if op.op == RedOpType.PREMUL_SUM and buf.size:
        assert op.factor is not None  # as_reduce_op rejects a PREMUL_SUM without one
        factor = op.factor if buf.dtype.kind in "fc" else int(op.factor)
        np.multiply(buf, np.asarray(factor).astype(buf.dtype), out=buf)


def postscale(buf: np.ndarray, op: ReduceOp, group_size: int) -> None:
    """Apply AVG's division by the group size to a reduced result, in place.

    Integers are divided truncating toward zero, as C (and NCCL) do.
    """
    if op.op != RedOpType.AVG or not buf.size:
        return
    if buf.dtype.kind in "fc":
        np.divide(buf, np.asarray(group_size).astype(buf.dtype), out=buf)
    else:
        inexact_negative = (buf < 0) & (buf % group_size != 0)
        np.floor_divide(buf, group_size, out=buf)
        np.add(buf, inexact_negative, out=buf, casting="unsafe")


def reduce_many(parts: list[np.ndarray], out: np.ndarray, op: ReduceOp) -> None:
    """``out = parts[0] op parts[1] op ...`` in this order (so every rank gets the same bits)."""
    if len(parts) == 1:
        out[...] = parts[0]
        return
    ufunc = _UFUNC[op.op]
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)


def reduce_rows(rows: np.ndarray, out: np.ndarray, op: ReduceOp) -> None:
    """``out = rows[0] op rows[1] op ...`` over the rows of a 2-D array, in that order (the
    bits of reduce_many): one ufunc call for any number of rows, where reduce_many makes one
    per row (16 rows of 4 B: ~1 us instead of ~12; two rows go to the ufunc itself, cheaper
    than its reduce)."""
    ufunc = _UFUNC[op.op]
    if len(rows) == 2:
        ufunc(rows[0], rows[1], out=out)
    elif len(rows) == 1:
        out[...] = rows[0]
    else:
        ufunc.reduce(rows, axis=0, out=out, dtype=out.dtype)
