"""Module-state synchronisation for DDP: the same model everywhere, broadcasts, graph walks.

- ``verify_same_model``: all_gather_object of every rank's (name, shape, dtype) list; a
  difference raises ValueError naming the tensor and which ranks have what, before any
  tensor is broadcast (a broadcast of mismatched sizes would fail far less clearly).
- ``broadcast_coalesced``: tensors flattened per dtype into buffers of up to 256 MiB, one
  broadcast each, copied back on the receivers (torch's ``_broadcast_coalesced``).
- ``find_common_rank``: the largest group rank for which a condition holds (MAX all_reduce).
- ``find_tensors`` / ``reachable_parameters``: the tensors in a forward's output, and the
  parameters the autograd graph reaches from them (for find_unused_parameters).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

import pydist as dist

BROADCAST_BUCKET_BYTES = 256 * 1024 * 1024


def _describe(entry: tuple[tuple[int, ...], str] | None) -> str:
    if entry is None:
        return "missing"
    shape, dtype = entry
    return f"shape {tuple(shape)} dtype {dtype}"


def verify_same_model(named: list[tuple[str, torch.Tensor]], group: Any) -> None:
    """Raise ValueError unless every rank has the same names, shapes and dtypes, in order."""
    mine = [(name, tuple(t.shape), str(t.dtype)) for name, t in named]
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    if all(other == everyone[0] for other in everyone):
        return
    tables = [{name: (shape, dtype) for name, shape, dtype in entries} for entries in everyone]
    names = list(dict.fromkeys(name for entries in everyone for name, _, _ in entries))
    problems = []
    for name in names:
        by_value: dict[str, list[int]] = {}
        for rank, table in enumerate(tables):
            by_value.setdefault(_describe(table.get(name)), []).append(rank)
        if len(by_value) > 1:
            problems.append(f"'{name}': " + "; ".join(f"{value} on ranks {ranks}" for value, ranks in by_value.items()))
    if not problems:  # same tensors, different registration order
        orders: dict[tuple[str, ...], list[int]] = {tuple(name for name, _, _ in entries): [] for entries in everyone}
        for rank, entries in enumerate(everyone):
            orders[tuple(name for name, _, _ in entries)].append(rank)
        problems = [f"registration order {list(order)[:6]}... on ranks {ranks}" for order, ranks in orders.items()]
    shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
    raise ValueError("DistributedDataParallel: the module's parameters and buffers differ across ranks (every "
                     f"rank must wrap the same model):\n  {shown}")


def broadcast_coalesced(tensors: list[torch.Tensor], group: Any, group_src: int = 0,
                        bucket_bytes: int = BROADCAST_BUCKET_BYTES) -> None:
    """Copy rank ``group_src``'s ``tensors`` into every rank's, one broadcast per flat chunk."""
    if dist.get_world_size(group) == 1 or not tensors:
        return
    receiving = dist.get_rank(group) != group_src
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    with torch.no_grad():
        for same_dtype in by_dtype.values():
            for chunk in _chunks(same_dtype, bucket_bytes):
                flat = torch.cat([t.detach().reshape(-1) for t in chunk])
                dist.broadcast(flat, group=group, group_src=group_src)
                if receiving:
                    offset = 0
                    for tensor in chunk:
                        tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
                        offset += tensor.numel()


def _chunks(tensors: list[torch.Tensor], limit: int) -> Iterable[list[torch.Tensor]]:
    chunk: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        chunk.append(tensor)
        size += tensor.numel() * tensor.element_size()
        if size >= limit:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def find_common_rank(group: Any, candidate: bool) -> int:
    """The largest group rank among those passing ``candidate=True`` (one MAX all_reduce)."""
    value = torch.tensor([dist.get_rank(group) if candidate else -1], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    if value.item() < 0:
        raise RuntimeError("DistributedDataParallel: no rank qualified as the authoritative copy (a bug in pydist)")
    return int(value.item())


def find_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside ``obj`` (nested lists, tuples, dicts and dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in find_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in find_tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for field in dataclasses.fields(obj) for t in find_tensors(getattr(obj, field.name))]
    return []


def reachable_parameters(outputs: list[torch.Tensor]) -> set[int]:
    """ids of the leaf tensors whose AccumulateGrad nodes the graph reaches from ``outputs``."""
    seen: set[Any] = set()
    found: set[int] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    for tensor in outputs:  # a parameter returned as is has no grad_fn
        if tensor.grad_fn is None and tensor.requires_grad:
            found.add(id(tensor))
    return found
