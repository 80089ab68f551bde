"""all_reduce of sparse COO tensors (SUM), as gloo does it: gather every rank's indices and
values, then sum and coalesce on every rank.

Two operations on the group, issued back to back so that a later call queues behind both:

1. all_gather of a fixed-size int64 description of each rank's coalesced tensor (dtype,
   sparse and dense dims, shape, nnz): ``DESCRIPTION_LENGTH`` x 8 bytes per rank;
2. all_gather of each rank's indices (int64) and values as one byte string (uneven parts:
   ``nnz x (8 x sparse_dim + dense elements x itemsize)`` bytes per rank).

Every rank then adds the ranks' tensors in rank order, coalesces the sum and copies it into
the input tensor in place, as gloo's ``AsyncSparseAllreduceWork``: the result is coalesced,
the same tensor object, bit for bit gloo's (the same torch operations on the same data).
Cost: 2 all_gathers; every rank receives every other rank's nonzeros (no routing through
a root). The Work completes once the tensor holds the sum.

Errors: an op other than SUM, or a tensor not on the CPU, raises ValueError at the call
(gloo: RuntimeError "allreduce of sparse tensors only works with ReduceOp.SUM"). Ranks that
disagree on shape, sparse/dense dims or dtype all fail with the same ValueError once the
descriptions are exchanged, before any payload moves; the group stays usable.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.ops import RedOpType, as_reduce_op
from ..core.opspec import describe
from ..groups.process_group import ProcessGroup
from ..groups.work import Work

MAX_DIMS = 64
_DTYPE, _SPARSE_DIM, _DENSE_DIM, _NDIM, _NNZ, _SHAPE = range(6)
DESCRIPTION_LENGTH = _SHAPE + MAX_DIMS
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool, torch.uint16, torch.uint32,
          torch.uint64)
_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}


def empty_sparse(shape: torch.Size, dtype: torch.dtype, sparse_dim: int) -> torch.Tensor:
    """A sparse COO tensor of ``shape`` and ``dtype`` with ``sparse_dim`` sparse dimensions and no nonzeros."""
    indices = torch.empty((sparse_dim, 0), dtype=torch.int64)
    values = torch.empty((0, *shape[sparse_dim:]), dtype=dtype)
    return torch.sparse_coo_tensor(indices, values, shape)


def _check(tensor: torch.Tensor, op: Any) -> None:
    if as_reduce_op(op).op != RedOpType.SUM:
        raise ValueError(f"op: all_reduce of sparse tensors only works with ReduceOp.SUM (as gloo's), got {op!r}")
    if tensor.device.type != "cpu":
        raise ValueError(f"tensor: pydist works on CPU tensors; got a sparse tensor on {tensor.device}")
    if tensor.dtype not in _CODES:
        raise TypeError(f"tensor: unsupported sparse tensor dtype {tensor.dtype}")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"tensor: a sparse all_reduce takes at most {MAX_DIMS} dimensions, got {tensor.dim()}")


def _describe(local: torch.Tensor) -> np.ndarray:
    description = np.zeros(DESCRIPTION_LENGTH, np.int64)
    description[_DTYPE] = _CODES[local.dtype]
    description[_SPARSE_DIM], description[_DENSE_DIM] = local.sparse_dim(), local.dense_dim()
    description[_NDIM], description[_NNZ] = local.dim(), local._nnz()
    description[_SHAPE:_SHAPE + local.dim()] = local.shape
    return description


def _shape_text(row: np.ndarray) -> str:
    shape = tuple(int(n) for n in row[_SHAPE:_SHAPE + row[_NDIM]])
    return (f"shape {shape} sparse_dim {row[_SPARSE_DIM]} dense_dim {row[_DENSE_DIM]} "
            f"dtype {DTYPES[row[_DTYPE]] if 0 <= row[_DTYPE] < len(DTYPES) else row[_DTYPE]}")


def _check_agreement(descriptions: np.ndarray) -> None:
    """ValueError (the same on every rank) unless every rank describes the same kind of tensor."""
    kinds = np.delete(descriptions, _NNZ, axis=1)
    differing = [rank for rank in range(len(kinds)) if not np.array_equal(kinds[rank], kinds[0])]
    if differing:
        raise ValueError(f"tensor: sparse all_reduce needs the same shape, dims and dtype on every rank; rank 0 has "
                         f"{_shape_text(descriptions[0])}, rank {differing[0]} has "
                         f"{_shape_text(descriptions[differing[0]])}")


def _payload(local: torch.Tensor) -> np.ndarray:
    """The coalesced tensor's indices then values, as bytes."""
    indices = local._indices().contiguous().reshape(-1).view(torch.uint8)
    values = local._values().contiguous().reshape(-1).view(torch.uint8)
    return torch.cat([indices, values]).numpy()


def _index_bytes(row: np.ndarray) -> int:
    return 8 * int(row[_SPARSE_DIM]) * int(row[_NNZ])


def _as_dtype(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Bytes as a 1-D tensor of ``dtype`` sharing their memory (torch cannot view an empty one)."""
    return torch.from_numpy(raw).view(dtype) if raw.size else torch.empty(0, dtype=dtype)


def _rank_tensor(part: np.ndarray, row: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """One rank's sparse tensor rebuilt from its payload bytes (``like``: this rank's, for dims and dtype)."""
    sparse_dim, nnz, index_bytes = like.sparse_dim(), int(row[_NNZ]), _index_bytes(row)
    indices = _as_dtype(part[:index_bytes], torch.int64).reshape(sparse_dim, nnz)
    values = _as_dtype(part[index_bytes:], like.dtype).reshape(nnz, *like.shape[sparse_dim:])
    return torch.sparse_coo_tensor(indices, values, like.shape, dtype=like.dtype)


def all_reduce_sparse(tensor: torch.Tensor, op: Any, group: ProcessGroup, async_op: bool) -> Work | None:
    """Sum the sparse COO ``tensor`` over ``group`` into ``tensor`` (coalesced), as gloo does."""
    _check(tensor, op)
    with torch.no_grad():
        local = tensor.detach().coalesce()
    size = group.size()
    descriptions = np.zeros((size, DESCRIPTION_LENGTH), np.int64)
    mine = _describe(local)
    rows = list(descriptions)
    described = group.run(describe("all_reduce_sparse", "all_gather", mine), group.engine.all_gather, (rows, mine),
                          [], async_op)
    payload = _payload(local)

    def exchange(ctx: Any) -> None:
        if described is not None:
            described.wait()  # done already (it ran first); re-raises its failure
        _check_agreement(descriptions)
        value_bytes = local.element_size() * int(np.prod(local.shape[local.sparse_dim():], dtype=np.int64))
        parts = [np.empty(_index_bytes(row) + value_bytes * int(row[_NNZ]), np.uint8) for row in descriptions]
        exact = describe("all_reduce_sparse", "all_gather", payload, count=max(part.size for part in parts))
        group.engine.all_gather(ctx._replace(spec=exact), parts, payload)
        with torch.no_grad():
            total = _rank_tensor(parts[0], descriptions[0], local)
            for part, row in zip(parts[1:], descriptions[1:]):
                total = total + _rank_tensor(part, row, local)
            tensor.copy_(total.coalesce())

    # recorded with this rank's payload; the engine gets the exact call (the largest part) above
    spec = describe("all_reduce_sparse", "all_gather", payload)
    return group.run(spec, exchange, (), [], async_op, results=[tensor])
