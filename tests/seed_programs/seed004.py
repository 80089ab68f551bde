"""Seed 004 (DDP tutorial series notes): ``ddp_setup`` and the torchrun snippet.

``main(rank, world_size)`` is the tutorial's multigpu.py shape, launched with
``torch.multiprocessing.spawn``: the seed's ``ddp_setup`` (MASTER_ADDR 'localhost', a
MASTER_PORT, ``init_process_group(backend=..., rank=rank, world_size=world_size)``; CUDA
dropped), then data parallelism by hand as section 1.1 describes it: every rank starts
from rank 0's parameters (broadcast), computes gradients on its own shard of the batch,
all-reduces and averages them, and steps; the replicas stay identical. Each rank prints
``Rank: r, params [...]``.

Run as a script under the launcher (``pydist-run --nproc-per-node 2 seed004.py``), it
runs the seed's torchrun snippet: ``init_process_group`` only if not initialised yet,
WORLD_SIZE and LOCAL_RANK from the environment.
"""
import os

import torch

import pydist as dist
from pydist import destroy_process_group, init_process_group

STEPS = 3


def ddp_setup(rank, world_size):
    """
    Args:
        rank: Unique identifier of each process
        world_size: Total number of processes
    """
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("SEED_MASTER_PORT", "12355")
    init_process_group(backend="pydist", rank=rank, world_size=world_size)


def batch(step, world_size):
    """The whole batch of a step (every rank can compute it; each trains on its shard)."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(4 * world_size, 3, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.25
    return x, y


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def train(model, world_size, rank=None):
    """SGD on mean squared error; with ``rank``, on that rank's shard with averaged grads."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step, world_size)
        if rank is not None:
            x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if rank is not None:
            for param in model.parameters():
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
                param.grad /= world_size
        optimizer.step()
    return [round(v, 5) for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


def main(rank, world_size):
    ddp_setup(rank, world_size)
    model = make_model(seed=rank)  # different on every rank ...
    for param in model.parameters():
        dist.broadcast(param.data, src=0)  # ... until rank 0's parameters are broadcast
    print(f"Rank: {rank}, params {train(model, world_size, rank)}", flush=True)
    destroy_process_group()


def torchrun_snippet():
    if not dist.is_initialized():
        dist.init_process_group("pydist")
    # torchrun --nproc_per_node 的参数
    model_parallel_size = int(os.environ.get("WORLD_SIZE", 1))

    local_rank = int(os.environ.get("LOCAL_RANK", 0))

    tensor = torch.ones(1) * (local_rank + 1)
    dist.all_reduce(tensor)
    print(f"Rank: {dist.get_rank()}, local_rank {local_rank}, world_size {model_parallel_size}, "
          f"has data {tensor}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("PIDDIR"):  # the test records the workers' pids, to kill leftovers
        with open(os.path.join(os.environ["PIDDIR"], str(os.getpid())), "w") as f:
            f.write(str(os.getpid()))
    if "RANK" in os.environ:
        torchrun_snippet()
    else:
        import torch.multiprocessing as mp
        world_size = 2
        mp.spawn(main, args=(world_size,), nprocs=world_size)
        print("reference", train(make_model(seed=0), world_size))
