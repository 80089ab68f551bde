"""torch's DistributedDataParallel with the default communication hooks
(torch.distributed.algorithms.ddp_comm_hooks.default_hooks): allreduce, fp16 compression
and the fp16 wrapper around allreduce (torch refuses bf16 off CUDA/XPU); 3 SGD steps on
2 ranks, small buckets.

    python comm_hooks.py gloo|pydist
"""
import torch
from _harness import loss_of, main, make_model, rank_batches, state
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

HOOKS = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "fp16_wrapper": default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook),
}


def train_with_hooks(rank: int, size: int, workdir: str) -> dict:
    result = {}
    for name, hook in HOOKS.items():
        ddp = DDP(make_model(), bucket_cap_mb=0.0005)
        ddp.register_comm_hook(None, hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for batch in rank_batches(rank, 3):
            optimizer.zero_grad()
            loss_of(ddp, batch).backward()
            optimizer.step()
        result[name] = state(ddp.module)
    return result


if __name__ == "__main__":
    main(train_with_hooks)
