"""A torch call through the "pydist" plugin, per layer (rank 0's us per call).

Run: pydist-run --nproc-per-node 2 tools/torch_layers.py [iterations] [rounds]
4 B float32, each layer called directly in a loop: torch.distributed's function on a
ProcessGroup in Python whose methods do nothing and return None, as the plugin's blocking
calls do (torch's own floor: its Python, the options); torch.distributed's function through
the plugin; the plugin's method (blocking options); pydist's function on the tensor;
pydist's function on a numpy array. Each is the best of ``rounds`` (100) rounds of
``iterations`` (300) calls, each round after a barrier: short rounds, many of them, so that
some run undisturbed on a busy machine. Then, in this process alone: the tensor's buffer
(``as_buffer``) against the array's, and a finished torch Work.
"""
import sys
import time
import timeit

import numpy as np
import torch
import torch.distributed as tdist

import pydist
import pydist.torch  # noqa: F401 - registers the backend
from pydist.core.buffers import as_buffer

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 100


def best(call) -> float:
    """Microseconds per call of ``call``, the best of ROUNDS x N, each round after a barrier."""
    times = []
    for _ in range(ROUNDS):
        tdist.barrier()
        start = time.perf_counter()
        for _ in range(N):
            call()
        times.append((time.perf_counter() - start) / N * 1e6)
    return min(times)


class _Done(tdist.Work):
    def wait(self, timeout=None) -> bool:
        return True


class _Null(tdist.ProcessGroup):
    """torch's floor: every call is done when it returns (None: torch waits on no Work)."""

    def allreduce(self, tensors, opts=None):
        return None

    def broadcast(self, tensors, opts=None):
        return None

    def barrier(self, opts=None):
        return None


def _blocking(options):
    opts = options()
    opts.asyncOp = False
    return opts


def main():
    tdist.init_process_group("pydist")
    plugin = tdist.distributed_c10d._get_default_group()
    group = plugin.pydist_group
    null = _Null(tdist.get_rank(), tdist.get_world_size())
    tensor, array = torch.zeros(1), np.zeros(1, np.float32)
    reduce_opts, broadcast_opts = _blocking(tdist.AllreduceOptions), _blocking(tdist.BroadcastOptions)
    barrier_opts = _blocking(tdist.distributed_c10d.BarrierOptions)
    calls = {
        "all_reduce": {
            "torch floor": lambda: tdist.all_reduce(tensor, group=null),
            "tdist.*": lambda: tdist.all_reduce(tensor),
            "plugin": lambda: plugin.allreduce([tensor], reduce_opts),
            "pydist(tensor)": lambda: pydist.all_reduce(tensor, group=group),
            "pydist(numpy)": lambda: pydist.all_reduce(array, group=group)},
        "broadcast": {
            "torch floor": lambda: tdist.broadcast(tensor, group=null, group_src=0),
            "tdist.*": lambda: tdist.broadcast(tensor, 0),
            "plugin": lambda: plugin.broadcast([tensor], broadcast_opts),
            "pydist(tensor)": lambda: pydist.broadcast(tensor, group_src=0, group=group),
            "pydist(numpy)": lambda: pydist.broadcast(array, group_src=0, group=group)},
        "barrier": {
            "torch floor": lambda: tdist.barrier(group=null),
            "tdist.*": lambda: tdist.barrier(),
            "plugin": lambda: plugin.barrier(barrier_opts),
            "pydist": lambda: pydist.barrier(group=group)},
    }
    rows = []
    for name, layers in calls.items():
        for call in layers.values():
            best(call)  # warm up
        rows.append((name, {layer: best(call) for layer, call in layers.items()}))
    local = {
        "as_buffer(tensor)": lambda: as_buffer(tensor, "tensor"),
        "as_buffer(numpy)": lambda: as_buffer(array, "tensor"),
        "torch Work()": _Done,
    }
    alone = {name: min(timeit.repeat(call, number=N, repeat=ROUNDS)) / N * 1e6 for name, call in local.items()}
    if tdist.get_rank() == 0:
        print(f"# {tdist.get_world_size()} ranks, 4 B float32, rank 0's us per call, best of {ROUNDS} x {N}")
        for name, row in rows:
            print(f"{name:11s} " + "  ".join(f"{layer} {us:5.2f}" for layer, us in row.items()))
        print("alone       " + "  ".join(f"{layer} {us:5.2f}" for layer, us in alone.items()))
    tdist.destroy_process_group()


main()
