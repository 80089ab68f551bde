"""Every collective of device tensors through the simple staged path (each rank stages its own
through the whole group's CPU collective), on the strict stand-in: 3 thread-ranks, 64-byte
chunks, sizes that leave a short last chunk, and none at all."""
from __future__ import annotations

import numpy as np
import pytest
from device_staged_support import ApiHost, on_ranks, put, read

from pydist.algorithms import device_staged_movement as moved
from pydist.algorithms import device_staged_reductions as staged
from pydist.core.ops import RedOpType, ReduceOp

pytestmark = pytest.mark.device

COUNTS = [0, 1, 21]


def _fill(rank: int, count: int, salt: int = 0) -> np.ndarray:
    return (np.arange(count) * 3 + rank * 100 + salt * 1000).astype(np.float32)


def _broadcast(rank, size, device, staging, count):
    tensor = put(staging, _fill(rank, count), "float32")
    moved.broadcast(staging, ApiHost(), tensor, 1)
    return read(staging, tensor)


@pytest.mark.parametrize("count", COUNTS)
def test_broadcast(count):
    for got in on_ranks(3, _broadcast, count):
        np.testing.assert_array_equal(got, _fill(1, count))


def _reduce(rank, size, device, staging, count):
    tensor = put(staging, _fill(rank, count), "float32")
    staged.reduce(staging, ApiHost(), tensor, 2, ReduceOp(RedOpType.MAX))
    return read(staging, tensor)


@pytest.mark.parametrize("count", COUNTS)
def test_reduce_leaves_the_others_as_they_were(count):
    for rank, got in enumerate(on_ranks(3, _reduce, count)):
        np.testing.assert_array_equal(got, _fill(2 if rank == 2 else rank, count))


def _all_gather(rank, size, device, staging, count, name):
    outputs = [device.empty((count,), name) for _ in range(size)]
    moved.all_gather(staging, ApiHost(), outputs, put(staging, _fill(rank, count).astype(np.int64), name))
    return [read(staging, output) for output in outputs]


@pytest.mark.parametrize("count", COUNTS)
def test_all_gather(count):
    for got in on_ranks(3, _all_gather, count, "int64"):
        for j, block in enumerate(got):
            np.testing.assert_array_equal(block, _fill(j, count).astype(np.int64))


def _gather_scatter(rank, size, device, staging, count):
    outputs = [device.empty((count,), "float32") for _ in range(size)] if rank == 0 else None
    moved.gather(staging, ApiHost(), put(staging, _fill(rank, count), "float32"), outputs, 0)
    gathered = [read(staging, output) for output in outputs] if outputs is not None else None
    inputs = [put(staging, _fill(j, count, salt=1), "float32") for j in range(size)] if rank == 2 else None
    output = device.empty((count,), "float32")
    moved.scatter(staging, ApiHost(), output, inputs, 2)
    return gathered, read(staging, output)


@pytest.mark.parametrize("count", COUNTS)
def test_gather_and_scatter(count):
    for rank, (gathered, scattered) in enumerate(on_ranks(3, _gather_scatter, count)):
        if rank == 0:
            for j, block in enumerate(gathered):
                np.testing.assert_array_equal(block, _fill(j, count))
        else:
            assert gathered is None
        np.testing.assert_array_equal(scattered, _fill(rank, count, salt=1))


def _reduce_scatter(rank, size, device, staging, count, op):
    inputs = [put(staging, _fill(rank, count, salt=j), "float32") for j in range(size)]
    output = device.empty((count,), "float32")
    staged.reduce_scatter(staging, ApiHost(), output, inputs, ReduceOp(op, 2.0 if op == RedOpType.PREMUL_SUM else None))
    return read(staging, output)


@pytest.mark.parametrize("op", [RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM])
@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatter(count, op):
    for rank, got in enumerate(on_ranks(3, _reduce_scatter, count, op)):
        total = sum(_fill(r, count, salt=rank) for r in range(3))
        expected = {RedOpType.SUM: total, RedOpType.AVG: total / 3, RedOpType.PREMUL_SUM: 2 * total}[op]
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def _split(src: int, dst: int, scale: int) -> int:
    """Elements rank ``src`` sends rank ``dst`` (0 for some pairs)."""
    return (src * 3 + dst * 5) % 7 * scale


def _all_to_all(rank, size, device, staging, scale):
    inputs = [put(staging, _fill(rank, _split(rank, j, scale), salt=j), "float32") for j in range(size)]
    outputs = [device.empty((_split(j, rank, scale),), "float32") for j in range(size)]
    moved.all_to_all(staging, ApiHost(), outputs, inputs)
    return [read(staging, output) for output in outputs]


@pytest.mark.parametrize("scale", [0, 1, 9])
def test_all_to_all_with_uneven_blocks(scale):
    """Blocks of 0 to 6 x scale elements, paired up; 2 x 3 parts per 64-byte chunk (2 floats each)."""
    for rank, got in enumerate(on_ranks(3, _all_to_all, scale)):
        for j, block in enumerate(got):
            np.testing.assert_array_equal(block, _fill(j, _split(j, rank, scale), salt=rank))


def _send_recv(rank, size, device, staging, count):
    host = ApiHost()
    tensor = put(staging, _fill(rank, count), "float32")
    if rank == 0:
        moved.send(staging, host, tensor, 1)
        moved.recv(staging, host, tensor, 1)
    elif rank == 1:
        moved.recv(staging, host, tensor, 0)
        moved.send(staging, host, tensor, 0)
    return read(staging, tensor)


@pytest.mark.parametrize("count", COUNTS)
def test_send_and_recv(count):
    got = on_ranks(3, _send_recv, count)
    np.testing.assert_array_equal(got[0], _fill(0, count))  # there and back
    np.testing.assert_array_equal(got[1], _fill(0, count))
    np.testing.assert_array_equal(got[2], _fill(2, count))


def _bits(rank, size, device, staging):
    bits = (np.arange(33, dtype=np.int64) * 977 + rank * 31).astype(np.int16)  # NaNs and infinities among them
    outputs = [device.empty((33,), "bfloat16") for _ in range(size)]
    moved.all_gather(staging, ApiHost(), outputs, put(staging, bits, "bfloat16"))
    return [read(staging, output) for output in outputs]


def test_data_movement_keeps_bfloat16_bits():
    for got in on_ranks(3, _bits):
        for j, block in enumerate(got):
            np.testing.assert_array_equal(block, (np.arange(33, dtype=np.int64) * 977 + j * 31).astype(np.int16))
