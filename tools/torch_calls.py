"""Small calls through torch's plugin against pydist's own API, in the same processes.

Run: pydist-run --nproc-per-node 2 tools/torch_calls.py [calls] [rounds]
4 B float32, back to back: ``calls`` (20,000) of each after a warm-up, in ``rounds`` (3)
rounds that alternate the rows; a round's time is the slowest rank's (all_reduce MAX), the
row's the best round's. pydist's rows run on the torch group's own pydist group (the same
arena), on a numpy array; the torch rows through torch.distributed on a tensor, blocking
and async (``async_op=True`` then ``wait()`` at once); send+recv is one round trip between
ranks 0 and 1. ``--threads``: each rank also prints, for each row of the last round, the
context switches of each of its threads that switched (voluntary, involuntary: from
/proc/self/task/*/status). A pydist thread that wakes during torch calls is woken again at
each of torch's GIL releases: thousands of switches for one wake (docs/algorithms.md).
"""
import os
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as tdist

import pydist
import pydist.torch  # noqa: F401 - registers the backend

warnings.filterwarnings("ignore", category=FutureWarning)
THREADS = "--threads" in sys.argv
ARGS = [arg for arg in sys.argv[1:] if arg != "--threads"]
CALLS = int(ARGS[0]) if ARGS else 20_000
ROUNDS = int(ARGS[1]) if len(ARGS) > 1 else 3


def switches() -> dict[str, tuple[int, int]]:
    """Each thread of this process (its name, else its id): (voluntary, involuntary) context switches."""
    names = {str(thread.native_id): thread.name for thread in threading.enumerate()}
    counts = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        counts[names.get(tid, tid)] = (int(fields["voluntary_ctxt_switches"]),
                                       int(fields["nonvoluntary_ctxt_switches"]))
    return counts


def _ping(send, recv, buf, **group) -> None:
    """One message each way between ranks 0 and 1 (a round trip)."""
    me = tdist.get_rank()
    if me == 0:
        send(buf, 1, **group)
        recv(buf, 1, **group)
    elif me == 1:
        recv(buf, 0, **group)
        send(buf, 0, **group)


def main() -> None:
    tdist.init_process_group("pydist")
    group = tdist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).pydist_group
    array, tensor = np.zeros(1, np.float32), torch.zeros(1)
    inputs, output = torch.zeros(2), torch.zeros(2)
    rows = {
        "pydist.all_reduce(numpy)": lambda: pydist.all_reduce(array, group=group),
        "torch all_reduce": lambda: tdist.all_reduce(tensor),
        "torch all_reduce async+wait": lambda: tdist.all_reduce(tensor, async_op=True).wait(),
        "pydist.broadcast(numpy)": lambda: pydist.broadcast(array, group_src=0, group=group),
        "torch broadcast": lambda: tdist.broadcast(tensor, 0),
        "pydist.barrier": lambda: pydist.barrier(group=group),
        "torch barrier": lambda: tdist.barrier(),
        "torch all_gather_into_tensor": lambda: tdist.all_gather_into_tensor(output, tensor),
        "torch reduce_scatter_tensor": lambda: tdist.reduce_scatter_tensor(tensor, inputs),
        "pydist send+recv (numpy)": lambda: _ping(pydist.send, pydist.recv, array, group=group),
        "torch send+recv": lambda: _ping(tdist.send, tdist.recv, tensor),
    }
    best: dict[str, float] = {}
    for call in rows.values():  # warm-up
        for _ in range(min(CALLS, 2000)):
            call()
    for round_ in range(ROUNDS):
        for name, call in rows.items():
            counted = THREADS and round_ == ROUNDS - 1
            tdist.barrier()
            before = switches() if counted else {}
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            elapsed = time.perf_counter() - start  # before /proc is read: not part of the calls' time
            if counted:
                after = switches()
                moved = {thread: (v - before[thread][0], i - before[thread][1])
                         for thread, (v, i) in after.items() if thread in before and (v, i) != before[thread]}
                print(f"rank {tdist.get_rank()} {name}: {moved}", flush=True)
            slowest = torch.tensor([elapsed / CALLS * 1e6], dtype=torch.float64)
            tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
            best[name] = min(best.get(name, float("inf")), slowest.item())
    if tdist.get_rank() == 0:
        print(f"# {tdist.get_world_size()} ranks, 4 B float32, {CALLS} calls, slowest rank, best of {ROUNDS} rounds")
        for name, us in best.items():
            print(f"{name:32s} {us:7.2f} us")
    tdist.destroy_process_group()


main()
