"""Device collectives across hosts composed with the one-host device path (device_rails), on the
stand-in: thread-ranks posing as 2 hosts x 2 ranks (and 2 x 3, and unequal hosts); the one-host
collectives played over the host's CPU group (device_staged_support.ApiOneHost), the rails
over pydist's loopback transport. Each byte crosses between hosts once."""
from __future__ import annotations

import numpy as np
import pytest
from device_staged_support import ApiHost, ApiOneHost, on_ranks, put, read, reduced, value

import pydist
from pydist.algorithms import device_rails as rails
from pydist.algorithms import device_staged_reductions as staged
from pydist.core.ops import RedOpType, ReduceOp
from pydist.device.dtypes import DTYPES
from pydist.testing import reference

pytestmark = pytest.mark.device


class Layout:
    """Group ranks on ``hosts`` hosts of ``places`` ranks each, host of rank r = r % hosts
    (interleaved, so group-rank order differs from (host, place) order); this rank's host
    group, rail group and position. Every rank makes every group, as new_group requires."""

    def __init__(self, rank: int, hosts: int, places: int, device, log=None):
        self.hosts = [[r for r in range(hosts * places) if r % hosts == h] for h in range(hosts)]
        local_groups = [pydist.new_group(ranks) for ranks in self.hosts]
        rail_groups = [pydist.new_group([ranks[p] for ranks in self.hosts]) for p in range(places)]
        self.host, self.place = rank % hosts, self.hosts[rank % hosts].index(rank)
        self.local = ApiOneHost(device, local_groups[self.host])
        self.rail = ApiHost(rail_groups[self.place], log)
        assert (self.local.rank, self.rail.rank) == (self.place, self.host)


def on_hosts(hosts: int, places: int, fn, *args, **kwargs):
    """``fn(rank, size, device, staging, layout, *args)`` on thread-ranks posing as hosts."""
    def body(rank, size, device, staging):
        return fn(rank, size, device, staging, Layout(rank, hosts, places, device), *args)
    size = hosts * places
    return on_ranks(size, body, hosts=[f"host{r % hosts}" for r in range(size)], **kwargs)


CASES = [("float32", op) for op in RedOpType] + [
    ("bfloat16", RedOpType.SUM), ("bfloat16", RedOpType.AVG), ("float16", RedOpType.PREMUL_SUM),
    ("int64", RedOpType.AVG), ("int64", RedOpType.PREMUL_SUM), ("int8", RedOpType.BXOR), ("int32", RedOpType.PRODUCT),
    ("uint8", RedOpType.MIN), ("bool", RedOpType.MAX), ("float64", RedOpType.SUM)]


def _all_reduce(rank, size, device, staging, layout, count, cases):
    found = []
    for name, op in cases:
        if not reference.supports(op, "float32" if name == "bfloat16" else name):
            continue
        tensor = put(staging, value(rank, count, name, op == RedOpType.PRODUCT), name)
        rails.all_reduce(staging, layout.local, layout.rail, tensor, reference.make_op(op), size)
        found.append((name, op, read(staging, tensor)))
    return found


@pytest.mark.parametrize("count", [0, 1, 3, 37])
def test_all_reduce_every_op_two_hosts_of_two(count):
    """37 elements: a padded block per place, several 64-byte chunks per rail; 0 to 3: blocks
    of one element or none."""
    for found in on_hosts(2, 2, _all_reduce, count, CASES):
        assert len(found) == len([c for c in CASES if reference.supports(c[1], c[0].replace("bfloat16", "float32"))])
        for name, op, got in found:
            np.testing.assert_array_equal(got, reduced(4, count, name, op), err_msg=f"{name} {op.name}")


def test_all_reduce_two_hosts_of_three():
    for found in on_hosts(2, 3, _all_reduce, 50, [("float32", RedOpType.SUM), ("int64", RedOpType.AVG)]):
        for name, op, got in found:
            np.testing.assert_array_equal(got, reduced(6, 50, name, op), err_msg=f"{name} {op.name}")


def _bytes_between_hosts(rank, size, device, staging, count, composed):
    log = []
    tensor = put(staging, np.ones(count, np.float32), "float32")
    if composed:
        layout = Layout(rank, 2, 2, device, log)
        rails.all_reduce(staging, layout.local, layout.rail, tensor, ReduceOp(RedOpType.SUM), size)
    else:
        staged.all_reduce(staging, ApiHost(log=log), tensor, ReduceOp(RedOpType.SUM))
    assert (read(staging, tensor) == size).all()
    return sum(nbytes for _, nbytes in log)


def test_each_byte_goes_between_hosts_once():
    """2 hosts x 2 ranks, 1000 float32 (4000 bytes): composed, the ranks of a host together put
    the tensor's bytes into cross-host all_reduces once (each its half); each staging its own
    puts them in once per rank (twice per host)."""
    composed = on_ranks(4, _bytes_between_hosts, 1000, True, hosts=["host0", "host1"] * 2)
    assert composed == [2000] * 4
    alone = on_ranks(4, _bytes_between_hosts, 1000, False, hosts=["host0", "host1"] * 2)
    assert alone == [4000] * 4


def _rooted(rank, size, device, staging, layout, count, root):
    host, place = root % 2, layout.hosts[root % 2].index(root)
    sent = put(staging, np.arange(count, dtype=np.float64) + 100 * rank, "float64")
    rails.broadcast(staging, layout.local, layout.rail, sent, host, place)
    summed = put(staging, np.arange(count, dtype=np.float64) + 100 * rank, "float64")
    rails.reduce(staging, layout.local, layout.rail, summed, host, place, ReduceOp(RedOpType.AVG), size)
    return read(staging, sent), read(staging, summed)


@pytest.mark.parametrize("root", [0, 3])
@pytest.mark.parametrize("count", [0, 5, 30])
def test_broadcast_and_reduce(count, root):
    for rank, (sent, summed) in enumerate(on_hosts(2, 2, _rooted, count, root)):
        base = np.arange(count, dtype=np.float64)
        np.testing.assert_array_equal(sent, base + 100 * root)
        np.testing.assert_array_equal(summed, base + 150 if rank == root else base + 100 * rank)


def _gathered(rank, size, device, staging, layout, count, op):
    output = device.empty((size * count,), "int64")
    outputs = [output[j * count:(j + 1) * count] for j in range(size)]  # all_gather_into_tensor's blocks
    rails.all_gather(staging, layout.local, layout.rail, outputs, put(staging, np.arange(count) + 1000 * rank, "int64"),
                     layout.hosts)
    scattered = device.empty((count,), "int64")
    source = put(staging, np.arange(size * count) * (rank + 1), "int64")
    inputs = [source[j * count:(j + 1) * count] for j in range(size)]
    rails.reduce_scatter(staging, layout.local, layout.rail, scattered, inputs, reference.make_op(op), layout.hosts)
    return read(staging, output), read(staging, scattered)


@pytest.mark.parametrize("op", [RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM])
@pytest.mark.parametrize("count", [0, 1, 7])
def test_all_gather_and_reduce_scatter_in_group_rank_order(count, op):
    """Hosts interleave the group ranks (host of rank r: r % 2): the blocks still land in group-rank order."""
    for rank, (gathered, scattered) in enumerate(on_hosts(2, 2, _gathered, count, op)):
        np.testing.assert_array_equal(gathered, np.concatenate([np.arange(count) + 1000 * r for r in range(4)]))
        block = np.arange(rank * count, (rank + 1) * count) * 10  # sum over ranks of (r + 1)
        expected = {RedOpType.SUM: block, RedOpType.AVG: block // 4, RedOpType.PREMUL_SUM: 2 * block}[op]
        np.testing.assert_array_equal(scattered, expected)


def _leaders(rank, size, device, staging, count):
    hosts = [[0, 1], [2]]
    local_groups = [pydist.new_group(ranks) for ranks in hosts]
    leaders_group = pydist.new_group([0, 2])
    host = 0 if rank < 2 else 1
    local = ApiOneHost(device, local_groups[host])
    leaders = ApiHost(leaders_group) if rank in (0, 2) else None
    tensor = put(staging, np.arange(count, dtype=np.float32) * (rank + 1), "float32")
    rails.all_reduce_leaders(staging, local, leaders, tensor, ReduceOp(RedOpType.AVG), size)
    return read(staging, tensor)


@pytest.mark.parametrize("count", [0, 1, 40])
def test_unequal_hosts_reduce_to_a_leader(count):
    for got in on_ranks(3, _leaders, count, hosts=["host0", "host0", "host1"]):
        np.testing.assert_allclose(got, np.arange(count, dtype=np.float32) * 2)


def test_the_path_follows_the_layout():
    assert rails.choose([[0, 1], [2, 3]], shares=True) == "rails"
    assert rails.choose([[0, 1], [2]], shares=True) == "leaders"
    assert rails.choose([[0], [1]], shares=True) == "staged"
    assert rails.choose([[0, 1], [2, 3]], shares=False) == "staged"


def _misuse(rank, size, device, staging, layout):
    outputs = [device.empty((2,), "float32") for _ in range(4)]
    with pytest.raises(ValueError, match=r"hosts: expected 2 hosts of 2 ranks each, got \[3, 1\]"):
        rails.all_gather(staging, layout.local, layout.rail, outputs, device.empty((2,), "float32"),
                         [[0, 1, 2], [3]])
    with pytest.raises(ValueError, match=r"outputs\[3\]: expected 2 elements, got 3"):
        rails.all_gather(staging, layout.local, layout.rail, outputs[:3] + [device.empty((3,), "float32")],
                         device.empty((2,), "float32"), layout.hosts)
    return True


def test_misuse_is_refused_at_the_call():
    assert all(on_hosts(2, 2, _misuse))


assert set(DTYPES) >= {name for name, _ in CASES}
