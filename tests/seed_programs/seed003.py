"""Seed 003 (DistributedDataParallel 之进程组): setup/cleanup, new_group, the full signature.

``demo`` is the seed's ``setup`` (MASTER_ADDR 'localhost', a MASTER_PORT, then
``init_process_group(backend, rank=rank, world_size=world_size)``) and ``cleanup``
(``destroy_process_group``) around section 2.1's use of ``new_group`` on an arbitrary
subset of the ranks ([0, 2] of 3) as the ``group`` argument of a collective.
``demo_full_signature`` initialises with every parameter of section 1.2's signature
spelled out (``Backend`` attribute, ``timeout`` = 30 min, ``store=None``, ...).
Run it: ``python tests/seed_programs/seed003.py``.
"""
import os
import sys
from datetime import timedelta

import torch

if not __package__:  # run as a script: seed_programs importable as a package (see _as_script)
    import _as_script  # noqa: F401

import pydist as dist  # noqa: E402
from seed_programs.launch import spawn  # noqa: E402


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = os.environ.get('SEED_MASTER_PORT', '12355')

    # initialize the process group
    dist.init_process_group("pydist", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def use_subgroup(rank):
    group = dist.new_group([0, 2])
    tensor = torch.ones(1) * (rank + 1)
    if rank in (0, 2):
        dist.all_reduce(tensor, group=group)
    print(f'Rank: {rank}, world {dist.get_rank()}/{dist.get_world_size()}, '
          f'group {dist.get_rank(group)}/{dist.get_world_size(group)}, has data {tensor}')


def demo(rank, world_size):
    setup(rank, world_size)
    print(f'Rank: {rank}, initialized {dist.is_initialized()}, backend {dist.get_backend()}')
    use_subgroup(rank)
    cleanup()
    print(f'Rank: {rank}, initialized after cleanup {dist.is_initialized()}')


def demo_full_signature(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = os.environ.get('SEED_MASTER_PORT', '12355')
    dist.init_process_group(dist.Backend.PYDIST,
                            init_method=None,
                            timeout=timedelta(minutes=30),
                            world_size=world_size,
                            rank=rank,
                            store=None,
                            group_name='',
                            pg_options=None)
    print(f'Rank: {rank}, initialized {dist.is_initialized()}, backend {dist.get_backend()}')
    use_subgroup(rank)
    cleanup()
    print(f'Rank: {rank}, initialized after cleanup {dist.is_initialized()}')


if __name__ == "__main__":
    codes = spawn(3, None, target=demo)
    codes += spawn(3, None, target=demo_full_signature)
    print('finished', codes)
    sys.exit(0 if all(code == 0 for code in codes) else 1)
