"""The collectives on device tensors (CUDA, or the test stand-in): pydist.api.collectives hands
a call here when its tensor is on a device.

Same signatures and argument checks as the host's (pydist.api.collectives), plus the device's
(pydist.api.device_args: one device, one dtype, the group's device). Every call runs on the
group's device engine (pydist.engines.device) through the group's queue, in issue order with
the group's host calls. A blocking call returns once its work is enqueued on the caller's
current stream (None); ``async_op=True`` returns a DeviceWork (pydist.groups.device_work)
whose ``wait()`` makes the current stream wait.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.ops import ReduceOp, as_reduce_op, check_op_dtype
from ..core.opspec import OpSpec
from ..engines.base import OpContext
from ..engines.device import StreamPlan
from ..groups.device_work import DeviceWork
from ..groups.process_group import ProcessGroup
from .device_args import blocks, checked, count, spec, split


def _run(target: ProcessGroup, device: Any, plan: StreamPlan, call: OpSpec, body: Callable[[OpContext], str],
         async_op: bool, arrays: list[Any], outputs: list[Any]) -> DeviceWork | None:
    """Run ``body`` through the group's queue; for async_op, its DeviceWork (keeping ``arrays``)."""
    work = target.run(call, body, (), [], async_op, results=outputs)
    if work is None:
        return None
    plan.arrays = arrays
    return DeviceWork(work, device, plan, outputs)


def _op(op: Any, device: Any, tensor: Any, name: str) -> ReduceOp:
    reduce_op = as_reduce_op(op)
    kind = device.describe(tensor)[0]
    check_op_dtype(reduce_op, kind.compute, kind.name)
    return reduce_op


def broadcast(target: ProcessGroup, tensor: Any, root: int, async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "broadcast", [("tensor", tensor)])
    plan = engine.plan(async_op)
    call = spec("broadcast", "broadcast", device, tensor, dtype, root=root)
    return _run(target, device, plan, call, lambda ctx: engine.broadcast(ctx, plan, tensor, root), async_op,
                [tensor], [tensor])


def all_reduce(target: ProcessGroup, tensor: Any, op: Any, async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "all_reduce", [("tensor", tensor)])
    reduce_op = _op(op, device, tensor, "tensor")
    plan = engine.plan(async_op)
    call = spec("all_reduce", "all_reduce", device, tensor, dtype, op=reduce_op)
    return _run(target, device, plan, call, lambda ctx: engine.all_reduce(ctx, plan, tensor, reduce_op), async_op,
                [tensor], [tensor])


def reduce(target: ProcessGroup, tensor: Any, root: int, op: Any, async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "reduce", [("tensor", tensor)])
    reduce_op = _op(op, device, tensor, "tensor")
    plan = engine.plan(async_op)
    call = spec("reduce", "reduce", device, tensor, dtype, root=root, op=reduce_op)
    return _run(target, device, plan, call, lambda ctx: engine.reduce(ctx, plan, tensor, root, reduce_op), async_op,
                [tensor], [tensor])


def _listed(objs: Any, name: str, size: int) -> list[tuple[str, Any]]:
    if not isinstance(objs, (list, tuple)):
        raise TypeError(f"{name}: expected a list of tensors, got {type(objs).__name__}")
    if len(objs) != size:
        raise ValueError(f"{name}: expected {size} tensors (the group size), got {len(objs)}")
    return [(f"{name}[{i}]", obj) for i, obj in enumerate(objs)]


def all_gather(target: ProcessGroup, tensor_list: list, tensor: Any, async_op: bool) -> DeviceWork | None:
    outs = _listed(tensor_list, "tensor_list", target.size())
    engine, device, dtype = checked(target, "all_gather", [("tensor", tensor), *outs])
    me = target.rank()
    if count(device, tensor_list[me]) != count(device, tensor):
        raise ValueError(f"tensor_list[{me}]: expected {count(device, tensor)} elements, got "
                         f"{count(device, tensor_list[me])}")
    plan = engine.plan(async_op)
    longest = max(count(device, out) for out in tensor_list)
    call = spec("all_gather", "all_gather", device, tensor, dtype, elements=longest)
    outputs = list(tensor_list)
    return _run(target, device, plan, call, lambda ctx: engine.all_gather(ctx, plan, outputs, tensor), async_op,
                [tensor, *outputs], [outputs])


def all_gather_into_tensor(target: ProcessGroup, output: Any, input: Any, async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "all_gather_into_tensor", [("input_tensor", input),
                                                                       ("output_tensor", output)])
    parts = blocks(device, output, target.size(), count(device, input), "output_tensor")
    plan = engine.plan(async_op)
    call = spec("all_gather_into_tensor", "all_gather", device, input, dtype)
    return _run(target, device, plan, call, lambda ctx: engine.all_gather(ctx, plan, parts, input), async_op,
                [input, output], [output])


def _rooted(target: ProcessGroup, what: str, tensor: Any, parts: list | None, list_name: str,
            root: int) -> tuple[Any, Any, str, list[Any] | None]:
    """(engine, device, dtype, the root's parts or None) of a gather or scatter."""
    named = _listed(parts, list_name, target.size()) if target.rank() == root else []
    engine, device, dtype = checked(target, what, [("tensor", tensor), *named])
    for name, part in named:
        if count(device, part) != count(device, tensor):
            raise ValueError(f"{name}: expected {count(device, tensor)} elements, got {count(device, part)}")
    return engine, device, dtype, [part for _, part in named] if named else None


def gather(target: ProcessGroup, tensor: Any, gather_list: list | None, root: int,
           async_op: bool) -> DeviceWork | None:
    engine, device, dtype, parts = _rooted(target, "gather", tensor, gather_list, "gather_list", root)
    plan = engine.plan(async_op)
    call = spec("gather", "gather", device, tensor, dtype, root=root)
    return _run(target, device, plan, call, lambda ctx: engine.gather(ctx, plan, tensor, parts, root), async_op,
                [tensor, *(parts or [])], [parts] if parts is not None else [])


def gather_single(target: ProcessGroup, tensor: Any, gather_tensor: Any, root: int,
                  async_op: bool) -> DeviceWork | None:
    """torch 2.14's single-output gather (pydist.api.collectives.gather_single) on device tensors."""
    is_root = target.rank() == root
    if is_root and gather_tensor is None:
        raise ValueError("gather_tensor: required on the destination rank")
    named = [("tensor", tensor)] + ([("gather_tensor", gather_tensor)] if is_root else [])
    engine, device, dtype = checked(target, "gather_single", named)
    parts = blocks(device, gather_tensor, target.size(), count(device, tensor), "gather_tensor") if is_root else None
    plan = engine.plan(async_op)
    call = spec("gather_single", "gather", device, tensor, dtype, root=root)
    return _run(target, device, plan, call, lambda ctx: engine.gather(ctx, plan, tensor, parts, root), async_op,
                [tensor, *([gather_tensor] if is_root else [])], [gather_tensor] if is_root else [])


def scatter(target: ProcessGroup, tensor: Any, scatter_list: list | None, root: int,
            async_op: bool) -> DeviceWork | None:
    engine, device, dtype, parts = _rooted(target, "scatter", tensor, scatter_list, "scatter_list", root)
    plan = engine.plan(async_op)
    call = spec("scatter", "scatter", device, tensor, dtype, root=root)
    return _run(target, device, plan, call, lambda ctx: engine.scatter(ctx, plan, tensor, parts, root), async_op,
                [tensor, *(parts or [])], [tensor])


def reduce_scatter(target: ProcessGroup, output: Any, input_list: list, op: Any,
                   async_op: bool) -> DeviceWork | None:
    ins = _listed(input_list, "input_list", target.size())
    engine, device, dtype = checked(target, "reduce_scatter", [("output", output), *ins])
    for name, part in ins:
        if count(device, part) != count(device, output):
            raise ValueError(f"{name}: expected {count(device, output)} elements, got {count(device, part)}")
    reduce_op = _op(op, device, output, "output")
    plan = engine.plan(async_op)
    parts = list(input_list)
    call = spec("reduce_scatter", "reduce_scatter", device, output, dtype, op=reduce_op)
    return _run(target, device, plan, call, lambda ctx: engine.reduce_scatter(ctx, plan, output, parts, reduce_op),
                async_op, [output, *parts], [output])


def reduce_scatter_tensor(target: ProcessGroup, output: Any, input: Any, op: Any,
                          async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "reduce_scatter_tensor", [("output", output), ("input", input)])
    parts = blocks(device, input, target.size(), count(device, output), "input")
    reduce_op = _op(op, device, output, "output")
    plan = engine.plan(async_op)
    call = spec("reduce_scatter_tensor", "reduce_scatter", device, output, dtype, op=reduce_op)
    return _run(target, device, plan, call, lambda ctx: engine.reduce_scatter(ctx, plan, output, parts, reduce_op),
                async_op, [output, input], [output])


def all_to_all(target: ProcessGroup, output_list: list, input_list: list, async_op: bool) -> DeviceWork | None:
    outs = _listed(output_list, "output_tensor_list", target.size())
    ins = _listed(input_list, "input_tensor_list", target.size())
    engine, device, dtype = checked(target, "all_to_all", [*outs, *ins])
    me = target.rank()
    if count(device, output_list[me]) != count(device, input_list[me]):
        raise ValueError(f"output_tensor_list[{me}]: expected {count(device, input_list[me])} elements, got "
                         f"{count(device, output_list[me])}")
    plan = engine.plan(async_op)
    total = sum(count(device, part) for part in input_list)
    call = spec("all_to_all", "all_to_all", device, input_list[0], dtype, elements=total)
    outputs, inputs = list(output_list), list(input_list)
    return _run(target, device, plan, call, lambda ctx: engine.all_to_all(ctx, plan, outputs, inputs), async_op,
                [*outputs, *inputs], [outputs])


def all_to_all_single(target: ProcessGroup, output: Any, input: Any, output_split_sizes: list[int] | None,
                      input_split_sizes: list[int] | None, async_op: bool) -> DeviceWork | None:
    engine, device, dtype = checked(target, "all_to_all_single", [("output", output), ("input", input)])
    outs = split(device, output, output_split_sizes, target.size(), "output")
    ins = split(device, input, input_split_sizes, target.size(), "input")
    me = target.rank()
    if count(device, outs[me]) != count(device, ins[me]):
        raise ValueError(f"output and input split sizes disagree for this rank's own part: {count(device, outs[me])} "
                         f"vs {count(device, ins[me])} elements")
    plan = engine.plan(async_op)
    call = spec("all_to_all_single", "all_to_all", device, input, dtype)
    return _run(target, device, plan, call, lambda ctx: engine.all_to_all(ctx, plan, outs, ins), async_op,
                [output, input], [output])


__all__ = ["all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single",
           "broadcast", "gather", "gather_single", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter"]
