"""The conformance suite: every operation on every rank, checked against naive references.

``run_suite(rank, size)`` runs inside an initialised default group (any transport or
backend) and returns a list of failure descriptions (empty when everything matched). Cases
cover every collective x dtype x ReduceOp it supports x counts 0, 1, odd, not divisible by
the world size, and multi-segment (set PYDIST_SEGMENT_BYTES low) x every root, plus
point-to-point, object collectives and subgroups. ``python -m pydist.testing.conformance``
runs it in a process launched by pydist-run, torchrun or mpiexec.
"""
from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from ..api import collectives as c
from ..api import objects as o
from ..api import p2p as p
from ..api.groups import new_group
from ..core.ops import RedOpType
from ..groups.work import Work
from .reference import DTYPES, make_op, reduced, supports, value

ALL_OPS = list(RedOpType)


class Checker:
    """Collects mismatches instead of stopping at the first."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def equal(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            self.failures.append(f"{name}: got {got!r}, expected {want!r}")


def counts(size: int) -> list[int]:
    """0, 1, odd, not divisible by the world size, and long enough for many segments."""
    return [0, 1, 7, 3 * size + 1, 1000]


def case_broadcast(rank: int, size: int, check: Checker) -> None:
    for dtype in DTYPES:
        for count in counts(size):
            for root in range(size):
                buf = value(rank, count, dtype)
                c.broadcast(buf, src=root)
                check.equal(f"broadcast {dtype} n={count} root={root}", buf, value(root, count, dtype))


def case_all_reduce(rank: int, size: int, check: Checker) -> None:
    for op in ALL_OPS:
        for dtype in DTYPES:
            if not supports(op, dtype):
                continue
            for count in counts(size):
                buf = value(rank, count, dtype, for_product=op == RedOpType.PRODUCT)
                c.all_reduce(buf, op=make_op(op))
                check.equal(f"all_reduce {op.name} {dtype} n={count}", buf, reduced(size, count, dtype, op))


def case_reduce(rank: int, size: int, check: Checker) -> None:
    for op in ALL_OPS:
        for dtype in DTYPES:
            if not supports(op, dtype):
                continue
            for count in counts(size)[:4]:
                for root in range(size):
                    mine = value(rank, count, dtype, for_product=op == RedOpType.PRODUCT)
                    buf = mine.copy()
                    c.reduce(buf, dst=root, op=make_op(op))
                    want = reduced(size, count, dtype, op) if rank == root else mine
                    check.equal(f"reduce {op.name} {dtype} n={count} root={root}", buf, want)


def case_all_gather(rank: int, size: int, check: Checker) -> None:
    for dtype in DTYPES:
        for count in counts(size):
            outs = [np.zeros(count, dtype) for _ in range(size)]
            c.all_gather(outs, value(rank, count, dtype))
            for r in range(size):
                check.equal(f"all_gather {dtype} n={count} [{r}]", outs[r], value(r, count, dtype))
            flat = np.zeros(count * size, dtype)
            c.all_gather_into_tensor(flat, value(rank, count, dtype))
            want = np.concatenate([value(r, count, dtype) for r in range(size)])
            check.equal(f"all_gather_into_tensor {dtype} n={count}", flat, want)
    uneven = [np.zeros(r + 1, np.int32) for r in range(size)]
    c.all_gather(uneven, value(rank, rank + 1, "int32"))
    for r in range(size):
        check.equal(f"all_gather uneven [{r}]", uneven[r], value(r, r + 1, "int32"))


def case_gather_scatter(rank: int, size: int, check: Checker) -> None:
    for dtype in DTYPES:
        for count in counts(size)[:4]:
            for root in range(size):
                outs = [np.zeros(count, dtype) for _ in range(size)] if rank == root else None
                c.gather(value(rank, count, dtype), outs, dst=root)
                for r in range(size if rank == root else 0):
                    assert outs is not None  # the root's
                    check.equal(f"gather {dtype} n={count} root={root} [{r}]", outs[r], value(r, count, dtype))
                out = np.zeros(count, dtype)
                ins = [value(root, count, dtype, salt=r) for r in range(size)] if rank == root else None
                c.scatter(out, ins, src=root)
                check.equal(f"scatter {dtype} n={count} root={root}", out, value(root, count, dtype, salt=rank))


def case_reduce_scatter(rank: int, size: int, check: Checker) -> None:
    for op in ALL_OPS:
        for dtype in DTYPES:
            if not supports(op, dtype):
                continue
            for count in counts(size)[:3] + [130]:
                product = op == RedOpType.PRODUCT
                ins = [value(rank, count, dtype, salt=j, for_product=product) for j in range(size)]
                keep = [x.copy() for x in ins]
                out = np.zeros(count, dtype)
                c.reduce_scatter(out, ins, op=make_op(op))
                check.equal(f"reduce_scatter {op.name} {dtype} n={count}", out,
                            reduced(size, count, dtype, op, salt=rank))
                check.equal(f"reduce_scatter keeps inputs {op.name} {dtype}", np.concatenate(ins), np.concatenate(keep))
                flat_out = np.zeros(count, dtype)
                c.reduce_scatter_tensor(flat_out, np.concatenate(ins), op=make_op(op))
                check.equal(f"reduce_scatter_tensor {op.name} {dtype} n={count}", flat_out,
                            reduced(size, count, dtype, op, salt=rank))


def case_all_to_all(rank: int, size: int, check: Checker) -> None:
    for dtype in DTYPES:
        for count in counts(size)[:4]:
            ins = [value(rank, count, dtype, salt=j) for j in range(size)]
            outs = [np.zeros(count, dtype) for _ in range(size)]
            c.all_to_all(outs, ins)
            for j in range(size):
                check.equal(f"all_to_all {dtype} n={count} [{j}]", outs[j], value(j, count, dtype, salt=rank))
    rows = 3
    single_in = np.concatenate([value(rank, rows * 2, "float32", salt=j) for j in range(size)]).reshape(-1, 2)
    single_out = np.zeros_like(single_in)
    c.all_to_all_single(single_out, single_in)
    want = np.concatenate([value(j, rows * 2, "float32", salt=rank) for j in range(size)]).reshape(-1, 2)
    check.equal("all_to_all_single even", single_out, want)
    send_rows = [(rank + j) % 3 for j in range(size)]  # rows this rank sends to j
    recv_rows = [(j + rank) % 3 for j in range(size)]  # rows j sends here
    uneven_in = np.concatenate([value(rank, n, "int64", salt=j) for j, n in enumerate(send_rows)])
    uneven_out = np.zeros(sum(recv_rows), np.int64)
    c.all_to_all_single(uneven_out, uneven_in, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    want = np.concatenate([value(j, n, "int64", salt=rank) for j, n in enumerate(recv_rows)])
    check.equal("all_to_all_single uneven", uneven_out, want)


def _work(work: Work | None) -> Work:
    """An async call's Work (None only for a non-member; these cases run on the whole world)."""
    assert work is not None
    return work


def case_barrier_and_async(rank: int, size: int, check: Checker) -> None:
    c.barrier()
    works, bufs = [], []
    for i in range(5):
        buf = value(rank, 100, "float64", salt=i)
        bufs.append(buf)
        works.append(_work(c.all_reduce(buf, async_op=True)))
    works.append(_work(c.barrier(async_op=True)))
    for work in works:
        work.wait()
        check.equal("work.is_completed", np.array(work.is_completed()), np.array(True))
    for i, buf in enumerate(bufs):
        check.equal(f"async all_reduce {i}", buf, reduced(size, 100, "float64", RedOpType.SUM, salt=i))


def case_p2p(rank: int, size: int, check: Checker) -> None:
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(9, np.float32)
    receive = _work(p.irecv(got, src=left, tag=3))  # posted before the matching send
    _work(p.isend(value(rank, 9, "float32"), dst=right, tag=3)).wait()
    receive.wait()
    check.equal("irecv before isend", got, value(left, 9, "float32"))
    ops = [p.P2POp(p.isend, value(rank, 4, "int16"), right), p.P2POp(p.irecv, got_b := np.zeros(4, np.int16), left)]
    for work in p.batch_isend_irecv(ops):
        work.wait()
    check.equal("batch_isend_irecv", got_b, value(left, 4, "int16"))
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            buf = np.zeros(1, np.int64)
            sender = p.recv(buf, tag=11)
            senders.add(sender)
            check.equal(f"recv any source from {sender}", buf, np.array([sender * 10]))
        check.equal("any-source senders", np.array(sorted(senders)), np.arange(1, size))
    else:
        p.send(np.array([rank * 10]), dst=0, tag=11)


def case_objects(rank: int, size: int, check: Checker) -> None:
    gathered = [None] * size
    o.all_gather_object(gathered, {"rank": rank, "data": list(range(rank))})
    if gathered != [{"rank": r, "data": list(range(r))} for r in range(size)]:
        check.failures.append(f"all_gather_object: {gathered}")
    objects = [f"from {rank}", rank] if rank == size - 1 else [None, None]
    o.broadcast_object_list(objects, src=size - 1)
    if objects != [f"from {size - 1}", size - 1]:
        check.failures.append(f"broadcast_object_list: {objects}")
    slot = [None]
    o.scatter_object_list(slot, [("to", r) for r in range(size)] if rank == 0 else None, src=0)
    if slot[0] != ("to", rank):
        check.failures.append(f"scatter_object_list: {slot}")
    out = [None] * size if rank == 0 else None
    o.gather_object(rank * "x", out, dst=0)
    if rank == 0 and out != [r * "x" for r in range(size)]:
        check.failures.append(f"gather_object: {out}")
    if size > 1 and rank in (0, 1):
        if rank == 0:
            o.send_object_list([{"k": 1}, [2, 3]], dst=1)
        else:
            received = [None, None]
            o.recv_object_list(received, src=0)
            if received != [{"k": 1}, [2, 3]]:
                check.failures.append(f"recv_object_list: {received}")


def case_subgroups(rank: int, size: int, check: Checker) -> None:
    evens = new_group([r for r in range(size) if r % 2 == 0])
    odds = new_group([r for r in range(size) if r % 2 == 1]) if size > 1 else None
    mine = evens if rank % 2 == 0 else odds
    members = [r for r in range(size) if r % 2 == rank % 2]
    buf = value(rank, 5, "int32")
    c.all_reduce(buf, group=mine)
    want = np.asarray(sum(value(r, 5, "int32") for r in members)).astype(np.int32)
    check.equal("subgroup all_reduce", buf, want)
    root = members[-1]
    buf = value(rank, 3, "float64")
    c.broadcast(buf, src=root, group=mine)
    check.equal("subgroup broadcast (global src)", buf, value(root, 3, "float64"))
    buf = value(rank, 3, "float64")
    c.broadcast(buf, group=mine, group_src=0)
    check.equal("subgroup broadcast (group_src)", buf, value(members[0], 3, "float64"))


def case_spanning_subgroup(rank: int, size: int, check: Checker) -> None:
    """A group of every rank but the last (``new_group`` sorts, as torch's does): across hosts
    its hosts have unequal rank counts (2+2+1 in a 3 x 2 job), so the hierarchical algorithms
    run inside a subgroup, with group ranks that differ from global ones and a non-zero root."""
    if size < 3:
        return
    n = size - 1
    group = new_group(list(range(n)))
    if rank >= n:
        return
    for count in (1, 3 * n + 1, 1000):
        buf = value(rank, count, "float64")
        c.all_reduce(buf, group=group)
        check.equal(f"spanning all_reduce n={count}", buf, reduced(n, count, "float64", RedOpType.SUM))
        buf = value(rank, count, "int32")
        c.broadcast(buf, src=n - 1, group=group)
        check.equal(f"spanning broadcast n={count}", buf, value(n - 1, count, "int32"))
        mine = value(rank, count, "int64")
        buf = mine.copy()
        c.reduce(buf, dst=1, op=make_op(RedOpType.MAX), group=group)
        check.equal(f"spanning reduce n={count}", buf, reduced(n, count, "int64", RedOpType.MAX) if rank == 1 else mine)
        flat = np.zeros(count * n, "float32")
        c.all_gather_into_tensor(flat, value(rank, count, "float32"), group=group)
        check.equal(f"spanning all_gather_into_tensor n={count}", flat,
                    np.concatenate([value(r, count, "float32") for r in range(n)]))
        out = np.zeros(count, "float32")
        c.reduce_scatter_tensor(out, np.concatenate([value(rank, count, "float32", salt=j) for j in range(n)]),
                                group=group)
        check.equal(f"spanning reduce_scatter_tensor n={count}", out, reduced(n, count, "float32", RedOpType.SUM,
                                                                              salt=rank))


CASES: dict[str, Callable[[int, int, Checker], None]] = {
    "broadcast": case_broadcast, "all_reduce": case_all_reduce, "reduce": case_reduce,
    "all_gather": case_all_gather, "gather_scatter": case_gather_scatter, "reduce_scatter": case_reduce_scatter,
    "all_to_all": case_all_to_all, "barrier_async": case_barrier_and_async, "p2p": case_p2p,
    "objects": case_objects, "subgroups": case_subgroups, "spanning_subgroup": case_spanning_subgroup,
}


def run_suite(rank: int, size: int, only: list[str] | None = None) -> list[str]:
    """Run the named cases (default: all) and return the failures, prefixed with the rank."""
    check = Checker()
    for name in only or list(CASES):
        CASES[name](rank, size, check)
    return [f"rank {rank}: {failure}" for failure in check.failures]


def main(argv: list[str] | None = None) -> int:
    """Run the suite in a launched process (env:// or MPI) and print a summary per rank."""
    import argparse

    import pydist
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None)
    parser.add_argument("--cases", nargs="*", default=None, choices=sorted(CASES))
    args = parser.parse_args(argv)
    pydist.init_process_group(args.backend)
    rank, size = pydist.get_rank(), pydist.get_world_size()
    failures = run_suite(rank, size, args.cases)
    pydist.destroy_process_group()
    cases = len(args.cases or CASES)
    print(f"rank {rank}/{size}: {cases} case groups, {len(failures)} failures", flush=True)
    for failure in failures[:20]:
        print(failure, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
