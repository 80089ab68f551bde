"""torch.distributed.nn.functional with autograd: gradients flow back through all_reduce,
all_gather, broadcast and reduce_scatter (each rank's gradient depends on the others').

    python nn_functional.py gloo|pydist
"""
import torch
from _harness import main
from torch.distributed.nn import functional as dfn


def differentiate(rank: int, size: int, workdir: str) -> dict:
    x = (torch.arange(4.0) + 1) * (rank + 1)
    x.requires_grad_(True)
    weights = torch.arange(4.0) - rank
    summed = dfn.all_reduce(x * x)
    gathered = dfn.all_gather(x.sin())
    broadcast = dfn.broadcast(x * 3, src=1)
    scattered = dfn.reduce_scatter(torch.empty(2), list((x * x.detach()).split(2)))
    loss = ((summed * weights).sum() + sum((g * (i + 1)).sum() for i, g in enumerate(gathered))
            + (broadcast * weights).sum() + scattered.pow(2).sum())
    loss.backward()
    return {"summed": summed.tolist(), "gathered": [g.tolist() for g in gathered],
            "broadcast": broadcast.tolist(), "scattered": scattered.tolist(), "loss": loss.item(),
            "grad": x.grad.tolist()}


if __name__ == "__main__":
    main(differentiate)
