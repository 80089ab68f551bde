"""Seed 001 (PyTorch Distributed Communication Primitives): P2P ping-pong and the collectives.

The seed's functions with ``import pydist as dist``; each also prints what its rank ends
with (``Rank: 1, has data ...``), which the seed leaves implicit. The ping-pong runs on 2
ranks, the collectives on 4 (the seed's scatter/gather lists have 4 entries).
Run it: ``python tests/seed_programs/seed001.py``.
"""
import sys

if not __package__:  # run as a script: seed_programs importable as a package (see _as_script)
    import _as_script  # noqa: F401

import pydist as dist  # noqa: E402
from seed_programs.launch import init_process, main  # noqa: E402,F401
from seed_programs.tensors import torch  # noqa: E402


def run(rank_id, size):
    tensor = torch.zeros(1)
    if rank_id == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
        dist.recv(tensor=tensor, src=1)
    else:
        dist.recv(tensor=tensor, src=0)
        tensor += 1
        dist.send(tensor=tensor, dst=0)
    print(f'Rank: {rank_id}, has data {tensor}')


# Broadcast
def run_broadcast(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    dist.broadcast(tensor, src = 0)
    print(f'Rank: {rank_id}, has data {tensor}')


def run_scatter(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    if rank_id == 0:
        scatter_list = [torch.tensor([0,0]), torch.tensor([1,1]), torch.tensor([2,2]), torch.tensor([3,3])]
        dist.scatter(tensor, src = 0, scatter_list=scatter_list)
    else:
        dist.scatter(tensor, src = 0)
    print(f'Rank: {rank_id}, has data {tensor}')


def run_gather(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    if rank_id == 0:
        gather_list = [torch.zeros(2, dtype=torch.int64) for _ in range(4)]
        dist.gather(tensor, dst = 0, gather_list=gather_list)
        print(f'Rank: {rank_id}, gather_list {gather_list}')
    else:
        dist.gather(tensor, dst = 0)
    print(f'Rank: {rank_id}, has data {tensor}')


def run_reduce(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    dist.reduce(tensor, dst=3, op=dist.ReduceOp.SUM)
    print(f'Rank: {rank_id}, has data {tensor}')


def run_all_gather(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    gather_list = [torch.zeros(2, dtype=torch.int64) for _ in range(4)]
    dist.all_gather(gather_list, tensor)
    print(f'Rank: {rank_id}, gather_list {gather_list}')


def run_all_reduce(rank_id, size):
    tensor = torch.arange(2, dtype=torch.int64) + 1 + 2 * rank_id
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print(f'Rank: {rank_id}, has data {tensor}')


COLLECTIVES = [run_broadcast, run_scatter, run_gather, run_reduce, run_all_gather, run_all_reduce]

if __name__ == "__main__":
    status = main(2, run)
    for fn in COLLECTIVES:
        status |= main(4, fn)
    sys.exit(status)
