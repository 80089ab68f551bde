"""Seed 000 (pytorch dist_tuto notes): send/recv and all_reduce on new_group([0, 1]).

The seed's code with ``import pydist as dist`` and the CUDA calls
(set_device, .to(rank)) dropped. Run it: ``python tests/seed_programs/seed000.py``.
"""
import sys

if not __package__:  # run as a script: seed_programs importable as a package (see _as_script)
    import _as_script  # noqa: F401

import pydist as dist  # noqa: E402
from seed_programs.launch import init_process, main  # noqa: E402,F401
from seed_programs.tensors import torch  # noqa: E402


def run(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        print('init tentor', tensor)
        dist.recv(tensor=tensor, src=0)
    print(f'Rank: {rank}, has data {tensor}')


# """ All-Reduce example."""  (the seed names this function run too)
def run_all_reduce(rank, size):
    """ Simple collective communication. """
    group = dist.new_group([0, 1])
    if rank == 0:
        tensor = torch.tensor([1., 2., 3.])
    else:
        tensor = torch.tensor([4., 5., 6.])
    print(f'Rank: {rank}, random tensor: {tensor}')
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print(f'Rank: {rank}, has data: {tensor}')


if __name__ == "__main__":
    size = 2
    status = main(size, run) | main(size, run_all_reduce)
    sys.exit(status)
