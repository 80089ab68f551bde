"""A torch.distributed worker: init_process_group, all_reduce of (rank + 1), print it.

Usage: torch_allreduce.py BACKEND [HOST:PORT]
With HOST:PORT, rendezvous goes through a torch TCPStore client to that store (RANK and
WORLD_SIZE from the environment); without, through env:// as pydist-run / torchrun set it up.
BACKEND "pydist" imports pydist.torch (which registers it).
"""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "pydist":
    import pydist.torch  # noqa: F401

if len(sys.argv) > 2:
    import os

    host, port = sys.argv[2].rsplit(":", 1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
else:
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
tensor = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(tensor)
dist.barrier()
print(f"RESULT {dist.get_rank()} {dist.get_world_size()} {tensor.tolist()}", flush=True)
dist.destroy_process_group()
