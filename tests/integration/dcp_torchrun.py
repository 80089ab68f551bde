"""torch.distributed.checkpoint under torchrun on BACKEND: a DDP model and its Adam state,
trained two steps, saved with ``dcp.save`` to OUTDIR/checkpoint, loaded with ``dcp.load`` into
a model built from another seed, then one more step on each rank. The test compares the
checkpoint's files byte for byte between backends, and the reported parameters.

    torchrun --nproc-per-node 2 dcp_torchrun.py gloo|pydist OUTDIR
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _worker import TIMEOUT, args, parameter_bytes, rank_batches, report
from _worker import make_model as seeded_model
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def step(model: DDP, optimizer: torch.optim.Optimizer, batch) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    backend, outdir = args()
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    dist.init_process_group(backend, timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    batches = rank_batches(rank, size)
    checkpoint = os.path.join(outdir, "checkpoint")

    model = DDP(seeded_model(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for batch in batches[:2]:
        step(model, optimizer, batch)
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)

    restored = DDP(seeded_model(7))
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=0.01)
    step(restored, restored_optimizer, batches[0])  # so Adam's state exists to be overwritten
    model_state, optim_state = get_state_dict(restored, restored_optimizer)
    loaded = {"model": model_state, "optim": optim_state}
    dcp.load(loaded, checkpoint_id=checkpoint)
    set_state_dict(restored, restored_optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    assert parameter_bytes(restored.module) == parameter_bytes(model.module), "loaded parameters differ from saved"

    step(model, optimizer, batches[2])
    loss = step(restored, restored_optimizer, batches[2])
    assert parameter_bytes(restored.module) == parameter_bytes(model.module), "restored run diverged"
    report("dcp", outdir, rank, restored.module, loss, files=sorted(os.listdir(checkpoint)))
    del model, restored
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
