"""pytorch/examples' ddp-tutorial-series, multigpu_torchrun.py style, under a launcher
(torchrun or pydist-run): the Trainer of tests/ddp_programs/ddp_torchrun_style.py (torchrun's
environment, DDP, DistributedSampler, snapshot saved by rank 0 and resumed on restart) on
the backend argv[1] names; each rank prints RESULT with its epochs' losses and weights.

    torchrun|pydist-run --nproc-per-node 2 ddp_tutorial.py gloo|pydist TOTAL_EPOCHS SNAPSHOT
"""
import os
import sys

import torch
from _harness import collect_before_exit, emit, init_from_env, state
from ddp_programs.ddp_torchrun_style import RandomRegression, Trainer  # tests/ on PYTHONPATH (tests/child_env.py)
from torch.distributed import destroy_process_group
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class RecordingTrainer(Trainer):
    """The tutorial's Trainer, keeping each epoch's mean loss."""

    def __init__(self, *args):
        self.losses: list[float] = []
        super().__init__(*args)

    def _run_epoch(self, epoch: int) -> float:
        loss = super()._run_epoch(epoch)
        self.losses.append(loss)
        return loss


def main(backend: str, total_epochs: int, snapshot_path: str) -> None:
    init_from_env(backend)
    dataset = RandomRegression(64)
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    loader = DataLoader(dataset, batch_size=8, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = RecordingTrainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.05), 1, snapshot_path)
    resumed_at = trainer.epochs_run
    trainer.train(total_epochs)
    emit({"backend": backend, "rank": int(os.environ["RANK"]), "resumed_at": resumed_at,
          "losses": trainer.losses, "state": state(trainer.model.module)})
    destroy_process_group()
    del trainer, model
    collect_before_exit()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
