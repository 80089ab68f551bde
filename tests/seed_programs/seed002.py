"""Seed 002 (分布式通信包 - torch.distributed): the three initialisations and all_reduce/reduce.

Sections 2.1 (TCP: ``init_method='tcp://…'``, rank and world_size=4 given), 2.2 (shared
file: ``init_method='file:///…'``) and 2.4 (environment variables MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK; ``init_process_group(backend)`` alone), each followed by
section 3 (sum the ranks' losses with all_reduce and the deprecated ``reduce_op.SUM``,
divide by world_size for the mean) and section 4 (``dist.reduce(tensor, dst, op,
group)`` with positional arguments). Each rank prints ``Rank: r, mean loss …, reduce …``.

``all_inits`` runs the three one after the other in the same 4 processes (destroying the
group in between), which saves three torch start-ups over three separate launches.
"""
import os
import sys

import torch

if not __package__:  # run as a script: seed_programs importable as a package (see _as_script)
    import _as_script  # noqa: F401

import pydist as dist  # noqa: E402
from seed_programs.launch import spawn  # noqa: E402

backend = "pydist"


def init_tcp(rank, size, port):
    # 使用其中一台机器的地址
    dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=4)
    report(rank)


def init_file(rank, size, path):
    # 应始终指定等级
    dist.init_process_group(backend, init_method=f'file://{path}', world_size=4, rank=rank)
    report(rank)


def init_env(rank, size, port):
    os.environ['MASTER_PORT'] = str(port)
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['WORLD_SIZE'] = str(size)
    os.environ['RANK'] = str(rank)
    dist.init_process_group(backend)
    report(rank)


def report(rank):
    loss = torch.tensor(float(rank + 1))  # this rank's loss, a 0-d tensor
    dist.all_reduce(loss, op=dist.reduce_op.SUM)
    loss = loss / dist.get_world_size()
    tensor = torch.tensor([rank + 1.])
    dist.reduce(tensor, 0, dist.ReduceOp.SUM, dist.group.WORLD)
    print(f'Rank: {rank}, mean loss {loss}, reduce {tensor if rank == 0 else "-"}')
    dist.destroy_process_group()


def all_inits(rank, size, tcp_port, path, env_port):
    print(f'Rank: {rank}, init tcp://')
    init_tcp(rank, size, tcp_port)
    print(f'Rank: {rank}, init file://')
    init_file(rank, size, path)
    print(f'Rank: {rank}, init env://')
    init_env(rank, size, env_port)
    print(f'Rank: {rank}, initialized at the end: {dist.is_initialized()}')


if __name__ == "__main__":
    import tempfile

    from pydist.testing import free_port
    with tempfile.TemporaryDirectory() as tmp:
        codes = spawn(4, None, target=all_inits,
                      args=(free_port(), os.path.join(tmp, 'sharedfile'), free_port()))
    print('finished', codes)
    sys.exit(0 if all(code == 0 for code in codes) else 1)
