"""torch.distributed's other spellings of the collectives: ``all_reduce_coalesced`` (several
tensors of one dtype reduced as one, in place) and ``all_gather_single`` /
``reduce_scatter_single`` (torch 2.13's names for all_gather_into_tensor and
reduce_scatter_tensor)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._buffers import as_buffer
from ._collectives import _reduce_op, _same_dtype, all_gather_into_tensor, reduce_scatter_tensor
from ._init import member_group
from ._ops import RedOpType
from ._opspec import describe
from ._work import Work


def all_reduce_coalesced(tensors: Any, op: Any = RedOpType.SUM, group: Any = None,
                         async_op: bool = False) -> Work | None:
    """Reduce every tensor of ``tensors`` (one dtype) over the group, in place, as one
    all_reduce of their concatenation; a single tensor is taken as a list of one."""
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    if not tensors:
        raise ValueError("tensors: expected a non-empty list of tensors")
    target = member_group(group, "all_reduce_coalesced")
    if target is None:
        return None
    buffers = [as_buffer(tensor, f"tensors[{i}]") for i, tensor in enumerate(tensors)]
    _same_dtype(buffers, buffers[0])
    reduce_op = _reduce_op(op, buffers[0])
    count = sum(b.array.size for b in buffers)
    spec = describe("all_reduce_coalesced", "all_reduce", buffers[0], count=count, reduce_op=reduce_op.op)

    def body(ctx) -> None:
        flat = np.concatenate([b.array for b in buffers]) if len(buffers) > 1 else buffers[0].array
        target.backend.all_reduce(ctx, flat, reduce_op)
        if len(buffers) > 1:
            offset = 0
            for buffer in buffers:
                buffer.array[:] = flat[offset:offset + buffer.array.size]
                offset += buffer.array.size
    return target.run(spec, body, buffers, async_op)


def all_gather_single(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False):
    """torch 2.13's name for all_gather_into_tensor."""
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any = RedOpType.SUM, group: Any = None,
                          async_op: bool = False):
    """torch 2.13's name for reduce_scatter_tensor."""
    return reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
