"""A torch.distributed worker for ``torchrun --nnodes 1:2``: in a world smaller than WANT it
all_reduces until torchrun restarts it (a second agent joined), printing ``SMALL size`` once;
in a world of WANT ranks it prints ``RESULT rank restart [sum]`` and ends.

Usage: torchrun_grow.py WANT [BACKEND]   (default pydist; "pydist-api": pydist's own
init_process_group and all_reduce on numpy arrays). In the world of WANT, rank 0 starts its
init LATE seconds after the others, so they read the store first, where the smaller round's
keys are (same restart count).
"""
import os
import sys
import time
from datetime import timedelta

want = int(sys.argv[1])
backend = sys.argv[2] if len(sys.argv) > 2 else "pydist"
LATE = 1.5
if int(os.environ["WORLD_SIZE"]) >= want and os.environ["RANK"] == "0":
    time.sleep(LATE)
if backend == "pydist-api":
    import numpy as np

    import pydist as dist

    dist.init_process_group(timeout=timedelta(seconds=60))

    def full(value: float, count: int):
        return np.full(count, value)
else:
    import torch
    import torch.distributed as dist  # type: ignore[no-redef]

    if backend == "pydist":
        import pydist.torch  # noqa: F401  registers "pydist"
    dist.init_process_group(backend, timeout=timedelta(seconds=60))

    def full(value: float, count: int):
        return torch.full((count,), value)
rank, size = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
tensor = full(float(rank + 1), 4)
dist.all_reduce(tensor)
if size < want:
    print(f"SMALL {size}", flush=True)
    while True:  # until torchrun stops this world to start the larger one
        dist.all_reduce(full(1.0, 1))
        time.sleep(0.05)
dist.barrier()
os.write(1, f"RESULT {rank} {restart} {tensor.tolist()}\n".encode())  # one write: ranks share a pipe
dist.destroy_process_group()
