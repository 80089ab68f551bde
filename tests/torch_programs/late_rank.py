"""A rank that reaches the first collective late: rank 0 (which creates the same-host shared
memory) sleeps LATE_SECONDS before its first all_reduce, as a loaded machine may make it.

    python late_rank.py gloo|pydist
"""
import time

import torch
import torch.distributed as dist
from _harness import main

LATE_SECONDS = 0.5  # longer than pydist's 100 ms poll of the store while waiting for rank 0's segment


def late_all_reduce(rank: int, size: int, workdir: str) -> list:
    if rank == 0:
        time.sleep(LATE_SECONDS)
    tensor = torch.arange(4.0) + rank
    dist.all_reduce(tensor)
    return tensor.tolist()


if __name__ == "__main__":
    main(late_all_reduce)
