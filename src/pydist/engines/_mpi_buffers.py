"""numpy buffers as MPI buffer specifications, and ReduceOps as MPI ops.

Data that is only moved (broadcast, gathers, scatters, all_to_all, point-to-point) travels
as MPI_BYTE, so every dtype works. Reductions use MPI's predefined datatype for the dtype
(float16 is MPIX_C_FLOAT16 on MPICH; bfloat16 never reaches here: pydist's buffer layer
reduces it in float32) and MPI's predefined ops: bool reduces with MPI's logical ops (SUM,
MAX, BOR -> LOR; PRODUCT, MIN, BAND -> LAND; BXOR -> LXOR), AVG and PREMUL_SUM as SUM (the
caller scales before and divides after, see pydist.core.ops).

``span(arrays)`` is one flat view over arrays that lie back to back in memory (the blocks of
``all_gather_into_tensor``, ``all_to_all_single``...), so such calls need no staging copy.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import RedOpType, ReduceOp
from ._mpi_world import load_mpi

_DATATYPES: dict = {}
_OPS: dict = {}


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A 1-D contiguous array's memory as uint8 (no copy)."""
    return array.reshape(-1).view(np.uint8)


def byte_spec(array: np.ndarray) -> list:
    """``array`` as an MPI buffer of bytes."""
    return [as_bytes(array), load_mpi().BYTE]


def datatype(dtype: np.dtype):
    """MPI's predefined datatype for a native-order numpy dtype."""
    found = _DATATYPES.get(dtype)
    if found is None:
        found = _DATATYPES[dtype] = load_mpi().Datatype.fromcode(dtype.char)
    return found


def typed_spec(array: np.ndarray) -> list:
    return [array, datatype(array.dtype)]


def mpi_op(op: ReduceOp, dtype: np.dtype):
    """The MPI op that computes ``op`` on ``dtype`` (AVG and PREMUL_SUM: SUM)."""
    key = (op.op, dtype.kind == "b")
    found = _OPS.get(key)
    if found is None:
        mpi = load_mpi()
        if dtype.kind == "b":
            table = {RedOpType.SUM: mpi.LOR, RedOpType.MAX: mpi.LOR, RedOpType.BOR: mpi.LOR,
                     RedOpType.PRODUCT: mpi.LAND, RedOpType.MIN: mpi.LAND, RedOpType.BAND: mpi.LAND,
                     RedOpType.BXOR: mpi.LXOR}
        else:
            table = {RedOpType.SUM: mpi.SUM, RedOpType.AVG: mpi.SUM, RedOpType.PREMUL_SUM: mpi.SUM,
                     RedOpType.PRODUCT: mpi.PROD, RedOpType.MIN: mpi.MIN, RedOpType.MAX: mpi.MAX,
                     RedOpType.BAND: mpi.BAND, RedOpType.BOR: mpi.BOR, RedOpType.BXOR: mpi.BXOR}
        if op.op not in table:
            raise TypeError(f"op: ReduceOp.{op.op.name} is not defined for bool tensors")
        found = _OPS[key] = table[op.op]
    return found


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def span(arrays: list[np.ndarray]) -> np.ndarray | None:
    """One flat array over ``arrays`` when they share a dtype and lie back to back in memory
    (empty ones anywhere); None otherwise."""
    filled = [a for a in arrays if a.size]
    if not filled:
        return np.empty(0, arrays[0].dtype if arrays else np.uint8)
    first = filled[0]
    start, itemsize = address(first), first.itemsize
    offset = 0
    for array in filled:
        if array.dtype != first.dtype or address(array) != start + offset:
            return None
        offset += array.nbytes
    if len(filled) == 1:
        return first
    return np.lib.stride_tricks.as_strided(first, shape=(offset // itemsize,), strides=(itemsize,))


def counts_and_displacements(arrays: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """Byte counts of ``arrays`` and their offsets when laid back to back."""
    counts = [a.nbytes for a in arrays]
    displacements, total = [], 0
    for count in counts:
        displacements.append(total)
        total += count
    return counts, displacements
