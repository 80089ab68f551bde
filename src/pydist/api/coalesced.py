"""torch.distributed's other spellings of the collectives: ``all_reduce_coalesced`` (several
tensors of one dtype reduced as one, in place), ``all_gather_coalesced`` (several tensors of
one dtype gathered as one; deprecated in torch, so it warns) and ``all_gather_single`` /
``reduce_scatter_single`` (torch 2.13's names for all_gather_into_tensor and
reduce_scatter_tensor), ``gather_into_tensor`` (torch 2.14's first name of gather_single,
deprecated there, so it warns)."""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..core.buffers import Buffer, DeviceTensorError, as_buffer
from ..core.ops import RedOpType
from ..core.opspec import describe, op_of
from ..groups.work import Work
from .collectives import (
    _buffer_list,
    _same_dtype,
    all_gather_into_tensor,
    gather_single,
    reduce_scatter_tensor,
)
from .groups import member_group


def all_reduce_coalesced(tensors: Any, op: Any = RedOpType.SUM, group: Any = None,
                         async_op: bool = False) -> Work | None:
    """Reduce every tensor of ``tensors`` (one dtype) over the group, in place, as one
    all_reduce of their concatenation; a single tensor is taken as a list of one. Deprecated in
    torch 2.13, so it warns FutureWarning as torch's does. Host tensors only: a device tensor
    gets a ValueError saying to call all_reduce once per tensor."""
    _deprecated("all_reduce_coalesced")
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
    if not tensors:
        raise ValueError("tensors: expected a non-empty list of tensors")
    target = member_group(group, "all_reduce_coalesced")
    if target is None:
        return None
    with _host_only("all_reduce_coalesced", "all_reduce"):
        buffers = [as_buffer(tensor, f"tensors[{i}]") for i, tensor in enumerate(tensors)]
    _same_dtype(buffers, buffers[0])
    count = sum(b.array.size for b in buffers)
    spec = describe("all_reduce_coalesced", "all_reduce", buffers[0], count=count, op=op)
    reduce_op = op_of(spec, op)

    def body(ctx) -> None:
        flat = _joined(buffers)
        target.engine.all_reduce(ctx, flat, reduce_op)
        _spread(flat, buffers)
    return target.run(spec, body, (), buffers, async_op)


def _joined(buffers: Sequence[Buffer]) -> np.ndarray:
    """The buffers' elements as one array: the only buffer's own, else a concatenated copy."""
    return buffers[0].array if len(buffers) == 1 else np.concatenate([b.array for b in buffers])


def _spread(flat: np.ndarray, buffers: Sequence[Buffer]) -> None:
    """Copy ``flat`` back into the buffers ``_joined`` made it of (one buffer: it is its own)."""
    if len(buffers) == 1:
        return
    offset = 0
    for buffer in buffers:
        buffer.array[:] = flat[offset:offset + buffer.array.size]
        offset += buffer.array.size


@contextmanager
def _host_only(call: str, instead: str) -> Iterator[None]:
    """Refuse a device tensor met inside (core.buffers' DeviceTensorError) with a ValueError
    naming ``call``, the argument and ``instead``, the collective to call once per tensor."""
    try:
        yield
    except DeviceTensorError as error:
        raise DeviceTensorError(
            f"{call}: {error.argument} is a tensor on {error.device}; this deprecated call works on host tensors "
            f"only: call {instead} once per tensor instead, which takes device tensors when pydist's CUDA engine "
            "is on (PYDIST_CUDA_ENGINE=1), or move the tensors to the host with .cpu()",
            error.argument, error.device) from None


def _deprecated(name: str) -> None:
    """Warn as torch 2.13 does for its deprecated coalesced collectives."""
    warnings.warn(f"`pydist.{name}` will be deprecated, as `torch.distributed.{name}` will: call the collective "
                  "once per tensor (or on one flat tensor) instead", FutureWarning, stacklevel=3)


def all_gather_coalesced(output_tensor_lists: Any, input_tensor_list: Any, group: Any = None,
                         async_op: bool = False) -> Work | None:
    """``output_tensor_lists[r][i]`` = rank r's ``input_tensor_list[i]``, on every rank: the
    tensors (one dtype, the same sizes on every rank) gathered as one all_gather of their
    concatenation. Deprecated in torch 2.13, so it warns FutureWarning as torch's does. A rank
    passing other sizes than the others gets DesyncError (torch gives wrong results). Host
    tensors only: a device tensor gets a ValueError saying to call all_gather_into_tensor once
    per tensor."""
    _deprecated("all_gather_coalesced")
    target = member_group(group, "all_gather_coalesced")
    if target is None:
        return None
    with _host_only("all_gather_coalesced", "all_gather_into_tensor"):
        inputs = _buffer_list(input_tensor_list, "input_tensor_list", None, writable=False)
        rows = _output_lists(output_tensor_lists, inputs, target.size())
    _same_dtype(inputs, inputs[0])
    for row in rows:
        _same_dtype(row, inputs[0])
    total = sum(b.array.size for b in inputs)
    spec = describe("all_gather_coalesced", "all_gather", inputs[0], count=total)

    def body(ctx) -> None:
        flat = _joined(inputs)
        blocks = ([row[0].array for row in rows] if len(inputs) == 1
                  else list(np.empty((len(rows), flat.size), flat.dtype)))
        target.engine.all_gather(ctx, blocks, flat)
        for block, row in zip(blocks, rows):
            _spread(block, row)
    return target.run(spec, body, (), [b for row in rows for b in row], async_op,
                      results=[list(row) for row in output_tensor_lists])


def _output_lists(objs: Any, inputs: list[Buffer], size: int) -> list[list[Buffer]]:
    """all_gather_coalesced's outputs: one list per rank of the group, each with a tensor of
    each input's size."""
    name = "output_tensor_lists"
    if not isinstance(objs, (list, tuple)):
        raise TypeError(f"{name}: expected a list of {size} lists of tensors (one per rank of the group), "
                        f"got {type(objs).__name__}")
    if len(objs) != size:
        raise ValueError(f"{name}: expected {size} lists of tensors (one per rank of the group), got {len(objs)}")
    rows = []
    for r, row in enumerate(objs):
        if not isinstance(row, (list, tuple)):
            raise TypeError(f"{name}[{r}]: expected a list of {len(inputs)} tensors (one per tensor of "
                            f"input_tensor_list), got {type(row).__name__}")
        if len(row) != len(inputs):
            raise ValueError(f"{name}[{r}]: expected {len(inputs)} tensors (one per tensor of input_tensor_list), "
                             f"got {len(row)}")
        buffers = [as_buffer(obj, f"{name}[{r}][{i}]") for i, obj in enumerate(row)]
        for buffer, inp in zip(buffers, inputs):
            if buffer.array.size != inp.array.size:
                raise ValueError(f"{buffer.name}: expected {inp.array.size} elements (as {inp.name}), "
                                 f"got {buffer.array.size}")
        rows.append(buffers)
    return rows


def all_gather_single(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False):
    """torch 2.13's name for all_gather_into_tensor."""
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any = RedOpType.SUM, group: Any = None,
                          async_op: bool = False):
    """torch 2.13's name for reduce_scatter_tensor."""
    return reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


def gather_into_tensor(tensor: Any, gather_tensor: Any = None, dst: int | None = None, group: Any = None,
                       async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """gather_single, under the name torch 2.14 deprecates: it warns FutureWarning as torch's does."""
    warnings.warn("`pydist.gather_into_tensor` is deprecated, as `torch.distributed.gather_into_tensor` is: "
                  "use `pydist.gather_single`", FutureWarning, stacklevel=2)
    return gather_single(tensor, gather_tensor, dst, group, async_op, group_dst)
