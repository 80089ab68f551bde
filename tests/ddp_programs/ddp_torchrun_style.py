"""A torch tutorial-style DDP job, as users write them for torchrun (written for pydist's
tests, in the style of the PyTorch DDP tutorial series): torchrun's environment,
torch's DistributedDataParallel and DistributedSampler, a Trainer class, a snapshot saved
by rank 0 and resumed on restart. The only changes from a GPU script: the backend name
(was "nccl") and no .to(device) / device_ids.

    pydist-run --nproc-per-node 2 ddp_torchrun_style.py TOTAL_EPOCHS SAVE_EVERY [--snapshot PATH]
"""
import argparse
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

BACKEND = "pydist"  # the one change: was "nccl"


class RandomRegression(Dataset):
    def __init__(self, size: int):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 20, generator=generator)
        self.y = self.x @ torch.linspace(-1, 1, 20) + 0.1 * torch.randn(size, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index:index + 1]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model, self.train_data, self.optimizer = model, train_data, optimizer
        self.save_every, self.snapshot_path, self.epochs_run = save_every, snapshot_path, 0
        if os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            print(f"Resuming training from snapshot at Epoch {self.epochs_run}")
        self.model = DDP(self.model)

    def _run_epoch(self, epoch: int) -> float:
        self.train_data.sampler.set_epoch(epoch)
        total = 0.0
        for source, targets in self.train_data:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return total / len(self.train_data)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            print(f"[rank{self.global_rank}] epoch {epoch} | steps {len(self.train_data)} | loss {loss:.4f}")
            if self.global_rank == 0 and (epoch + 1) % self.save_every == 0:
                torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1},
                           self.snapshot_path)
                print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")


def main(total_epochs: int, save_every: int, batch_size: int, snapshot_path: str) -> None:
    init_process_group(backend=BACKEND)
    dataset = RandomRegression(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    Trainer(model, loader, optimizer, save_every, snapshot_path).train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=16, type=int)
    parser.add_argument("--snapshot", default="snapshot.pt")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size, args.snapshot)
