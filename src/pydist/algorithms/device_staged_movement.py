"""broadcast, all_gather, gather, scatter, all_to_all, send and recv of device tensors, staged.

Behaviour
    Every rank stages its own device tensors chunk by chunk through pinned host memory
    (pydist.algorithms.device_staging) and runs the group's CPU collective (or send/recv) on
    each chunk: down chunk k+1, the host step on chunk k, up chunk k-1. Only what a rank
    sends comes down and only what it receives goes up; a rank's own block (all_gather,
    all_to_all) is copied on the device, on the caller's stream.

    - ``broadcast(staging, host, tensor, root)``: root's tensor into every rank's.
    - ``all_gather(staging, host, outputs, input)``: ``outputs[j]`` = rank j's ``input``.
    - ``gather(staging, host, input, outputs, root)``: the same on ``root`` only (``outputs``
      None elsewhere).
    - ``scatter(staging, host, output, inputs, root)``: ``output`` = root's ``inputs[rank]``.
    - ``all_to_all(staging, host, outputs, inputs)``: ``outputs[j]`` = rank j's
      ``inputs[rank]``; blocks may differ in size (all_to_all_single's splits): one host
      all_reduce of the largest block first, so every rank runs as many chunks.
    - ``send(staging, host, tensor, peer)`` / ``recv(staging, host, tensor, peer)``.

Cost
    W parts per chunk (all_gather, gather, scatter; 2W for all_to_all) share one chunk
    buffer: each gets 1/W of it (PYDIST_CUDA_CHUNK_BYTES / W, at least one element).

Failure modes
    As pydist.algorithms.device_staging. A wrong number of blocks or blocks of unequal sizes
    (all_gather, gather, scatter): ValueError before anything is enqueued.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.ops import RedOpType, ReduceOp
from .device_staged_reductions import blocks_of
from .device_staging import HostCollectives, Part, PeerSteps, Staging, flat, numel


def broadcast(staging: Staging, host: HostCollectives, tensor: Any, root: int) -> None:
    """Copy ``root``'s ``tensor`` into every rank's."""
    kind = staging.device.describe(tensor)[0]
    data = flat(staging.device, tensor, "tensor")
    is_root = host.rank == root
    part = Part(numel(staging.device, data), data if is_root else None, None if is_root else data)
    staging.run([part], kind, lambda _, segments: host.broadcast(segments[0], root))


def all_gather(staging: Staging, host: HostCollectives, outputs: Sequence[Any], input: Any) -> None:
    """``outputs[j]`` = rank j's ``input``, on every rank."""
    device = staging.device
    kind = device.describe(input)[0]
    data = flat(device, input, "input")
    count = numel(device, data)
    blocks = blocks_of(staging, outputs, host.size, count, "outputs")
    device.copy(blocks[host.rank], data, staging.caller)
    parts = [Part(count, data) if j == host.rank else Part(count, None, block) for j, block in enumerate(blocks)]
    staging.run(parts, kind, lambda _, segments: host.all_gather(segments, segments[host.rank]))


def gather(staging: Staging, host: HostCollectives, input: Any, outputs: Sequence[Any] | None, root: int) -> None:
    """``outputs[j]`` = rank j's ``input`` on ``root``."""
    _rooted(staging, host, input, outputs, root, True, lambda mine, every: host.gather(mine, every, root))


def scatter(staging: Staging, host: HostCollectives, output: Any, inputs: Sequence[Any] | None, root: int) -> None:
    """``output`` = ``root``'s ``inputs[rank]``."""
    _rooted(staging, host, output, inputs, root, False, lambda mine, every: host.scatter(mine, every, root))


def _rooted(staging: Staging, host: HostCollectives, mine: Any, blocks: Sequence[Any] | None, root: int,
            gathering: bool, step: Callable[[np.ndarray, list[np.ndarray] | None], None]) -> None:
    """gather (``mine`` goes to the root's ``blocks``) or scatter (the reverse), staged."""
    device, rank = staging.device, host.rank
    mine_name, blocks_name = ("input", "outputs") if gathering else ("output", "inputs")
    kind = device.describe(mine)[0]
    data = flat(device, mine, mine_name)
    count = numel(device, data)
    is_root = rank == root
    theirs = blocks_of(staging, blocks, host.size, count, blocks_name) if is_root else [None] * host.size
    if is_root:
        target, source = (theirs[root], data) if gathering else (data, theirs[root])
        device.copy(target, source, staging.caller)

    def part(j: int, block: Any) -> Part:
        if j == rank:  # the root's own block was copied on the device
            return Part(count) if is_root else Part(count, data) if gathering else Part(count, None, data)
        return Part(count, None, block) if gathering else Part(count, block)
    parts = [part(j, block) for j, block in enumerate(theirs)]
    staging.run(parts, kind, lambda _, s: step(s[rank], s if is_root else None))


def all_to_all(staging: Staging, host: HostCollectives, outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
    """``outputs[j]`` = rank j's ``inputs[rank]`` (blocks of any sizes that pair up)."""
    device = staging.device
    size, rank = host.size, host.rank
    for name, arrays in (("outputs", outputs), ("inputs", inputs)):
        if len(arrays) != size:
            raise ValueError(f"{name}: expected {size} device tensors, got {len(arrays)}")
    ins = [flat(device, array, f"inputs[{j}]") for j, array in enumerate(inputs)]
    outs = [flat(device, array, f"outputs[{j}]") for j, array in enumerate(outputs)]
    kind = device.describe(ins[rank])[0]
    if numel(device, outs[rank]) != numel(device, ins[rank]):
        raise ValueError(f"outputs[{rank}] and inputs[{rank}] (this rank's own block) differ in size")
    device.copy(outs[rank], ins[rank], staging.caller)
    parts = [Part(numel(device, block), None if j == rank else block) for j, block in enumerate(ins)]
    parts += [Part(numel(device, block), None, None if j == rank else block) for j, block in enumerate(outs)]
    largest = np.array([staging.chunks_for(parts, kind)], np.int64)
    host.all_reduce(largest, ReduceOp(RedOpType.MAX))  # every rank runs as many chunks (host steps)
    staging.run(parts, kind, lambda _, s: host.all_to_all(s[size:], s[:size]), chunks=int(largest[0]))


def send(staging: Staging, host: PeerSteps, tensor: Any, peer: int) -> None:
    """Send ``tensor`` to ``peer`` (which receives it with ``recv``)."""
    kind = staging.device.describe(tensor)[0]
    data = flat(staging.device, tensor, "tensor")
    staging.run([Part(numel(staging.device, data), data)], kind, lambda _, s: host.send(s[0], peer))


def recv(staging: Staging, host: PeerSteps, tensor: Any, peer: int) -> None:
    """Receive ``peer``'s ``send`` into ``tensor`` (of the same size)."""
    kind = staging.device.describe(tensor)[0]
    data = flat(staging.device, tensor, "tensor")
    staging.run([Part(numel(staging.device, data), None, data)], kind, lambda _, s: host.recv(s[0], peer))
