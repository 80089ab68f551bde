"""Targeted checks of pydist's MPI backend, run by every rank under mpiexec (test_mpi_backend.py).

Each check returns a JSON-able value; every rank writes {check name: value or "error: ..."}
to $PYDIST_RESULTS/<rank>.json and the test compares them with what is expected.
Usage: mpi_checks.py [CHECK ...]   (default: every check)
"""
import json
import os
import sys
import time
import traceback
from datetime import timedelta

import numpy as np
import torch

import pydist as dist
from pydist.engines._mpi_world import load_mpi


def check_init_args(rank, size):
    """Conflicting rank / world_size raise ValueError naming both; matching ones and an
    init_method (unused, as torch's MPI backend) are accepted."""
    out = {}
    for kwargs in ({"rank": (rank + 1) % (size + 1)}, {"world_size": size + 1}):
        try:
            dist.init_process_group("mpi", **kwargs)
            out[next(iter(kwargs))] = "accepted"
        except ValueError as error:
            out[next(iter(kwargs))] = str(error)
    dist.init_process_group("mpi", init_method="tcp://unreachable.invalid:1", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    out["backend"] = str(dist.get_backend())
    out["rank_size"] = [dist.get_rank(), dist.get_world_size()]
    return out


def check_bad_args(rank, size):
    out = {}
    for name, call in (("huge tag", lambda: dist.irecv(np.zeros(1), src=(rank + 1) % size, tag=1 << 40)),
                       ("native group", lambda: dist.new_group([0], backend="pydist")),
                       ("bad root", lambda: dist.broadcast(np.zeros(1), src=size))):
        try:
            call()
            out[name] = "accepted"
        except (ValueError, TypeError) as error:
            out[name] = type(error).__name__
    return out


def check_tensors(rank, size):
    """torch tensors in place (bfloat16 through float32, a non-contiguous view), a numpy
    array in big-endian order."""
    bf16 = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(bf16)
    bf16_avg = torch.full((3,), float(rank), dtype=torch.bfloat16)
    dist.all_reduce(bf16_avg, op=dist.ReduceOp.AVG)
    strided = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    column = strided[:, 1]
    dist.all_reduce(column)
    big_endian = np.arange(4, dtype=">i4") + rank
    dist.all_reduce(big_endian)
    gathered = [torch.zeros(2, dtype=torch.bfloat16) for _ in range(size)]
    dist.all_gather(gathered, torch.full((2,), rank + 0.5, dtype=torch.bfloat16))
    return {"bf16_sum": bf16.float().tolist(), "bf16_avg": bf16_avg.float().tolist(),
            "strided": strided.tolist(), "big_endian": big_endian.tolist(),
            "bf16_gather": [g.float().tolist() for g in gathered]}


def check_async(rank, size):
    """async collectives and p2p: wait, is_completed (without waiting) and futures."""
    bufs = [np.full(1000, rank + i, np.float64) for i in range(4)]
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    future = dist.all_reduce(fut := np.ones(3, np.int32), async_op=True).get_future()
    for work in works:
        work.wait()
    out = {"sums": [float(b[0]) for b in bufs], "future": [int(x) for x in future.result(timeout=30)[0]],
           "fut_buf": fut.tolist()}
    if size > 1:
        left, right = (rank - 1) % size, (rank + 1) % size
        got = np.zeros(3, np.int64)
        receive = dist.irecv(got, src=left, tag=4)  # posted before the matching send
        time.sleep(0.05)
        send = dist.isend(np.full(3, rank, np.int64), dst=right, tag=4)
        deadline = time.monotonic() + 20
        while not (receive.is_completed() and send.is_completed()) and time.monotonic() < deadline:
            time.sleep(0.01)  # nobody waits: the poller completes them
        out["p2p_completed"] = receive.is_completed() and send.is_completed()
        out["p2p"] = got.tolist()
        got2 = np.zeros(1, np.int64)
        fut2 = dist.irecv(got2, src=left, tag=5).get_future()
        dist.send(np.array([rank * 10]), dst=right, tag=5)
        fut2.result(timeout=20)
        out["p2p_future"] = int(got2[0])
    dist.monitored_barrier(wait_all_ranks=True)  # its tokens have a negative tag
    out["monitored_barrier"] = "passed"
    return out


def check_any_source(rank, size):
    """recv(src=None) returns the sender's global rank, in the world and in a subgroup."""
    out = {}
    if rank == 0:
        pairs = []
        for _ in range(size - 1):
            buf = np.zeros(1, np.int64)
            pairs.append([dist.recv(buf, tag=9), int(buf[0])])  # [sender, what it sent]
        out["world"] = sorted(pairs)
    else:
        dist.send(np.array([rank]), dst=0, tag=9)
    tail = dist.new_group(list(range(1, size))) if size > 2 else None
    if tail is not None and rank >= 1:
        if rank == 1:
            senders = [dist.recv(np.zeros(1), group=tail, tag=2) for _ in range(size - 2)]
            out["subgroup"] = sorted(senders)
        else:
            dist.send(np.zeros(1), group_dst=0, group=tail, tag=2)
    dist.barrier()
    return out


def check_subgroups(rank, size):
    """Overlapping groups, unsorted ranks, non-members, destroying one and going on."""
    out = {}
    pair = dist.new_group([0, 1]) if size > 1 else None
    mid = dist.new_group([1, 2]) if size > 2 else None
    backwards = dist.new_group(list(reversed(range(size))), sort_ranks=False)
    out["pair_member"] = pair is not None and pair is not dist.GroupMember.NON_GROUP_MEMBER
    if out["pair_member"]:
        t = np.array([rank + 1.0])
        dist.all_reduce(t, group=pair)
        out["pair"] = t.tolist()
    if mid is not None and mid is not dist.GroupMember.NON_GROUP_MEMBER:
        t = np.array([rank * 2])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=mid)
        out["mid"] = t.tolist()
        dist.destroy_process_group(mid)
    t = np.array([float(rank)])
    dist.broadcast(t, group=backwards, group_src=0)
    out["backwards_rank"] = dist.get_rank(backwards)
    out["backwards_bcast"] = t.tolist()
    objects = [None] * size
    dist.all_gather_object(objects, {"r": rank}, group=backwards)
    out["objects"] = [o["r"] for o in objects]
    dist.barrier()
    return out


def check_errors(rank, size):
    """A receive buffer too small (MPI_ERR_TRUNCATE) becomes DistBackendError naming the rank."""
    out = {}
    if size < 2:
        return out
    pair = dist.new_group([0, 1])
    if rank == 0:
        dist.send(np.arange(8, dtype=np.float32), dst=1, tag=3)
        dist.broadcast(np.arange(16, dtype=np.uint8), src=0, group=pair)
    elif rank == 1:
        for name, call in (("p2p", lambda: dist.recv(np.zeros(4, np.float32), src=0, tag=3)),
                           ("collective", lambda: dist.broadcast(np.zeros(8, np.uint8), src=0, group=pair))):
            try:
                call()
                out[name] = "no error"
            except dist.DistBackendError as error:
                out[name] = str(error)
    dist.barrier()
    return out


def check_timeouts(rank, size):
    """A peer that never comes: DistBackendError naming the operation within the timeout;
    the group is broken afterwards; p2p too."""
    out = {}
    if size < 2:
        return out
    pair = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(np.ones(4), group=pair)
            out["collective"] = "no error"
        except dist.DistBackendError as error:
            out["collective"] = str(error)
        out["collective_seconds"] = time.monotonic() - start
        try:
            dist.all_reduce(np.ones(4), group=pair)
        except dist.DistBackendError as error:
            out["after"] = str(error)
        start = time.monotonic()
        try:
            dist.recv(np.zeros(2), src=1, group=pair, tag=77)
            out["p2p"] = "no error"
        except dist.DistBackendError as error:
            out["p2p"] = str(error)
        out["p2p_seconds"] = time.monotonic() - start
    elif rank == 1:
        time.sleep(2.5)  # past rank 0's timeouts; then join its abandoned all_reduce
        late = np.ones(4)
        dist.all_reduce(late, group=pair, async_op=True).wait(timeout=30)
        out["late"] = late.tolist()
    dist.barrier()
    return out


CHECKS = [check_bad_args, check_tensors, check_async, check_any_source, check_subgroups, check_errors,
          check_timeouts]


def main(names):
    mpi = load_mpi()
    rank, size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    results = {"init_args": check_init_args(rank, size)}
    for check in CHECKS:
        name = check.__name__[len("check_"):]
        if names and name not in names:
            continue
        try:
            results[name] = check(rank, size)
        except Exception as error:  # noqa: BLE001 - reported to the test
            results[name] = f"error: {type(error).__name__}: {error}\n{traceback.format_exc()}"
    dist.destroy_process_group()
    dist.init_process_group("mpi")  # again, in the same process
    again = np.array([rank])
    dist.all_reduce(again)
    results["reinit"] = again.tolist()
    dist.destroy_process_group()
    with open(os.path.join(os.environ["PYDIST_RESULTS"], f"{rank}.json"), "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main(sys.argv[1:])
