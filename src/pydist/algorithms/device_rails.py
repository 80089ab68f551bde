"""Device collectives across hosts, composed with the one-host device path: each byte crosses
the network once (pydist's rails algorithms, for device tensors).

Behaviour
    A group with L ranks on each of H hosts (place p of host h: group rank ``hosts[h][p]``).
    ``local`` is this host's ranks' device collectives (:class:`OneHost`: CUDA IPC on one
    host, pydist's one-host device engine), ``rail`` the CPU collectives of the ranks at this
    rank's place on every host (pydist.algorithms.device_staging.HostCollectives; rail rank
    = host index). Shards move through pinned memory with the staged pipeline (down chunk
    k+1, network chunk k, up chunk k-1):

    - ``all_reduce``: on each host a device reduce-scatter (rank p holds its host's sum of
      block p), each rank all-reduces its block along its rail, a device all-gather.
    - ``reduce``: the same, with a rail reduce to the root's host and the all-gather there
      only; the other ranks' tensors are left as they were.
    - ``broadcast``: the root's host broadcasts on the device; rank p carries block p along
      its rail; the other hosts all-gather the blocks on the device.
    - ``all_gather``: each rank all-gathers its input along its rail, the host all-gathers
      those on the device, and device copies put the blocks in group-rank order.
    - ``reduce_scatter``: the input blocks put in (place, host) order on the device, a device
      reduce-scatter, a staged reduce-scatter along the rail.
    AVG adds and divides by the group's size once at the end; PREMUL_SUM adds and scales the
    host's partial sums (factor x sum, as the sum of factor x each); every other op as is.
    ``all_reduce_leaders`` is for hosts with unequal rank counts: a device reduce to each
    host's first rank, a staged all_reduce among those, a device broadcast back.
    ``choose(hosts, shares)`` says which path a group takes: "rails", "leaders", or "staged"
    (every rank stages its own, pydist.algorithms.device_staged_*: one rank per host, or
    ranks that cannot share device memory).

    The OneHost calls are those of torch's reduce_scatter_tensor, all_gather_into_tensor,
    broadcast and reduce among the host's ranks (equal blocks; op never AVG or PREMUL_SUM
    here), enqueued on ``stream`` (the caller's): work after them on that stream sees their
    result. The engine's one-host device collectives provide them; a tensor whose size the
    host's rank count does not divide goes through a padded device copy. The call's device
    temporaries (shards, padded copies: ``scratch``) are kept from reuse until the caller's
    stream is past them, which may be the group's stream (async_op) rather than the current one.

Cost
    Network: what an all_reduce (broadcast, ...) among H hosts moves, split over L rails
    (each rank carries 1/L, once). PCIe: each rank's shard down and up once. Device: a
    reduce-scatter and an all-gather of the tensor inside the host (~TB/s), plus a padded
    copy when L does not divide the size, and W block copies for all_gather/reduce_scatter.

Failure modes
    Those of the staged pipeline (a dead peer along the rail: PeerFailedError naming it,
    raised on that rail's ranks; the others see it through the one-host collectives) and of
    the one-host collectives. A layout that is not rails-shaped: ValueError.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..core.ops import RedOpType, ReduceOp
from ..device.events import Stream
from . import device_staged_reductions as staged
from .device_staged_movement import all_gather as staged_all_gather
from .device_staged_movement import broadcast as staged_broadcast
from .device_staging import HostCollectives, Staging, flat, numel


class OneHost(Protocol):
    """This host's ranks' device collectives (module docstring): ``rank`` is this rank's place
    among them, ``size`` their number."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, stream: Stream) -> None: ...
    def all_gather(self, output: Any, input: Any, stream: Stream) -> None: ...
    def broadcast(self, tensor: Any, root: int, stream: Stream) -> None: ...
    def reduce(self, tensor: Any, root: int, op: ReduceOp, stream: Stream) -> None: ...


def choose(hosts: Sequence[Sequence[int]], shares: bool) -> str:
    """The cross-host path for a group laid out as ``hosts`` (each host's group ranks):
    "rails" (equal hosts of several ranks that share device memory), "leaders" (unequal
    hosts that share), or "staged" (every rank its own)."""
    if not shares or all(len(ranks) == 1 for ranks in hosts):
        return "staged"
    return "rails" if len({len(ranks) for ranks in hosts}) == 1 else "leaders"


def scratch(staging: Staging, count: int, name: str) -> Any:
    """A new device array of ``count`` elements of ``name`` for the call's own use, kept from
    reuse until the caller's stream is past it (an async call's stream is the group's, not
    the one the array was made on: torch's record_stream)."""
    array = staging.device.empty((count,), name)
    staging.device.keep_alive(array, staging.caller)
    return array


def _summed(op: ReduceOp) -> ReduceOp:
    """The op the stages run: AVG and PREMUL_SUM add (scaled once, by the caller)."""
    return ReduceOp(RedOpType.SUM) if op.op in (RedOpType.AVG, RedOpType.PREMUL_SUM) else op


class _Padded:
    """A flat device tensor of ``blocks`` equal blocks covering ``data``'s elements: ``data``
    itself when the count divides, else a device copy with a tail (``copy_in`` fills it)."""

    def __init__(self, staging: Staging, data: Any, blocks: int, copy_in: bool):
        self.staging, self.data = staging, data
        self.count = numel(staging.device, data)
        self.block = -(-self.count // blocks)
        kind = staging.device.describe(data)[0]
        if self.block * blocks == self.count:
            self.array = data
        else:
            self.array = scratch(staging, self.block * blocks, kind.name)
            if copy_in:
                staging.device.copy(self.array[:self.count], data, staging.caller)

    def part(self, index: int) -> Any:
        return self.array[index * self.block:(index + 1) * self.block]

    def copy_out(self) -> None:
        if self.array is not self.data:
            self.staging.device.copy(self.data, self.array[:self.count], self.staging.caller)


def all_reduce(staging: Staging, local: OneHost, rail: HostCollectives, tensor: Any, op: ReduceOp,
               group_size: int) -> None:
    """Reduce ``tensor`` over the group (``group_size`` ranks), in place on every rank."""
    device, caller = staging.device, staging.caller
    data = flat(device, tensor, "tensor")
    padded = _Padded(staging, data, local.size, copy_in=True)
    shard = scratch(staging, padded.block, device.describe(data)[0].name)
    local.reduce_scatter(shard, padded.array, _summed(op), caller)
    device.prescale(shard, op, caller)
    staged.all_reduce(staging, rail, shard, _summed(op))
    local.all_gather(padded.array, shard, caller)
    padded.copy_out()
    device.postscale(data, op, group_size, caller)


def reduce(staging: Staging, local: OneHost, rail: HostCollectives, tensor: Any, root_host: int, root_place: int,
           op: ReduceOp, group_size: int) -> None:
    """Reduce ``tensor`` over the group into that of the rank at ``root_place`` on host
    ``root_host`` (the others' are left as they were)."""
    device, caller = staging.device, staging.caller
    data = flat(device, tensor, "tensor")
    padded = _Padded(staging, data, local.size, copy_in=True)
    name = device.describe(data)[0].name
    shard = scratch(staging, padded.block, name)
    local.reduce_scatter(shard, padded.array, _summed(op), caller)
    device.prescale(shard, op, caller)
    staged.reduce(staging, rail, shard, root_host, _summed(op))
    if rail.rank != root_host:
        return
    if local.rank != root_place:  # the host's ranks all take part; only the root keeps the result
        local.all_gather(scratch(staging, padded.block * local.size, name), shard, caller)
        return
    local.all_gather(padded.array, shard, caller)
    padded.copy_out()
    device.postscale(data, op, group_size, caller)


def broadcast(staging: Staging, local: OneHost, rail: HostCollectives, tensor: Any, root_host: int,
              root_place: int) -> None:
    """Copy the tensor of the rank at ``root_place`` on host ``root_host`` into every rank's."""
    device, caller = staging.device, staging.caller
    data = flat(device, tensor, "tensor")
    on_root_host = rail.rank == root_host
    padded = _Padded(staging, data, local.size, copy_in=on_root_host and local.rank == root_place)
    if on_root_host:
        local.broadcast(padded.array, root_place, caller)
        staged_broadcast(staging, rail, padded.part(local.rank), root_host)
    else:
        shard = scratch(staging, padded.block, device.describe(data)[0].name)
        staged_broadcast(staging, rail, shard, root_host)
        local.all_gather(padded.array, shard, caller)
    padded.copy_out()


def all_gather(staging: Staging, local: OneHost, rail: HostCollectives, outputs: Sequence[Any], input: Any,
               hosts: Sequence[Sequence[int]]) -> None:
    """``outputs[j]`` = group rank j's ``input``, on every rank."""
    device, caller = staging.device, staging.caller
    data, outs, count, spread = _spread(staging, input, "input", outputs, "outputs", hosts, local, rail)
    name = device.describe(data)[0].name
    mine = scratch(staging, rail.size * count, name)
    staged_all_gather(staging, rail, [mine[h * count:(h + 1) * count] for h in range(rail.size)], data)
    everything = scratch(staging, len(spread) * count, name)
    local.all_gather(everything, mine, caller)
    for slot, rank in enumerate(spread):
        device.copy(outs[rank], everything[slot * count:(slot + 1) * count], caller)


def reduce_scatter(staging: Staging, local: OneHost, rail: HostCollectives, output: Any, inputs: Sequence[Any],
                   op: ReduceOp, hosts: Sequence[Sequence[int]]) -> None:
    """``output`` = the reduction over the group of every rank's ``inputs[rank]``."""
    device, caller = staging.device, staging.caller
    out, ins, count, spread = _spread(staging, output, "output", inputs, "inputs", hosts, local, rail)
    name = device.describe(out)[0].name
    arranged = scratch(staging, len(spread) * count, name)
    for slot, rank in enumerate(spread):
        device.copy(arranged[slot * count:(slot + 1) * count], ins[rank], caller)
    mine = scratch(staging, rail.size * count, name)
    local.reduce_scatter(mine, arranged, _summed(op), caller)
    device.prescale(mine, op, caller)
    staged.reduce_scatter(staging, rail, out, [mine[h * count:(h + 1) * count] for h in range(rail.size)],
                          _summed(op))
    device.postscale(out, op, len(spread), caller)


def all_reduce_leaders(staging: Staging, local: OneHost, leaders: HostCollectives | None, tensor: Any,
                       op: ReduceOp, group_size: int) -> None:
    """all_reduce for hosts with unequal rank counts: a device reduce to each host's first
    rank (place 0), a staged all_reduce among those (``leaders``: None elsewhere), a device
    broadcast back."""
    device, caller = staging.device, staging.caller
    data = flat(device, tensor, "tensor")
    device.prescale(data, op, caller)
    local.reduce(data, 0, _summed(op), caller)
    if leaders is not None:
        staged.all_reduce(staging, leaders, data, _summed(op))
    local.broadcast(data, 0, caller)
    device.postscale(data, op, group_size, caller)


def _spread(staging: Staging, single: Any, single_name: str, blocks: Sequence[Any], blocks_name: str,
            hosts: Sequence[Sequence[int]], local: OneHost,
            rail: HostCollectives) -> tuple[Any, list[Any], int, list[int]]:
    """``single`` flat, ``blocks`` flat (one per group rank, each of ``single``'s size), that
    size, and the group ranks in (place, host) order; ValueError unless ``hosts`` is
    rails-shaped and the blocks fit."""
    if len(hosts) != rail.size or any(len(ranks) != local.size for ranks in hosts):
        raise ValueError(f"hosts: expected {rail.size} hosts of {local.size} ranks each, got "
                         f"{[len(ranks) for ranks in hosts]}")
    spread = [hosts[h][p] for p in range(local.size) for h in range(rail.size)]
    data = flat(staging.device, single, single_name)
    count = numel(staging.device, data)
    return data, staged.blocks_of(staging, blocks, len(spread), count, blocks_name), count, spread
