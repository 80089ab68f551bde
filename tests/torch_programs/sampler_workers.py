"""torch's DistributedSampler (shuffle, set_epoch) feeding a DataLoader with 2 worker
processes (forked from a rank whose process group is up) into DDP training, 2 epochs.

    python sampler_workers.py gloo|pydist
"""
import torch
from _harness import main, make_model, state
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train_from_workers(rank: int, size: int, workdir: str) -> dict:
    generator = torch.Generator().manual_seed(3)
    dataset = TensorDataset(torch.arange(26), torch.randn(26, 8, generator=generator),
                            torch.randint(0, 3, (26,), generator=generator))
    sampler = DistributedSampler(dataset, shuffle=True, seed=5)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2)
    ddp = DDP(make_model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for indices, inputs, targets in loader:
            seen.append(indices.tolist())
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
            optimizer.step()
    return {"indices": seen, "state": state(ddp.module)}


if __name__ == "__main__":
    main(train_from_workers)
