"""The collective operations, with torch.distributed's signatures and argument checks.

Every call validates before anything is sent (misuse raises ValueError/TypeError at the
call), converts tensors to flat numpy arrays, and runs on the group's engine in issue
order. ``async_op=True`` returns a Work; otherwise the call returns when done (None). A
rank outside ``group`` gets a warning and a no-op, as in torch. A call whose tensor is on a
device (CUDA, when asked for; the test stand-in) goes to pydist.api.device_collectives
instead (core.buffers raises DeviceTensorError for it).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..algorithms._partition import block_bounds, row_split
from ..core.buffers import Buffer, DeviceTensorError, as_buffer
from ..core.deadline import to_seconds
from ..core.ops import RedOpType
from ..core.opspec import describe, op_of
from ..groups.device_engines import bound, engine_of, opt_in
from ..groups.process_group import ProcessGroup
from ..groups.work import Work
from . import device_collectives as on_device
from .groups import member_group

_BARRIER = describe("barrier", "barrier")


def root_rank(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank of a root given as a global rank (``src``/``dst``) or a group rank."""
    if rank is not None and group_rank is not None:
        raise ValueError(f"{name} and group_{name}: give one of them, not both")
    if group_rank is not None:
        if not isinstance(group_rank, int) or isinstance(group_rank, bool):
            raise TypeError(f"group_{name}: expected an int (a rank in the group), got {type(group_rank).__name__}")
        if not 0 <= group_rank < group.size():
            raise ValueError(f"group_{name}: expected 0 <= group_{name} < {group.size()}, got {group_rank}")
        return group_rank
    if rank is None:
        raise ValueError(f"{name}: required (a global rank), or group_{name} (a rank in the group)")
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise TypeError(f"{name}: expected an int (a global rank), got {type(rank).__name__} {rank!r}")
    index = group.group_rank_of(rank)
    if index is None:
        raise ValueError(f"{name}: rank {rank} is not in the group (its ranks are {group.ranks})")
    return index


def _same_dtype(buffers: Sequence[Buffer], reference: Buffer) -> None:
    for buffer in buffers:
        if buffer.dtype_name != reference.dtype_name:
            raise TypeError(f"{buffer.name}: dtype {buffer.dtype_name} differs from {reference.name}'s "
                            f"{reference.dtype_name}; all tensors of one call must share a dtype")


def _buffer_list(objs: Any, name: str, count: int | None, writable: bool) -> list[Buffer]:
    """``objs`` as buffers: a list of ``count`` tensors (None: any number but none)."""
    if not isinstance(objs, (list, tuple)):
        raise TypeError(f"{name}: expected a list of tensors, got {type(objs).__name__}")
    if count is None and not objs:
        raise ValueError(f"{name}: expected a non-empty list of tensors")
    if count is not None and len(objs) != count:
        raise ValueError(f"{name}: expected {count} tensors (the group size), got {len(objs)}")
    return [as_buffer(obj, f"{name}[{i}]", writable) for i, obj in enumerate(objs)]


def _sizes_match(buffers: Sequence[Buffer], size: int, name: str) -> None:
    for index, buffer in enumerate(buffers):
        if buffer.array.size != size:
            raise ValueError(f"{name}[{index}]: expected {size} elements, got {buffer.array.size}")


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` of every rank."""
    target = member_group(group, "broadcast")
    if target is None:
        return None
    root = root_rank(target, src, group_src, "src")
    try:
        buf = as_buffer(tensor, "tensor")
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return on_device.broadcast(target, tensor, root, async_op)
    except ValueError:
        if target.rank() == root and as_buffer(tensor, "tensor", writable=False):  # read-only: word it for the root
            raise ValueError("tensor: broadcast takes a writable tensor on every rank (the others receive into "
                             "theirs); the source's is read-only") from None
        raise
    spec = describe("broadcast", "broadcast", buf, root=root)
    return target.run(spec, target.engine.broadcast, (buf.array, root), [buf], async_op)


def all_reduce(tensor: Any, op: Any = RedOpType.SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` over the group; every rank gets the result in place. A torch sparse COO
    tensor is summed as gloo does (``pydist.api.sparse``; SUM only)."""
    target = member_group(group, "all_reduce")
    if target is None:
        return None
    try:
        buf = as_buffer(tensor, "tensor")
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return on_device.all_reduce(target, tensor, op, async_op)
    except ValueError:  # not a dense buffer: a sparse tensor takes its own path (off the dense fast path)
        if getattr(tensor, "is_sparse", False) is True:
            from .sparse import all_reduce_sparse
            return all_reduce_sparse(tensor, op, target, async_op)
        raise
    spec = describe("all_reduce", "all_reduce", buf, op=op)
    return target.run(spec, target.engine.all_reduce, (buf.array, op_of(spec, op)), [buf], async_op)


def reduce(tensor: Any, dst: int | None = None, op: Any = RedOpType.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` over the group into ``tensor`` of rank ``dst`` (others unchanged)."""
    target = member_group(group, "reduce")
    if target is None:
        return None
    root = root_rank(target, dst, group_dst, "dst")
    try:
        buf = as_buffer(tensor, "tensor")
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return on_device.reduce(target, tensor, root, op, async_op)
    outputs = [buf] if target.rank() == root else []
    spec = describe("reduce", "reduce", buf, root=root, op=op)
    return target.run(spec, target.engine.reduce, (buf.array, root, op_of(spec, op)), outputs, async_op,
                      results=[tensor])


def all_gather(tensor_list: list, tensor: Any, group: Any = None, async_op: bool = False) -> Work | None:
    """``tensor_list[i]`` = rank i's ``tensor``, on every rank."""
    target = member_group(group, "all_gather")
    if target is None:
        return None
    try:
        inp = as_buffer(tensor, "tensor", writable=False)
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return on_device.all_gather(target, tensor_list, tensor, async_op)
    outs = _buffer_list(tensor_list, "tensor_list", target.size(), writable=True)
    _same_dtype(outs, inp)
    _sizes_match(outs[target.rank():target.rank() + 1], inp.array.size, "tensor_list")
    arrays = [b.array for b in outs]
    spec = describe("all_gather", "all_gather", inp, count=max(array.size for array in arrays))
    return target.run(spec, target.engine.all_gather, (arrays, inp.array), outs, async_op,
                      results=[list(tensor_list)])


def _blocks_of(buffer: Buffer, parts: int, name: str, per_part: int) -> list:
    if buffer.array.size != per_part * parts:
        raise ValueError(f"{name}: expected {parts} x {per_part} = {parts * per_part} elements "
                         f"(group size x the other tensor's size), got {buffer.array.size}")
    return [buffer.array[start:stop] for start, stop in block_bounds(buffer.array.size, parts)]


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """``output_tensor`` = every rank's ``input_tensor`` concatenated in rank order."""
    target = member_group(group, "all_gather_into_tensor")
    if target is None:
        return None
    try:
        inp = as_buffer(input_tensor, "input_tensor", writable=False)
    except DeviceTensorError:
        opt_in(target, input_tensor, "input_tensor")
        return on_device.all_gather_into_tensor(target, output_tensor, input_tensor, async_op)
    out = as_buffer(output_tensor, "output_tensor")
    _same_dtype([out], inp)
    blocks = _blocks_of(out, target.size(), "output_tensor", inp.array.size)
    spec = describe("all_gather_into_tensor", "all_gather", inp)
    return target.run(spec, target.engine.all_gather, (blocks, inp.array), [out], async_op)


def _on_root_only(objs: Any, is_root: bool, name: str, root_name: str) -> None:
    if is_root and objs is None:
        raise ValueError(f"{name}: required on the {root_name} rank")
    if not is_root and objs:
        raise ValueError(f"{name}: must NOT be specified on ranks other than the {root_name}")


def _gathering(tensor: Any, dst: int | None, group: Any, group_dst: int | None,
               op: str) -> tuple[ProcessGroup, int, Buffer, bool] | None:
    """A gather's group, root (a group rank), input and whether this rank is the root; None
    on a rank outside the group."""
    target = member_group(group, op)
    if target is None:
        return None
    root = root_rank(target, dst, group_dst, "dst")
    return target, root, as_buffer(tensor, "tensor", writable=False), target.rank() == root


def _device_root(tensor: Any, dst: int | None, group: Any, group_dst: int | None,
                 op: str) -> tuple[ProcessGroup, int]:
    """A gather's group and root (a group rank) when its tensor is on a device (opted in)."""
    target = member_group(group, op)
    assert target is not None  # _gathering raised for a member only
    opt_in(target, tensor, "tensor")
    return target, root_rank(target, dst, group_dst, "dst")


def gather(tensor: Any, gather_list: list | None = None, dst: int | None = None, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """``gather_list[i]`` on rank ``dst`` = rank i's ``tensor``."""
    try:
        call = _gathering(tensor, dst, group, group_dst, "gather")
    except DeviceTensorError:
        target, root = _device_root(tensor, dst, group, group_dst, "gather")
        return on_device.gather(target, tensor, gather_list, root, async_op)
    if call is None:
        return None
    target, root, inp, is_root = call
    _on_root_only(gather_list, is_root, "gather_list", "destination")
    outs = _buffer_list(gather_list, "gather_list", target.size(), writable=True) if is_root else []
    _same_dtype(outs, inp)
    _sizes_match(outs, inp.array.size, "gather_list")
    arrays = [b.array for b in outs] if is_root else None
    spec = describe("gather", "gather", inp, root=root)
    return target.run(spec, target.engine.gather, (inp.array, arrays, root), outs, async_op,
                      results=[list(gather_list or ())] if is_root else [])  # checked: a list on the root


def gather_single(tensor: Any, gather_tensor: Any = None, dst: int | None = None, group: Any = None,
                  async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """``gather_tensor`` on rank ``dst`` = every rank's ``tensor`` concatenated in rank order
    (torch 2.14's single-output gather: flat, or stacked ``[size, *tensor.shape]``; only its
    element count is checked). ``gather_tensor`` is required on the destination and ignored
    on the other ranks, as torch's."""
    try:
        call = _gathering(tensor, dst, group, group_dst, "gather_single")
    except DeviceTensorError:
        target, root = _device_root(tensor, dst, group, group_dst, "gather_single")
        return on_device.gather_single(target, tensor, gather_tensor, root, async_op)
    if call is None:
        return None
    target, root, inp, is_root = call
    if is_root and gather_tensor is None:
        raise ValueError("gather_tensor: required on the destination rank")
    out = as_buffer(gather_tensor, "gather_tensor") if is_root else None
    if out is not None:
        _same_dtype([out], inp)
    blocks = _blocks_of(out, target.size(), "gather_tensor", inp.array.size) if out is not None else None
    spec = describe("gather_single", "gather", inp, root=root)
    return target.run(spec, target.engine.gather, (inp.array, blocks, root), [out] if out is not None else [],
                      async_op)


def scatter(tensor: Any, scatter_list: list | None = None, src: int | None = None, group: Any = None,
            async_op: bool = False, group_src: int | None = None) -> Work | None:
    """``tensor`` on rank i = ``scatter_list[i]`` of rank ``src``."""
    target = member_group(group, "scatter")
    if target is None:
        return None
    root = root_rank(target, src, group_src, "src")
    try:
        out = as_buffer(tensor, "tensor")
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return on_device.scatter(target, tensor, scatter_list, root, async_op)
    is_root = target.rank() == root
    _on_root_only(scatter_list, is_root, "scatter_list", "source")
    ins = _buffer_list(scatter_list, "scatter_list", target.size(), writable=False) if is_root else []
    _same_dtype(ins, out)
    _sizes_match(ins, out.array.size, "scatter_list")
    arrays = [b.array for b in ins] if is_root else None
    spec = describe("scatter", "scatter", out, root=root)
    return target.run(spec, target.engine.scatter, (out.array, arrays, root), [out], async_op)


def reduce_scatter(output: Any, input_list: list, op: Any = RedOpType.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """``output`` on rank i = reduction over ranks of their ``input_list[i]``."""
    target = member_group(group, "reduce_scatter")
    if target is None:
        return None
    try:
        out = as_buffer(output, "output")
    except DeviceTensorError:
        opt_in(target, output, "output")
        return on_device.reduce_scatter(target, output, input_list, op, async_op)
    ins = _buffer_list(input_list, "input_list", target.size(), writable=False)
    _same_dtype(ins, out)
    _sizes_match(ins, out.array.size, "input_list")
    arrays = [b.array for b in ins]
    spec = describe("reduce_scatter", "reduce_scatter", out, op=op)
    return target.run(spec, target.engine.reduce_scatter, (out.array, arrays, op_of(spec, op)), [out], async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = RedOpType.SUM, group: Any = None,
                          async_op: bool = False) -> Work | None:
    """``output`` on rank i = reduction over ranks of block i of their ``input``."""
    target = member_group(group, "reduce_scatter_tensor")
    if target is None:
        return None
    try:
        out = as_buffer(output, "output")
    except DeviceTensorError:
        opt_in(target, output, "output")
        return on_device.reduce_scatter_tensor(target, output, input, op, async_op)
    inp = as_buffer(input, "input", writable=False)
    _same_dtype([inp], out)
    blocks = _blocks_of(inp, target.size(), "input", out.array.size)
    spec = describe("reduce_scatter_tensor", "reduce_scatter", out, op=op)
    return target.run(spec, target.engine.reduce_scatter, (out.array, blocks, op_of(spec, op)), [out], async_op)


def all_to_all(output_tensor_list: list, input_tensor_list: list, group: Any = None,
               async_op: bool = False) -> Work | None:
    """``output_tensor_list[j]`` on rank i = ``input_tensor_list[i]`` of rank j."""
    target = member_group(group, "all_to_all")
    if target is None:
        return None
    try:
        outs = _buffer_list(output_tensor_list, "output_tensor_list", target.size(), writable=True)
    except DeviceTensorError:
        opt_in(target, output_tensor_list[0], "output_tensor_list[0]")
        return on_device.all_to_all(target, output_tensor_list, input_tensor_list, async_op)
    ins = _buffer_list(input_tensor_list, "input_tensor_list", target.size(), writable=False)
    _same_dtype(outs + ins, outs[0])
    me = target.rank()
    _sizes_match(outs[me:me + 1], ins[me].array.size, "output_tensor_list")
    out_arrays, in_arrays = [b.array for b in outs], [b.array for b in ins]
    spec = describe("all_to_all", "all_to_all", ins[0], count=sum(array.size for array in in_arrays))
    return target.run(spec, target.engine.all_to_all, (out_arrays, in_arrays), outs, async_op,
                      results=[list(output_tensor_list)])


def _split(buffer: Buffer, sizes: list[int] | None, parts: int, name: str) -> list:
    """Views of ``buffer`` split along dim 0 by ``sizes`` (rows), or evenly."""
    return [buffer.array[a:b] for a, b in row_split(buffer.shape, buffer.array.size, sizes, parts, name)]


def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0, send part j to rank j, concatenate what arrives in ``output``."""
    target = member_group(group, "all_to_all_single")
    if target is None:
        return None
    try:
        out = as_buffer(output, "output")
    except DeviceTensorError:
        opt_in(target, output, "output")
        return on_device.all_to_all_single(target, output, input, output_split_sizes, input_split_sizes, async_op)
    inp = as_buffer(input, "input", writable=False)
    _same_dtype([inp], out)
    outs = _split(out, output_split_sizes, target.size(), "output")
    ins = _split(inp, input_split_sizes, target.size(), "input")
    me = target.rank()
    if outs[me].size != ins[me].size:
        raise ValueError(f"output and input split sizes disagree for this rank's own part: "
                         f"{outs[me].size} vs {ins[me].size} elements")
    spec = describe("all_to_all_single", "all_to_all", inp)
    return target.run(spec, target.engine.all_to_all, (outs, ins), [out], async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            timeout: timedelta | None = None) -> Work | None:
    """Return once every rank of the group has entered barrier."""
    target = member_group(group, "barrier")
    if target is None:
        return None
    seconds = None if timeout is None else to_seconds(timeout)
    if bound(target):  # the group runs device tensors: NCCL's barrier (their work so far done first)
        engine_of(target).drain(target.timeout if seconds is None else seconds)
    return target.run(_BARRIER, target.engine.barrier, (), [], async_op, timeout=seconds)
