"""The staged path of device tensors across hosts (issue 47 item 3), on the strict stand-in:
chunk edges, every dtype and op of all_reduce, the three stages overlapping (by the order of
stage events, not by timing), the caller's stream order, the pinned-memory bound."""
from __future__ import annotations

import numpy as np
import pytest
from device_staged_support import ApiHost, on_ranks, put, read, reduced, value

from pydist.algorithms import device_staged_reductions as staged
from pydist.algorithms.device_staging import pinned_pool
from pydist.core.ops import RedOpType, ReduceOp
from pydist.core.settings import parse
from pydist.device import open_device
from pydist.device.dtypes import DTYPES
from pydist.testing import reference

pytestmark = pytest.mark.device

SUM = ReduceOp(RedOpType.SUM)


def _all_reduce(rank, size, device, staging, count, name, op):
    log = []
    tensor = put(staging, value(rank, count, name, op == RedOpType.PRODUCT), name)
    staged.all_reduce(staging, ApiHost(log=log), tensor, reference.make_op(op))
    return read(staging, tensor), [nbytes for _, nbytes in log]


@pytest.mark.parametrize("name, count", [
    ("float32", 0), ("float32", 1), ("float32", 15), ("float32", 16), ("float32", 17), ("float32", 100),
    ("int8", 63), ("int8", 64), ("int8", 65), ("float64", 9), ("bfloat16", 33),
], ids=lambda v: str(v))
def test_all_reduce_at_chunk_edges(name, count):
    """64-byte chunks: none for 0 bytes, one partial, exactly one, one and a bit, many with a
    short last one; each chunk is one host step of at most 64 bytes."""
    results = on_ranks(3, _all_reduce, count, name, RedOpType.SUM)
    itemsize = DTYPES[name].itemsize
    expected_steps = [min(64, count * itemsize - offset) for offset in range(0, count * itemsize, 64)]
    for got, steps in results:
        np.testing.assert_array_equal(got, reduced(3, count, name, RedOpType.SUM))
        assert steps == [s if name != "bfloat16" else 2 * s for s in expected_steps]  # bf16 reduced in fp32


def _every_op(rank, size, device, staging, name):
    found = {}
    for op in RedOpType:
        if reference.supports(op, "float32" if name == "bfloat16" else name):
            found[op.name] = _all_reduce(rank, size, device, staging, 37, name, op)[0]
    return found


@pytest.mark.parametrize("name", list(DTYPES))
def test_all_reduce_every_op(name):
    """Every ReduceOp the dtype allows, 37 elements in 64-byte chunks, 3 ranks."""
    for found in on_ranks(3, _every_op, name):
        assert found, "no op ran"
        for op_name, got in found.items():
            expected = reduced(3, 37, name, RedOpType[op_name])
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} {op_name}")


class Recorder(list):
    """The stage events of one rank, in order."""

    def __call__(self, stage, index):
        self.append((stage, index))

    def in_flight_during_network(self, index):
        """The copies started and not yet waited for when chunk ``index``'s host step began."""
        started, flying = self.index(("net", index)), set()
        for stage, k in self[:started]:
            if stage in ("down", "up"):
                flying.add((stage, k))
            elif stage.endswith(" done"):
                flying.discard((stage.split()[0], k))
        return flying


def _pipelined(rank, size, device, staging, count):
    recorder = Recorder()
    staging.trace = recorder
    tensor = put(staging, np.full(count, rank + 1, np.float32), "float32")
    staged.all_reduce(staging, ApiHost(), tensor, SUM)
    assert (read(staging, tensor) == size * (size + 1) / 2).all()
    return recorder


def test_chunk_k_is_on_the_network_while_k_plus_1_comes_down_and_k_minus_1_goes_up():
    """Six chunks, three in flight: while chunk k's host step runs, chunk k+1's copy down and
    chunk k-1's copy up have been started and not yet waited for."""
    for recorder in on_ranks(2, _pipelined, 16 * 6):
        assert [k for stage, k in recorder if stage == "net"] == list(range(6))
        for k in range(6):
            expected = {("down", k + 1)} if k + 1 < 6 else set()
            if k >= 1:
                expected.add(("up", k - 1))
            flying = recorder.in_flight_during_network(k)
            assert expected <= flying and len(flying) <= 2, (k, recorder)  # 3 buffers: 1 on the network
            assert recorder.index(("down done", k)) < recorder.index(("net", k)) < recorder.index(("up", k))


def test_one_stage_at_a_time_without_depth():
    """depth 1 (the serial path the measurements compare with): nothing in flight during a host step."""
    for recorder in on_ranks(2, _pipelined, 16 * 4, depth=1):
        assert all(recorder.in_flight_during_network(k) == set() for k in range(4))


def _pending_writes(rank, size, device, staging):
    tensor = device.empty((40,), "float32")
    device.copy(tensor, np.full(40, rank + 1, np.float32), staging.caller)  # enqueued, not yet run
    staged.all_reduce(staging, ApiHost(), tensor, SUM)
    after = device.empty((40,), "float32")
    device.copy(after, tensor, staging.caller)  # the caller's next work reads the result
    return read(staging, after)


def test_the_callers_pending_writes_are_staged_and_its_next_work_sees_the_result():
    """The user's tensor is written on the caller's stream just before the call: the staging
    stream must wait for it (else its copies read the stand-in's poison, NaN)."""
    for got in on_ranks(2, _pending_writes):
        np.testing.assert_array_equal(got, np.full(40, 3, np.float32))


def _bounded(rank, size, device, staging):
    tensor = put(staging, np.arange(400, dtype=np.float32) + rank, "float32")
    staged.all_reduce(staging, ApiHost(), tensor, SUM)
    pool = staging.pool
    return read(staging, tensor), pool.allocated, pool.peak_out, pool.out


@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_the_pinned_memory_bound_holds(buffers):
    """25 chunks through a pool of 1, 2 or 3 buffers: never more made or out, all returned."""
    for got, allocated, peak, out in on_ranks(2, _bounded, buffers=buffers):
        np.testing.assert_array_equal(got, 2 * np.arange(400, dtype=np.float32) + 1)
        assert allocated <= buffers and peak <= buffers and out == 0


def test_the_groups_pool_comes_from_the_settings():
    found = parse({"PYDIST_CUDA_CHUNK_BYTES": "4096", "PYDIST_CUDA_PINNED_BYTES": "12288"})
    device = open_device("standin", 0, 0)
    pool = pinned_pool(device, found.cuda_chunk_bytes, found.cuda_pinned_bytes)
    assert (pool.buffer_bytes, pool.max_buffers) == (4096, 3)
    buffer = pool.try_acquire()
    assert buffer is not None and buffer.nbytes == 4096 and buffer.ctypes.data % 4096 == 0  # page-aligned
    pool.release(buffer)
    pool.close()
    assert pool.allocated == 0
    assert parse({}).cuda_chunk_bytes == 4 << 20 and parse({}).cuda_pinned_bytes == 12 << 20
    with pytest.raises(ValueError, match="PYDIST_CUDA_PINNED_BYTES=100 must hold at least one chunk of "
                                         "PYDIST_CUDA_CHUNK_BYTES=4096"):
        pinned_pool(device, 4096, 100)
    with pytest.raises(ValueError, match="PYDIST_CUDA_CHUNK_BYTES"):
        parse({"PYDIST_CUDA_CHUNK_BYTES": "100"})  # not a multiple of 8


def _misuse(rank, size, device, staging):
    strided = device.empty((8, 2), "float32")[:, 0]
    with pytest.raises(ValueError, match="tensor: a non-contiguous device tensor"):
        staged.all_reduce(staging, ApiHost(), strided, SUM)
    output = device.empty((4,), "float32")
    with pytest.raises(ValueError, match=r"inputs: expected 2 device tensors, got 1"):
        staged.reduce_scatter(staging, ApiHost(), output, [device.empty((4,), "float32")], SUM)
    with pytest.raises(ValueError, match=r"inputs\[1\]: expected 4 elements, got 5"):
        staged.reduce_scatter(staging, ApiHost(), output, [device.empty((4,), "float32"),
                                                           device.empty((5,), "float32")], SUM)
    return staging.pool.out


def test_misuse_is_refused_before_anything_is_staged():
    assert on_ranks(2, _misuse) == [0, 0]
