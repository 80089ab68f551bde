"""A torch.distributed worker for ``torchrun --nnodes 1:2``: in a world smaller than WANT it
all_reduces until torchrun restarts it (a second agent joined), printing ``SMALL size`` once;
in a world of WANT ranks it prints ``RESULT rank restart [sum]`` and ends.

Usage: torchrun_grow.py WANT [BACKEND]   (default pydist)
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

want = int(sys.argv[1])
backend = sys.argv[2] if len(sys.argv) > 2 else "pydist"
if backend == "pydist":
    import pydist.torch  # noqa: F401  registers "pydist"
dist.init_process_group(backend, timeout=timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
tensor = torch.full((4,), float(rank + 1))
dist.all_reduce(tensor)
if size < want:
    print(f"SMALL {size}", flush=True)
    while True:  # until torchrun stops this world to start the larger one
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)
dist.barrier()
os.write(1, f"RESULT {rank} {restart} {tensor.tolist()}\n".encode())  # one write: ranks share a pipe
dist.destroy_process_group()
