"""Call fingerprints: an operation's identity (op, dtype, count, root, reduce op) packed in 63
bits and readable back. Ranks compare them — in the shared-memory arena and in every
message header — to detect ranks that called different operations (desync)."""
from __future__ import annotations

import numpy as np

from .ops import RedOpType

OPS = ["barrier", "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
       "all_to_all"]
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
          "float32", "float64", "complex64", "complex128", "longdouble", "clongdouble"]


#: the collectives whose element count must agree on every rank, so the fingerprint includes
#: it (the others' may legitimately differ: gather/scatter/all_to_all parts, barrier)
AGREED_COUNT = frozenset({"broadcast", "all_reduce", "reduce", "all_gather", "reduce_scatter"})
_OP_CODES = {op: i + 1 for i, op in enumerate(OPS)}
_DTYPE_CODES = {np.dtype(name): i + 1 for i, name in enumerate(DTYPES)}


def fingerprint(op: str, dtype: np.dtype | None = None, count: int = 0, root: int = -1, reduce_op: int = 0) -> int:
    """A call's identity packed in 63 bits (op, dtype, reduce op, root, count where it must
    agree: AGREED_COUNT) — readable back."""
    code = _DTYPE_CODES.get(dtype, 0) if dtype is not None else 0
    if op not in AGREED_COUNT:
        count = 0
    return (_OP_CODES[op] << 56 | code << 50 | (reduce_op & 0xF) << 46 | ((root + 1) & 0x3FFF) << 32
            | (count & 0xFFFFFFFF))


def describe_fingerprint(value: int) -> str:
    op = OPS[(value >> 56) - 1] if 0 < (value >> 56) <= len(OPS) else "?"
    code = (value >> 50) & 0x3F
    dtype = DTYPES[code - 1] if 0 < code <= len(DTYPES) else None
    root = ((value >> 32) & 0x3FFF) - 1
    parts = [(f"{value & 0xFFFFFFFF} x {dtype}" if op in AGREED_COUNT else dtype) if dtype else None,
             f"root {root}" if root >= 0 else None,
             _reduce_op_name((value >> 46) & 0xF) if op in ("all_reduce", "reduce", "reduce_scatter") else None]
    return f"{op}(" + ", ".join(p for p in parts if p) + ")"


#: the arguments a fingerprint holds besides the operation: (what differs, shift, mask)
_ARGUMENTS = (("dtypes", 50, 0x3F), ("sizes", 0, 0xFFFFFFFF), ("roots", 32, 0x3FFF), ("reduce ops", 46, 0xF))


def how_calls_differ(mine: int, theirs: int) -> str:
    """What a desync error says first: "ranks called different operations", or for one
    operation which of its arguments differ ("ranks called all_reduce with different sizes")."""
    if mine >> 56 != theirs >> 56:
        return "ranks called different operations"
    differing = [what for what, shift, mask in _ARGUMENTS if (mine >> shift) & mask != (theirs >> shift) & mask]
    return f"ranks called {describe_fingerprint(mine).split('(')[0]} with different {' and '.join(differing)}"


def _reduce_op_name(code: int) -> str:
    return RedOpType(code).name if code in RedOpType._value2member_map_ else "?"
