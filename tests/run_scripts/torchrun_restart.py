"""A torch.distributed worker for torchrun --max-restarts 1: attempt 0's last rank exits
(code 3) after a first all_reduce, leaving that attempt's keys in the agent's store; in
attempt 1 rank 0 starts ``LATE`` seconds late, so the other ranks read the store first
(an earlier attempt's keys, if they are not kept apart).

Usage: torchrun_restart.py BACKEND [LATE]   ("pydist" imports pydist.torch, which registers it)
Prints ``RESULT rank attempt [sum]`` after an all_reduce and a barrier in each attempt that
gets that far.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

backend = sys.argv[1]
late = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
if backend == "pydist":
    import pydist.torch  # noqa: F401

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if attempt == 1 and rank == 0:
    time.sleep(late)  # not synchronisation: it lets the other ranks reach the store first
dist.init_process_group(backend, timeout=timedelta(seconds=60))
tensor = torch.full((4,), float(rank + 1))
dist.all_reduce(tensor)
if attempt == 0 and rank == size - 1:
    sys.stdout.flush()
    os._exit(3)
dist.barrier()
os.write(1, f"RESULT {rank} {attempt} {tensor.tolist()}\n".encode())  # one write: ranks share a pipe
dist.destroy_process_group()
