"""A job launched by torch.multiprocessing.spawn (fresh interpreters, not fork): each of 2
ranks joins over env:// and trains DDP for 3 steps; rank results come back through a queue.

    python spawn_launch.py gloo|pydist
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _harness import (
    WORLD_SIZE,
    collect_before_exit,
    emit,
    free_port,
    init_from_env,
    loss_of,
    make_model,
    rank_batches,
    state,
)
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank: int, backend: str, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE))
    init_from_env(backend)
    ddp = DDP(make_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for batch in rank_batches(rank, 3):
        optimizer.zero_grad()
        loss_of(ddp, batch).backward()
        optimizer.step()
    dist.destroy_process_group()
    results.put((rank, state(ddp.module)))
    del ddp, optimizer
    collect_before_exit()


if __name__ == "__main__":
    backend = sys.argv[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(backend, free_port(), queue), nprocs=WORLD_SIZE, join=True)
    collected = dict(queue.get() for _ in range(WORLD_SIZE))
    emit({"backend": backend, "ranks": [collected[rank] for rank in range(WORLD_SIZE)]})
