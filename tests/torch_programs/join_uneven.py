"""torch's Join context manager with DistributedDataParallel and uneven inputs: rank 0 has
3 batches, rank 1 has 5; the joined rank shadows the others' all_reduces.

    python join_uneven.py gloo|pydist
"""
import torch
from _harness import loss_of, main, make_model, rank_batches, state
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def train_uneven(rank: int, size: int, workdir: str) -> dict:
    ddp = DDP(make_model(), bucket_cap_mb=0.0005)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    with Join([ddp]):
        for batch in rank_batches(rank, 3 + 2 * rank):
            optimizer.zero_grad()
            loss = loss_of(ddp, batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return {"losses": losses, "state": state(ddp.module)}


if __name__ == "__main__":
    main(train_uneven)
