"""torch's ZeroRedundancyOptimizer (SGD with momentum and weight decay, sharded over 2
ranks) under DistributedDataParallel, against DDP with a local SGD; the optimizer state
consolidated on rank 0; and ``overlap_with_ddp=True`` (the step run from DDP's comm hook,
hook_with_zero_step after the warm-up iterations torch's own test uses), which torch
refuses on gloo: there the result holds torch's error instead.

    python zero.py gloo|pydist
"""
import torch
import torch.distributed as dist
from _harness import loss_of, main, make_model, rank_batches, state
from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

SGD = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.001}
STEPS = 4
WARMUP = 2  # overlap needs DDP's buckets rebuilt first (torch: 2 iterations without static_graph)


def step_through(ddp: DDP, optimizer, batches) -> None:
    for batch in batches:
        optimizer.zero_grad()
        loss_of(ddp, batch).backward()
        optimizer.step()


def sharded(rank: int) -> dict:
    ddp = DDP(make_model(hidden=64), bucket_cap_mb=0.001)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, **SGD)
    step_through(ddp, zero, rank_batches(rank, STEPS))
    zero.consolidate_state_dict(to=0)
    momentum = ([entry["momentum_buffer"].tolist() for _, entry in sorted(zero.state_dict()["state"].items())]
                if rank == 0 else None)
    return {"state": state(ddp.module), "momentum": momentum}


def overlapped(rank: int) -> dict | str:
    ddp = DDP(make_model(hidden=64), bucket_cap_mb=0.001)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, overlap_with_ddp=True, **SGD)
    try:
        ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    except RuntimeError as refused:
        return f"refused: {refused}"
    batches = rank_batches(rank, STEPS)
    for batch in batches[:WARMUP]:  # no update yet: DDP rebuilds its buckets, ZeRO learns them
        loss_of(ddp, batch).backward()
    for batch in batches:
        zero.zero_grad()
        loss_of(ddp, batch).backward()  # the hook steps the optimizer once the last bucket is reduced
    dist.barrier()
    return state(ddp.module)


def local(rank: int) -> dict:
    ddp = DDP(make_model(hidden=64), bucket_cap_mb=0.001)
    step_through(ddp, torch.optim.SGD(ddp.parameters(), **SGD), rank_batches(rank, STEPS))
    return state(ddp.module)


def train_zero(rank: int, size: int, workdir: str) -> dict:
    return {"zero": sharded(rank), "overlap": overlapped(rank), "local": local(rank)}


if __name__ == "__main__":
    main(train_zero)
