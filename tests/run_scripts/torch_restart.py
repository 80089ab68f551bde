"""A torch.distributed worker that fails once: attempt 0's rank 1 raises after a first
all_reduce (so attempt 0 left its keys in the store), attempt 1 runs to the end.

Usage: torch_restart.py BACKEND   ("pydist" imports pydist.torch, which registers it)
Prints ``RESULT rank attempt [sum]`` after an all_reduce and a barrier in each attempt that
gets that far.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "pydist":
    import pydist.torch  # noqa: F401

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend, timeout=timedelta(seconds=20))
tensor = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(tensor)
if attempt == 0 and dist.get_rank() == 1:
    raise RuntimeError("rank 1 fails in attempt 0")
dist.barrier()
print(f"RESULT {dist.get_rank()} {attempt} {tensor.tolist()}", flush=True)
dist.destroy_process_group()
