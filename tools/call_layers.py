"""Small same-host collectives per layer of the call path (rank 0's us per call, best of 3 x N).

Run: pydist-run --nproc-per-node N tools/call_layers.py [iterations]
Each layer is called directly in a loop, 4 B float32: the public function (dist.all_reduce,
dist.broadcast, dist.barrier); ProcessGroup.run with the same OpSpec and engine method; the
engine's method (engine.all_reduce(ctx, ...): its plan looked up and run); the plan's bound
path (plan.bound(ctx, ...)); the shared-memory algorithm's general path on the engine's
Comm; the arena's sync alone. The rows say what each layer adds to the one below it.
"""
import numpy as np
from _layer_timing import N, best

import pydist as dist
from pydist.core.deadline import Deadline, now
from pydist.core.ops import ReduceOp
from pydist.core.opspec import describe
from pydist.engines.base import OpContext
from pydist.engines.choice import ALGORITHMS


def main():
    dist.init_process_group("pydist")
    group = dist.group.WORLD
    engine = group.engine
    buf = np.zeros(1, np.float32)
    op = ReduceOp(ReduceOp.SUM)
    specs = {"all_reduce": describe("all_reduce", "all_reduce", buf, op=dist.ReduceOp.SUM),
             "broadcast": describe("broadcast", "broadcast", buf, root=0),
             "barrier": describe("barrier", "barrier")}
    calls = {"all_reduce": (engine.all_reduce, (buf, op)), "broadcast": (engine.broadcast, (buf, 0)),
             "barrier": (engine.barrier, ())}
    bound_args = {"all_reduce": (buf, op), "broadcast": (buf,), "barrier": ()}
    public = {"all_reduce": lambda: dist.all_reduce(buf), "broadcast": lambda: dist.broadcast(buf, 0),
              "barrier": dist.barrier}
    for name in public:
        best(public[name])  # warm up; the engine builds its shared-memory Comm at the first call
    seq = [10 ** 6]

    def context(name):
        seq[0] += 1
        return OpContext(name, seq[0], Deadline(now() + 60), "timed out", specs[name])

    def layers(name):
        spec, (method, args) = specs[name], calls[name]
        row = {"dist.*": best(public[name]), "group.run": best(lambda: group.run(spec, method, args, [], False)),
               "engine": best(lambda: method(context(name), *args))}
        if group.size() > 1:
            bound = engine._plans[spec].bound
            row["plan.bound"] = best(lambda: bound(context(name), *bound_args[name]))
            comm = engine._shm_comm
            algorithm = ALGORITHMS[name]["shm"]
            args = {"all_reduce": (buf, op, engine.segment_bytes), "broadcast": (buf, 0, engine.segment_bytes),
                    "barrier": ()}[name]
            row["shm algorithm"] = best(lambda: algorithm(comm, *args))
            row["arena.sync"] = best(lambda: comm.arena.sync(comm, spec.call))
        return row

    rows = [(name, layers(name)) for name in public]
    if dist.get_rank() == 0:
        print(f"# {group.size()} ranks, 4 B float32, rank 0's us per call, best of 3 x {N}")
        for name, row in rows:
            print(f"{name:11s} " + "  ".join(f"{layer} {us:5.1f}" for layer, us in row.items()))
    dist.destroy_process_group()


main()
