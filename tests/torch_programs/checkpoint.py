"""torch.distributed.checkpoint (DCP): a DDP model's and its optimizer's state saved by
dcp.save to a directory both ranks share, loaded by dcp.load into a model built from another
seed, then one more training step. A plain tensor that differs per rank ("rank_tensor") is
saved once (DCP treats same-named tensors as replicated), so both ranks load the same copy.

    python checkpoint.py gloo|pydist
"""
import os

import torch
import torch.distributed.checkpoint as dcp
from _harness import loss_of, main, make_model, rank_batches, state
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def step(ddp: DDP, optimizer, batch) -> None:
    optimizer.zero_grad()
    loss_of(ddp, batch).backward()
    optimizer.step()


def save_then_load(rank: int, size: int, workdir: str) -> dict:
    batches = rank_batches(rank, 3)
    ddp = DDP(make_model(seed=0))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for batch in batches[:2]:
        step(ddp, optimizer, batch)
    model_state, optim_state = get_state_dict(ddp, optimizer)
    dcp.save({"model": model_state, "optim": optim_state, "rank_tensor": torch.full((3,), float(rank))},
             checkpoint_id=workdir)

    restored = DDP(make_model(seed=7))
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=0.01)
    restored_optimizer.zero_grad()
    step(restored, restored_optimizer, batches[0])  # so Adam's state exists to be overwritten
    model_state, optim_state = get_state_dict(restored, restored_optimizer)
    loaded = {"model": model_state, "optim": optim_state, "rank_tensor": torch.zeros(3)}
    dcp.load(loaded, checkpoint_id=workdir)
    set_state_dict(restored, restored_optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"])
    loaded_state = state(restored.module)
    step(restored, restored_optimizer, batches[2])
    step(ddp, optimizer, batches[2])
    return {"files": sorted(os.listdir(workdir)), "loaded": loaded_state,
            "rank_tensor": loaded["rank_tensor"].tolist(),
            "after_step": state(restored.module), "uninterrupted": state(ddp.module)}


if __name__ == "__main__":
    main(save_then_load)
