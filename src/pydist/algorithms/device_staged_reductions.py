"""all_reduce, reduce and reduce_scatter of device tensors, each rank staging its own.

Behaviour
    Every rank of the group stages its tensor chunk by chunk through pinned host memory
    (pydist.algorithms.device_staging) and runs the group's CPU collective on each chunk:
    down chunk k+1, the collective on chunk k, up chunk k-1. The CPU collective does the
    reduction, for every ReduceOp and dtype it supports (bfloat16 in float32, rounded back
    once). This is the cross-host path of a group with one rank per host, and the fallback
    where ranks of a host cannot share device memory; with several ranks per host
    pydist.algorithms.device_rails composes it with the host's device collectives.

    - ``all_reduce(staging, host, tensor, op)``: in place.
    - ``reduce(staging, host, tensor, root, op)``: the result in ``root``'s tensor; the other
      ranks' tensors are left as they were (their chunks are not copied back).
    - ``reduce_scatter(staging, host, output, inputs, op)``: ``inputs`` one device array per
      rank (equal sizes), ``output`` of that size receives the reduction of block ``rank``.

Cost
    The tensor's bytes cross PCIe twice (down and up) and the network as the CPU collective
    moves them; the three overlap (staging module). reduce_scatter stages W input blocks
    per chunk: each block gets 1/(W+1) of a chunk.

Failure modes
    As pydist.algorithms.device_staging: a host step's error (PeerFailedError naming a dead
    peer, OpTimeoutError) propagates after the copies started have finished. Mismatched
    block sizes or a wrong number of blocks: ValueError before anything is enqueued.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.ops import ReduceOp
from .device_staging import HostCollectives, Part, Staging, flat, numel, widened


def all_reduce(staging: Staging, host: HostCollectives, tensor: Any, op: ReduceOp) -> None:
    """Reduce ``tensor`` over the group, in place on every rank."""
    kind = staging.device.describe(tensor)[0]
    data = flat(staging.device, tensor, "tensor")
    staging.run([Part(numel(staging.device, data), data, data)], kind,
                widened(kind, lambda _, segments: host.all_reduce(segments[0], op)))


def reduce(staging: Staging, host: HostCollectives, tensor: Any, root: int, op: ReduceOp) -> None:
    """Reduce ``tensor`` over the group into ``root``'s."""
    kind = staging.device.describe(tensor)[0]
    data = flat(staging.device, tensor, "tensor")
    back = data if host.rank == root else None
    staging.run([Part(numel(staging.device, data), data, back)], kind,
                widened(kind, lambda _, segments: host.reduce(segments[0], root, op)))


def reduce_scatter(staging: Staging, host: HostCollectives, output: Any, inputs: Sequence[Any],
                   op: ReduceOp) -> None:
    """``output`` = the reduction over the group of every rank's ``inputs[rank]``."""
    device = staging.device
    kind = device.describe(output)[0]
    out = flat(device, output, "output")
    count = numel(device, out)
    blocks = blocks_of(staging, inputs, host.size, count, "inputs")
    parts = [Part(count, block) for block in blocks] + [Part(count, None, out)]
    size = host.size
    staging.run(parts, kind, widened(kind, lambda _, s: host.reduce_scatter(s[size], s[:size], op)))


def blocks_of(staging: Staging, arrays: Sequence[Any] | None, size: int, count: int, name: str) -> list[Any]:
    """``arrays`` as ``size`` flat device arrays of ``count`` elements each (ValueError otherwise)."""
    if arrays is None or len(arrays) != size:
        raise ValueError(f"{name}: expected {size} device tensors, got {None if arrays is None else len(arrays)}")
    blocks = [flat(staging.device, array, f"{name}[{j}]") for j, array in enumerate(arrays)]
    for j, block in enumerate(blocks):
        if numel(staging.device, block) != count:
            raise ValueError(f"{name}[{j}]: expected {count} elements, got {numel(staging.device, block)}")
    return blocks
