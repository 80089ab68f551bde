"""A job for elastic-restart tests: pydist DDP on a small linear model, one epoch of a few
steps every ``--epoch-seconds``; rank 0 snapshots (atomically) after every epoch and every
rank resumes from the snapshot when restarted.

    pydist-run ... elastic_train.py --snapshot PATH [--epochs 8] [--epoch-seconds 0.3]

Prints ``resumed at epoch K`` (rank 0) and, at the end, ``DONE epochs=E restarts=R
checksum=C`` on every rank (C: the sum of the parameters, equal on every rank).
"""
import argparse
import os
import time

import torch

import pydist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshot", required=True)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--epoch-seconds", type=float, default=0.3)
    args = parser.parse_args()
    pydist.init_process_group()
    rank, size = pydist.get_rank(), pydist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    start = 0
    if os.path.exists(args.snapshot):
        state = torch.load(args.snapshot)
        model.load_state_dict(state["model"])
        start = state["epoch"]
        if rank == 0:
            print(f"resumed at epoch {start}", flush=True)
    ddp = pydist.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for epoch in range(start, args.epochs):
        generator = torch.Generator().manual_seed(epoch * 1000 + rank)
        for _ in range(4):
            x = torch.randn(8, 16, generator=generator)
            optimizer.zero_grad()
            ddp(x).pow(2).mean().backward()
            optimizer.step()
        time.sleep(args.epoch_seconds)
        if rank == 0:
            tmp = args.snapshot + ".tmp"
            torch.save({"model": model.state_dict(), "epoch": epoch + 1}, tmp)
            os.replace(tmp, args.snapshot)
        print(f"epoch {epoch} done", flush=True)
    checksum = sum(float(p.detach().sum()) for p in model.parameters())
    print(f"DONE epochs={args.epochs} restarts={os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"size={size} checksum={checksum:.6f}", flush=True)
    pydist.destroy_process_group()


if __name__ == "__main__":
    main()
