"""What the staged-path tests share: the host step over pydist's API, a rank's staging set-up,
and a one-host device stand-in for the composition.

``ApiHost`` is pydist.algorithms.device_staging.HostCollectives over pydist's public API on a
group (numpy arrays; group ranks). ``staging_for(device, pool)`` is a rank's Staging with the
caller's stream and two staging streams (down, up). ``ApiOneHost`` plays the one-host device collectives
(pydist.algorithms.device_rails.OneHost) over the host's CPU group: each call brings its
device arrays to the host, runs pydist's collective and copies the result back, ordered on
the caller's stream — slow, but exact, so the composition's logic is tested on its own.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import pydist
from pydist.algorithms._partition import block_bounds
from pydist.algorithms.device_staging import Staging
from pydist.core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
from pydist.core.deadline import Deadline
from pydist.device import open_device
from pydist.device.pinned_pool import PinnedPool
from pydist.testing import reference, run_threads

DEADLINE_S = 60.0  # only a bound on a hang, never a measurement


def make_pool(buffer_bytes: int, buffers: int = 3) -> PinnedPool[np.ndarray]:
    """A pool of numpy buffers that start as 0xEE (so a read before a copy shows)."""
    return PinnedPool(buffer_bytes, buffers, lambda n: np.full(n, 0xEE, np.uint8))


def staging_for(device: Any, pool: PinnedPool, trace=None, depth: int = 3) -> Staging:
    """A rank's Staging: the device's current stream as the caller's, two new staging streams."""
    return Staging(device, device.current_stream(), device.new_stream(), device.new_stream(), pool,
                   Deadline.after(DEADLINE_S), depth=depth, trace=trace)


def on_ranks(size: int, fn: Any, *args: Any, hosts: list[str] | None = None, buffer_bytes: int = 64,
             buffers: int = 3, **kwargs: Any) -> list[Any]:
    """``fn(rank, size, device, staging, *args)`` on ``size`` thread-ranks over pydist's
    loopback transport, each with a stand-in device and a Staging over a pool of ``buffers``
    buffers of ``buffer_bytes`` (``kwargs`` go to staging_for)."""
    def body(rank: int, size: int) -> Any:
        device = open_device("standin", 0, rank)
        return fn(rank, size, device, staging_for(device, make_pool(buffer_bytes, buffers), **kwargs), *args)
    return run_threads(size, body, hosts=hosts)


def read(staging: Staging, array: Any) -> np.ndarray:
    """A device array's values on the host, after the caller's work so far."""
    return staging.device.to_host(array, staging.caller, Deadline.after(DEADLINE_S))


def put(staging: Staging, host: np.ndarray, name: str) -> Any:
    """A new device array holding ``host``, written on the caller's stream (lazily)."""
    return staging.device.from_host(host, name, staging.caller)


def value(rank: int, count: int, name: str, product: bool = False) -> np.ndarray:
    """pydist.testing.reference's input of ``rank`` as the device type ``name`` holds it on
    the host (bfloat16: the float32 values' bits)."""
    if name == "bfloat16":
        return float32_to_bf16_bits(reference.value(rank, count, "float32", for_product=product))
    return reference.value(rank, count, name, for_product=product)


def reduced(size: int, count: int, name: str, op: Any) -> np.ndarray:
    """The reference reduction of every rank's ``value`` under ``op`` (a RedOpType)."""
    if name == "bfloat16":
        return float32_to_bf16_bits(reference.reduced(size, count, "float32", op))
    return reference.reduced(size, count, name, op)


class ApiHost:
    """HostCollectives over pydist's public API on ``group`` (None: the default group)."""

    def __init__(self, group: Any = None, log: list | None = None):
        self.group = group
        self.rank = pydist.get_rank(group) if group is not None else pydist.get_rank()
        self.size = pydist.get_world_size(group) if group is not None else pydist.get_world_size()
        self.log = log  # (collective, bytes) of each host step, when given

    def _note(self, name: str, nbytes: int) -> None:
        if self.log is not None:
            self.log.append((name, nbytes))

    def all_reduce(self, array, op):
        self._note("all_reduce", array.nbytes)
        pydist.all_reduce(array, op=op, group=self.group)

    def broadcast(self, array, root):
        self._note("broadcast", array.nbytes)
        pydist.broadcast(array, group=self.group, group_src=root)

    def reduce(self, array, root, op):
        self._note("reduce", array.nbytes)
        pydist.reduce(array, op=op, group=self.group, group_dst=root)

    def all_gather(self, outputs, input):
        self._note("all_gather", input.nbytes)
        pydist.all_gather(outputs, input, group=self.group)

    def reduce_scatter(self, output, inputs, op):
        self._note("reduce_scatter", sum(a.nbytes for a in inputs))
        pydist.reduce_scatter(output, inputs, op=op, group=self.group)

    def gather(self, input, outputs, root):
        pydist.gather(input, outputs, group=self.group, group_dst=root)

    def scatter(self, output, inputs, root):
        pydist.scatter(output, inputs, group=self.group, group_src=root)

    def all_to_all(self, outputs, inputs):
        pydist.all_to_all(outputs, inputs, group=self.group)

    def send(self, array, peer):
        pydist.send(array, group=self.group, group_dst=peer)

    def recv(self, array, peer):
        pydist.recv(array, group=self.group, group_src=peer)


class ApiOneHost:
    """The one-host device collectives played over the host's CPU group (module docstring)."""

    def __init__(self, device: Any, group: Any):
        self.device = device
        self.host = ApiHost(group)
        self.rank, self.size = self.host.rank, self.host.size
        self.calls: list[str] = []

    def _down(self, array: Any, stream: Any) -> np.ndarray:
        """The values of ``array`` (bfloat16 widened to float32, as pydist's CPU path reduces it)."""
        host = self.device.to_host(array, stream, Deadline.after(DEADLINE_S)).reshape(-1)
        return bf16_bits_to_float32(host) if self.device.describe(array)[0].name == "bfloat16" else host

    def _up(self, array: Any, host: np.ndarray, stream: Any) -> None:
        if self.device.describe(array)[0].name == "bfloat16":
            host = float32_to_bf16_bits(host)
        self.device.copy(array, host.reshape(self.device.describe(array)[1]), stream)
        stream.synchronize(Deadline.after(DEADLINE_S))

    def reduce_scatter(self, output: Any, input: Any, op: Any, stream: Any) -> None:
        self.calls.append("reduce_scatter")
        data = self._down(input, stream)
        out = np.empty(self.device.describe(output)[1], data.dtype).reshape(-1)
        self.host.reduce_scatter(out, [data[a:b] for a, b in block_bounds(data.size, self.size)], op)
        self._up(output, out, stream)

    def all_gather(self, output: Any, input: Any, stream: Any) -> None:
        self.calls.append("all_gather")
        data = self._down(input, stream)
        out = np.empty(self.device.describe(output)[1], data.dtype).reshape(-1)
        self.host.all_gather([out[a:b] for a, b in block_bounds(out.size, self.size)], data)
        self._up(output, out, stream)

    def broadcast(self, tensor: Any, root: int, stream: Any) -> None:
        self.calls.append("broadcast")
        data = self._down(tensor, stream)
        self.host.broadcast(data, root)
        self._up(tensor, data, stream)

    def reduce(self, tensor: Any, root: int, op: Any, stream: Any) -> None:
        self.calls.append("reduce")
        data = self._down(tensor, stream)
        self.host.reduce(data, root, op)
        if self.rank == root:
            self._up(tensor, data, stream)
