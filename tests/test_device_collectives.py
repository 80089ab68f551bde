"""Every collective on device tensors through pydist's API, ranks as real processes on one
host, on the strict stand-in (lazy streams, poisoned outputs: a missing wait reads poison),
against numpy references (device_cases), at 2, 3 and 4 ranks: one pool of processes per
world size runs every case (device_pool). Slots are small (PYDIST_DEVICE_SLOT_BYTES=4096)
so that tensors take several rounds, and all_reduce switches to two shots above 256 bytes."""
from __future__ import annotations

import numpy as np
import pytest
from device_cases import DTYPES, OPS, inputs, op_of, reduced, same, valid
from device_pool import Pool

import pydist
from pydist.core.deadline import Deadline

pytestmark = [pytest.mark.device, pytest.mark.slow]

ENV = {"PYDIST_DEVICE_SLOT_BYTES": "4096", "PYDIST_DEVICE_ONE_SHOT_BYTES": "256",
       "PYDIST_AUTH_TOKEN": "device-collectives-test"}
#: element counts: none, one, a few, one round of float32 (1024 a slot), several rounds
COUNTS = [0, 1, 13, 700, 2600]
SOON = 60.0  # a deadline that only bounds a hang


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda size: f"{size}ranks")
def pool(request):
    made = Pool(request.param, ENV)
    yield made
    made.close()


# -- what the ranks run -----------------------------------------------------------------------

_DEVICES: dict = {}


def device(rank: int, index: int = 0):
    """This rank's stand-in device ``index`` (one object per process and index: a group binds one)."""
    from pydist.device import open_device
    if index not in _DEVICES:
        _DEVICES[index] = open_device("standin", index, rank)
    return _DEVICES[index]


def up(rank: int, host: np.ndarray, name: str):
    dev = device(rank)
    return dev.from_host(host, name, dev.current_stream())


def down(rank: int, array) -> np.ndarray:
    dev = device(rank)
    return dev.to_host(array, dev.current_stream(), Deadline.after(SOON))


def _finish(rank: int, wait) -> None:
    if wait is not None:
        wait.wait()


def all_reduce_case(rank, size, names, ops, counts, async_op):
    kept = {}
    for name in names:
        for op in ops:
            if valid(op, name):
                for count in counts:
                    array = up(rank, inputs(name, count, rank, 1, op), name)
                    _finish(rank, pydist.all_reduce(array, op=op_of(op, name), async_op=async_op))
                    kept[(name, op, count)] = array
    return {key: down(rank, array) for key, array in kept.items()}


# -- the tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_reduce_every_op_and_dtype(pool, async_op):
    results = pool.run(all_reduce_case, DTYPES, OPS, COUNTS[:4] if async_op else COUNTS, async_op)
    checked = 0
    for key in results[0]:
        name, op, count = key
        expected = reduced([inputs(name, count, r, 1, op) for r in range(pool.size)], op, name, pool.size)
        for rank in range(pool.size):
            assert same(results[rank][key], expected), (rank, key, results[rank][key][:8], expected[:8])
        checked += 1
    assert checked == sum(valid(op, name) for name in DTYPES for op in OPS) * len(COUNTS[:4] if async_op else COUNTS)


NAMES = ["float32", "bfloat16", "int64", "int8", "bool"]


def broadcast_case(rank, size, names, counts):
    kept = {}
    for name in names:
        for count in counts:
            for root in range(size):
                array = up(rank, inputs(name, count, rank, 2), name)
                pydist.broadcast(array, src=root)
                kept[(name, count, root)] = array
    return {key: down(rank, array) for key, array in kept.items()}


def test_broadcast_from_every_root(pool):
    results = pool.run(broadcast_case, NAMES, COUNTS)
    for (name, count, root), _ in results[0].items():
        for rank in range(pool.size):
            assert same(results[rank][(name, count, root)], inputs(name, count, root, 2)), (rank, name, count, root)


def reduce_case(rank, size, names, ops, counts):
    kept = {}
    for name in names:
        for op in ops:
            for count in counts:
                for root in range(size):
                    if valid(op, name):
                        array = up(rank, inputs(name, count, rank, 3, op), name)
                        pydist.reduce(array, dst=root, op=op_of(op, name))
                        kept[(name, op, count, root)] = array
    return {key: down(rank, array) for key, array in kept.items()}


def test_reduce_to_every_root(pool):
    results = pool.run(reduce_case, NAMES, ["SUM", "MAX", "AVG", "PREMUL_SUM", "BXOR"], COUNTS[:4])
    assert results[0]
    for (name, op, count, root) in results[0]:
        mine = [inputs(name, count, r, 3, op) for r in range(pool.size)]
        for rank in range(pool.size):
            expected = reduced(mine, op, name, pool.size) if rank == root else mine[rank]
            assert same(results[rank][(name, op, count, root)], expected), (rank, name, op, count, root)


def all_gather_case(rank, size, names, counts, into_tensor):
    kept = {}
    for name in names:
        for count in counts:
            mine = up(rank, inputs(name, count, rank, 4), name)
            if into_tensor:
                out = device(rank).empty((size, count), name)
                pydist.all_gather_into_tensor(out, mine)
                kept[(name, count)] = out
            else:
                outs = [device(rank).empty((count,), name) for _ in range(size)]
                pydist.all_gather(outs, mine)
                kept[(name, count)] = outs
    return {key: np.stack([down(rank, o) for o in out]) if isinstance(out, list) else down(rank, out)
            for key, out in kept.items()}


@pytest.mark.parametrize("into_tensor", [False, True], ids=["list", "into_tensor"])
def test_all_gather(pool, into_tensor):
    results = pool.run(all_gather_case, NAMES, COUNTS, into_tensor)
    for (name, count) in results[0]:
        expected = np.stack([inputs(name, count, r, 4) for r in range(pool.size)])
        for rank in range(pool.size):
            assert same(results[rank][(name, count)], expected), (rank, name, count)


def reduce_scatter_case(rank, size, names, ops, counts, into_tensor):
    kept = {}
    for name in names:
        for op in ops:
            for count in counts:
                if valid(op, name):
                    parts = [inputs(name, count, rank, 5 + j, op) for j in range(size)]
                    out = device(rank).empty((count,), name)
                    if into_tensor:
                        pydist.reduce_scatter_tensor(out, up(rank, np.concatenate(parts), name), op=op_of(op, name))
                    else:
                        pydist.reduce_scatter(out, [up(rank, part, name) for part in parts], op=op_of(op, name))
                    kept[(name, op, count)] = out
    return {key: down(rank, out) for key, out in kept.items()}


@pytest.mark.parametrize("into_tensor", [False, True], ids=["list", "tensor"])
def test_reduce_scatter(pool, into_tensor):
    results = pool.run(reduce_scatter_case, NAMES, ["SUM", "MIN", "AVG", "PREMUL_SUM", "BOR"], COUNTS, into_tensor)
    assert results[0]
    for (name, op, count) in results[0]:
        for rank in range(pool.size):
            expected = reduced([inputs(name, count, r, 5 + rank, op) for r in range(pool.size)], op, name, pool.size)
            assert same(results[rank][(name, op, count)], expected), (rank, name, op, count)


def gather_case(rank, size, names, counts):
    kept = {}
    for name in names:
        for count in counts:
            for root in range(size):
                outs = [device(rank).empty((count,), name) for _ in range(size)] if rank == root else None
                pydist.gather(up(rank, inputs(name, count, rank, 6), name), outs, dst=root)
                single = device(rank).empty((size, count), name) if rank == root else None
                pydist.gather_single(up(rank, inputs(name, count, rank, 6), name), single, dst=root)
                if outs is not None:
                    kept[(name, count, "list")] = outs
                    kept[(name, count, "single")] = [single]
    return {key: np.stack([down(rank, o) for o in outs]).reshape(size, key[1]) for key, outs in kept.items()}


def test_gather_to_every_root(pool):
    results = pool.run(gather_case, NAMES, COUNTS)
    for rank in range(pool.size):
        for (name, count, form), got in results[rank].items():
            expected = np.stack([inputs(name, count, r, 6) for r in range(pool.size)])
            assert same(got, expected), (rank, name, count, form)
    assert all(len(found) == 2 * len(NAMES) * len(COUNTS) for found in results)


def scatter_case(rank, size, names, counts):
    kept = {}
    for name in names:
        for count in counts:
            for root in range(size):
                parts = [up(rank, inputs(name, count, 100 * root + j, 7), name) for j in range(size)] \
                    if rank == root else None
                out = device(rank).empty((count,), name)
                pydist.scatter(out, parts, src=root)
                kept[(name, count, root)] = out
    return {key: down(rank, out) for key, out in kept.items()}


def test_scatter_from_every_root(pool):
    results = pool.run(scatter_case, NAMES, COUNTS)
    for rank in range(pool.size):
        for (name, count, root), got in results[rank].items():
            assert same(got, inputs(name, count, 100 * root + rank, 7)), (rank, name, count, root)


def _pair_count(sender: int, receiver: int, base: int) -> int:
    """Elements rank ``sender`` sends to ``receiver`` (uneven: every pair its own)."""
    return base + 3 * sender + receiver


def all_to_all_case(rank, size, names, bases):
    kept = {}
    for name in names:
        for base in bases:
            ins = [up(rank, inputs(name, _pair_count(rank, j, base), 1000 * rank + j, 8), name) for j in range(size)]
            outs = [device(rank).empty((_pair_count(j, rank, base),), name) for j in range(size)]
            pydist.all_to_all(outs, ins)
            kept[(name, base)] = outs
    return {key: [down(rank, o) for o in outs] for key, outs in kept.items()}


def test_all_to_all_uneven_parts(pool):
    results = pool.run(all_to_all_case, NAMES, [0, 5, 900])
    for rank in range(pool.size):
        for (name, base), got in results[rank].items():
            for sender in range(pool.size):
                expected = inputs(name, _pair_count(sender, rank, base), 1000 * sender + rank, 8)
                assert same(got[sender], expected), (rank, name, base, sender)


def all_to_all_single_case(rank, size, names, rows):
    kept = {}
    for name in names:
        for per_row in rows:
            sent = [1 + (rank + j) % 3 for j in range(size)]  # rows to rank j
            received = [1 + (j + rank) % 3 for j in range(size)]
            host = inputs(name, sum(sent) * per_row, rank, 9).reshape(sum(sent), per_row)
            out = device(rank).empty((sum(received), per_row), name)
            pydist.all_to_all_single(out, up(rank, host, name), received, sent)
            kept[(name, per_row)] = out
    return {key: down(rank, out) for key, out in kept.items()}


def test_all_to_all_single_with_split_sizes(pool):
    results = pool.run(all_to_all_single_case, NAMES, [1, 400])
    for rank in range(pool.size):
        for (name, per_row), got in results[rank].items():
            pieces = []
            for sender in range(pool.size):
                sent = [1 + (sender + j) % 3 for j in range(pool.size)]
                host = inputs(name, sum(sent) * per_row, sender, 9).reshape(sum(sent), per_row)
                start = sum(sent[:rank])
                pieces.append(host[start:start + sent[rank]])
            assert same(got, np.concatenate(pieces)), (rank, name, per_row)


def ring_case(rank, size, names, counts, mode):
    """Each rank sends to the next and receives from the previous, ``mode`` one of blocking
    (even ranks send first), async (isend/irecv), batch (batch_isend_irecv), any (recv from
    any source)."""
    kept, sources = {}, []
    right, left = (rank + 1) % size, (rank - 1) % size
    for name in names:
        for count in counts:
            for tag in (0, 7):
                mine = up(rank, inputs(name, count, 10 * rank + tag, 11), name)
                got = device(rank).empty((count,), name)
                if mode == "blocking":
                    if rank % 2 == 0:
                        pydist.send(mine, dst=right, tag=tag)
                        sources.append(pydist.recv(got, src=left, tag=tag))
                    else:
                        sources.append(pydist.recv(got, src=left, tag=tag))
                        pydist.send(mine, dst=right, tag=tag)
                elif mode == "any":
                    works = [pydist.isend(mine, dst=right, tag=tag)]
                    sources.append(pydist.recv(got, tag=tag))
                    works[0].wait()
                elif mode == "async":
                    works = [pydist.irecv(got, src=left, tag=tag), pydist.isend(mine, dst=right, tag=tag)]
                    for work in works:
                        work.wait()
                else:
                    ops = [pydist.P2POp(pydist.isend, mine, right, tag=tag),
                           pydist.P2POp(pydist.irecv, got, left, tag=tag)]
                    for work in pydist.batch_isend_irecv(ops):
                        work.wait()
                kept[(name, count, tag)] = got
    return {key: down(rank, got) for key, got in kept.items()}, sources


@pytest.mark.parametrize("mode", ["blocking", "async", "batch", "any"])
def test_send_and_recv_around_a_ring(pool, mode):
    results = pool.run(ring_case, ["float32", "bfloat16", "int64", "bool"], [0, 5, 2600], mode)
    for rank in range(pool.size):
        received, sources = results[rank]
        left = (rank - 1) % pool.size
        for (name, count, tag), got in received.items():
            assert same(got, inputs(name, count, 10 * left + tag, 11)), (rank, name, count, tag)
        assert set(sources) <= {left}


def barrier_case(rank, size):
    """A barrier of a group that runs device tensors: each rank's device work so far is done
    when it returns (read here on another stream, which nothing orders after it)."""
    dev = device(rank)
    x = up(rank, np.full(5, rank + 1, np.int64), "int64")
    pydist.all_reduce(x)
    pydist.barrier()
    return dev.to_host(x, dev.new_stream(), Deadline.after(SOON))


def test_barrier_completes_the_device_work_before_it(pool):
    total = sum(range(1, pool.size + 1))
    assert all((got == total).all() for got in pool.run(barrier_case))
